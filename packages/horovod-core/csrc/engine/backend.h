// The interface every backend implements (csrc/backends/<name>/), and the registry through which
// the engine creates them by name. The engine never refers to a concrete backend.
//
// A backend instance serves one communicator (a set of ranks). It offers the data collectives on
// raw buffers and the control-plane primitives the controller negotiates with. All calls happen
// on the engine's background thread, one at a time, in the same order on every rank. Failures
// (a lost peer, a timeout) are thrown as std::exception.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "store.h"

namespace horovod {

struct BackendOptions {
  int rank = 0;
  int size = 1;
  Store* store = nullptr;      // rendezvous; only used while the backend is being created
  std::string key_prefix;      // distinguishes communicators and successive inits in the store
  std::string iface;           // network interface for the data transport ("" = by hostname)
  std::string hostname;        // address to listen on when no interface is given
  std::chrono::milliseconds timeout{30000};
  // MPI only: an mpi4py communicator handle to use instead of MPI_COMM_WORLD (0: none), or the
  // ranks of MPI_COMM_WORLD to restrict Horovod to (empty: all), and whether to initialise MPI
  // without thread support (HOROVOD_MPI_THREADS_DISABLE).
  intptr_t mpi_comm = 0;
  std::vector<int> mpi_ranks;
  bool mpi_threads_disable = false;
};

// One tensor of a fused allreduce: `count` elements read from `input`, the result written to
// `output` (which may be `input`).
struct AllreducePiece {
  const void* input;
  void* output;
  int64_t count;
};

class Backend {
 public:
  explicit Backend(const BackendOptions& options) : rank_(options.rank), size_(options.size) {}
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Backends that know the job's layout themselves (MPI, from its launcher) report it; the others
  // return false and the launcher's HOROVOD_* variables are used.
  virtual bool Topology(int* local_rank, int* local_size, int* cross_rank, int* cross_size) { return false; }
  // MPI: whether MPI runs with MPI_THREAD_MULTIPLE.
  virtual bool threads_supported() const { return false; }

  // Control plane. Gatherv returns every rank's bytes on `root` (empty elsewhere); Broadcast
  // replaces `data` on non-roots with root's bytes.
  virtual std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) = 0;
  virtual void Broadcast(std::vector<char>& data, int root) = 0;
  // Bitwise AND of `words` over every rank, in place (the response cache's agreement round).
  // The default gathers to rank 0 and broadcasts the result.
  virtual void AllreduceBitsAnd(std::vector<uint64_t>& words);

  // Collective over this communicator: creates the communicator of `ranks` (ranks of this
  // communicator, sorted, unique), rendezvousing through options.store under options.key_prefix.
  // Returns nullptr on ranks outside `ranks`.
  virtual std::unique_ptr<Backend> Split(const std::vector<int>& ranks, const BackendOptions& options) = 0;

  // Data collectives. `count` is in elements of `dtype`; byte counts are per rank.
  virtual void Allreduce(void* buffer, int64_t count, DataType dtype, ReduceOp op) = 0;
  virtual void Allgatherv(const void* input, void* output, const std::vector<int64_t>& bytes_per_rank) = 0;
  virtual void Broadcast(void* buffer, int64_t num_bytes, int root) = 0;
  // Sends send_bytes[r] bytes (consecutive, from `input`) to each rank r and receives
  // recv_bytes[r] bytes from each into `output`, in rank order.
  virtual void Alltoallv(const void* input, const std::vector<int64_t>& send_bytes, void* output,
                         const std::vector<int64_t>& recv_bytes) = 0;
  // Reduces `buffer` (count elements) over the ranks; afterwards the elements
  // [sum(counts[0..rank)), + counts[rank]) of `buffer` hold this rank's part of the result (the
  // rest is unspecified). The default is a full Allreduce.
  virtual void Reducescatter(void* buffer, int64_t count, const std::vector<int64_t>& counts, DataType dtype,
                             ReduceOp op);
  // Allreduce of a fused group without a fusion buffer: whether this backend reduces `num_pieces`
  // tensors of `bytes` in all straight from their own memory (AllreducePieces). The answer depends
  // only on the arguments and on state every rank agreed on, so all ranks take the same path.
  virtual bool AllreducesPieces(int64_t bytes, size_t num_pieces) const { return false; }
  // Reduces the concatenation of the pieces' inputs over the ranks and writes it, multiplied by
  // `postscale`, into their outputs. Only called where AllreducesPieces said yes.
  virtual void AllreducePieces(const std::vector<AllreducePiece>& pieces, DataType dtype, ReduceOp op,
                               double postscale);
  virtual void Barrier() = 0;
  // Point to point: sends send_bytes to `peer` and receives recv_bytes from it (Adasum).
  virtual void SendRecv(const void* send, int64_t send_bytes, void* recv, int64_t recv_bytes, int peer) = 0;

 protected:
  int rank_;
  int size_;
};

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendOptions&)>;

class BackendRegistry {
 public:
  // Called from a static initialiser in each built backend's source file.
  static bool Register(const std::string& name, BackendFactory factory);
  // Built backends: those compiled in, plus "mpi" when its plugin (_mpi_backend.so beside the
  // core) loads, which needs the MPI library it was built against.
  static bool Built(const std::string& name);
  static std::vector<std::string> Names();
  // Why the MPI plugin could not be loaded ("" when it was).
  static std::string PluginError(const std::string& name);
  // Finalizes MPI at exit if the MPI plugin initialised it.
  static void FinalizeMpi();
  // Throws EngineError(PRECONDITION_ERROR) naming the backend when it was not built.
  static std::unique_ptr<Backend> Create(const std::string& name, const BackendOptions& options);
};

}  // namespace horovod
