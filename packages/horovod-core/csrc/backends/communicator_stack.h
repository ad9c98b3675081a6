// Building the global communicator stack at init: the CPU backend the config selects (Gloo or
// MPI), wrapped by the shared-memory transport when every rank is on one host, or by the
// hierarchical collectives on several homogeneous hosts when asked for (or when autotune may try
// them); and the job's facts every rank agrees on (hosts, process ids, homogeneity).
//
// The composition of the transports: the one header of backends/ besides communicator.h and
// registry.h that the engine includes (the concrete transports stay behind it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/communicator.h"
#include "common/config.h"
#include "common/store.h"

namespace horovod {

struct HierarchicalState;  // backends/hierarchical/hierarchical.h

// The hierarchical collectives of a stack: whether it has them (a multi-host homogeneous job that
// asked for them or autotunes them), whether each is switched on now, how many ran, and whether
// their steps within a host go through shared memory.
struct HierarchicalStats {
  bool available = false, allreduce = false, allgather = false, local_shared_memory = false;
  int64_t allreduces = 0, allgathers = 0;
};

struct CommunicatorStack {
  std::unique_ptr<Communicator> global;
  const char* backend_name = "";
  // Host name and pid of every global rank.
  std::vector<std::pair<std::string, int64_t>> peers;
  int num_hosts = 1;
  int local_channels = 0;  // the global communicator's shared-memory channels (Gloo, several hosts)
  bool homogeneous = true;
  bool shared_memory = false;              // the global set's collectives go through shared memory
  bool shared_memory_single_copy = false;  // ... and its large allreduces read peers' buffers directly
  // The switches and counters of the hierarchical wrapper (null when there is none).
  std::shared_ptr<HierarchicalState> hierarchical;
};

// Collective over every rank of the job. `config` gets the topology of backends that know it
// (MPI). Throws EngineError or std::exception on failure.
CommunicatorStack BuildCommunicatorStack(Config& config, Store* store, const std::string& key_prefix,
                                         intptr_t mpi_comm, const std::vector<int>& mpi_ranks);

// The backend a config selects: HOROVOD_CPU_OPERATIONS, else HOROVOD_CONTROLLER, else MPI when the
// process was started by an MPI launcher and the MPI backend is available, else Gloo.
std::string CpuBackendName(const Config& config);

HierarchicalStats HierarchicalStatsOf(const CommunicatorStack& stack);
// Switches the stack's hierarchical allreduce and allgather on or off (autotune; nothing without
// hierarchical collectives).
void SwitchHierarchical(CommunicatorStack& stack, bool allreduce, bool allgather);

// Options of a communicator created after the global one (the rendezvous through `store`).
BackendOptions CommunicatorOptions(const Config& config, Store* store, const std::string& key_prefix);

// Every rank's bytes, on every rank (a gather to rank 0 and a broadcast of the concatenation).
std::vector<std::vector<char>> AllgatherBytes(Communicator& communicator, const std::vector<char>& mine);

}  // namespace horovod
