// The options only the MPI backend reads (BackendOptions::mpi).
#pragma once

#include <cstdint>
#include <vector>

namespace horovod {

struct MpiOptions {
  // An mpi4py communicator handle to use instead of MPI_COMM_WORLD (0: none), or the ranks of
  // MPI_COMM_WORLD to restrict Horovod to (empty: all).
  intptr_t comm = 0;
  std::vector<int> ranks;
  // Initialise MPI without thread support (HOROVOD_MPI_THREADS_DISABLE).
  bool threads_disable = false;
};

}  // namespace horovod
