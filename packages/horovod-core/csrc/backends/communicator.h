// The one interface every transport implements (csrc/backends/<name>/); the engine creates the CPU
// backends by name through the registry (registry.h). The engine and the collectives
// (csrc/collectives/) never refer to a concrete transport.
//
// A communicator serves one set of ranks. It offers the data collectives on raw buffers, each
// taking one option struct, and (CPU backends) the control-plane primitives the controller
// negotiates with. All calls happen on the engine's background thread, one at a time, in the same
// order on every rank. Failures (a lost peer, a timeout) are thrown as std::exception.
//
// Every method has a default that throws UnsupportedError("backend X does not support Y"): a
// transport implements what it can do and says so for the rest, instead of the base class
// silently doing more work. The collectives check the capability queries (SupportsPieces) before
// calling what is optional.
//
// Wrappers that take over some operations of another communicator (shared memory, hierarchical)
// derive from ForwardingCommunicator, which forwards everything they do not override.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/gloo/gloo_options.h"
#include "backends/mpi/mpi_options.h"
#include "common/common.h"
#include "common/store.h"

namespace horovod {

// Thrown by a communicator asked for an operation its transport does not implement.
class UnsupportedError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// How to create a communicator: what every backend reads, and each backend's own options.
struct BackendOptions {
  int rank = 0;
  int size = 1;
  Store* store = nullptr;      // rendezvous; only used while the communicator is being created
  std::string key_prefix;      // distinguishes communicators and successive inits in the store
  std::chrono::milliseconds timeout{30000};
  GlooOptions gloo;
  MpiOptions mpi;
};

// ---- Options of the data collectives. Counts are in elements of `dtype`, byte counts per rank. ----

// In-place reduction of `count` elements of `buffer` over every rank. `op` is SUM, MIN, MAX or
// PRODUCT (the collectives turn AVERAGE into SUM and a scale).
struct AllreduceOptions {
  void* buffer = nullptr;
  int64_t count = 0;
  DataType dtype = DataType::FLOAT32;
  ReduceOp op = ReduceOp::SUM;
};

// One tensor of a fused allreduce: `count` elements read from `input`, the result written to
// `output` (which may be `input`).
struct Piece {
  const void* input = nullptr;
  void* output = nullptr;
  int64_t count = 0;
};

// Reduces the concatenation of the pieces' inputs over the ranks and writes it, multiplied by
// `scale`, into their outputs, straight from the tensors' own memory (no fusion buffer).
struct AllreducePiecesOptions {
  std::vector<Piece> pieces;
  DataType dtype = DataType::FLOAT32;
  ReduceOp op = ReduceOp::SUM;
  double scale = 1.0;
};

// Rank r's bytes_per_rank[r] bytes, concatenated in rank order into `output`; this rank's come
// from `input`.
struct AllgatherOptions {
  const void* input = nullptr;
  void* output = nullptr;
  std::vector<int64_t> bytes_per_rank;
};

// `bytes` bytes of `buffer` on rank `root` replace `buffer` on every other rank.
struct BroadcastOptions {
  void* buffer = nullptr;
  int64_t bytes = 0;
  int root = 0;
};

// Sends send_bytes[r] bytes (consecutive, from `input`) to each rank r and receives recv_bytes[r]
// bytes from each into `output`, in rank order.
struct AlltoallOptions {
  const void* input = nullptr;
  std::vector<int64_t> send_bytes;
  void* output = nullptr;
  std::vector<int64_t> recv_bytes;
};

// Reduces `count` elements of `buffer` over the ranks; afterwards the elements
// [sum(counts[0..rank)), + counts[rank]) of `buffer` hold this rank's part of the result (the
// rest is unspecified).
struct ReducescatterOptions {
  void* buffer = nullptr;
  int64_t count = 0;
  std::vector<int64_t> counts;
  DataType dtype = DataType::FLOAT32;
  ReduceOp op = ReduceOp::SUM;
};

// Point to point (Adasum): sends send_bytes to `peer` and receives recv_bytes from it.
struct SendRecvOptions {
  const void* send = nullptr;
  int64_t send_bytes = 0;
  void* recv = nullptr;
  int64_t recv_bytes = 0;
  int peer = 0;
};

// One allreduce's data carried by the response cache's agreement round (eager allreduce,
// Communicator::AllreduceBitsAndEager). `tag` 0: this rank sends no data. Otherwise `count`
// elements of `dtype` are read from `input`, and when every rank sent data under the same tag,
// their reduction by `op` in rank order, (x_0 op x_1) op x_2 ..., is written to `output` (which may
// be `input`).
struct EagerAllreduceOptions {
  uint64_t tag = 0;
  const void* input = nullptr;
  void* output = nullptr;
  int64_t count = 0;
  DataType dtype = DataType::FLOAT32;
  ReduceOp op = ReduceOp::SUM;
};

class Communicator {
 public:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // The transport's name: "gloo", "mpi", "nccl" (a wrapper reports its inner communicator's).
  virtual const char* name() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The timeline activity of operation `op` ("ALLREDUCE", "BCAST", ...) on this communicator: the
  // upper-cased name, "_", op (GLOO_ALLREDUCE). A wrapper whose own path runs reports its own.
  virtual std::string Activity(const char* op) const;

  // Backends that know the job's layout themselves (MPI, from its launcher) report it; the others
  // return false and the launcher's HOROVOD_* variables are used.
  virtual bool Topology(int* local_rank, int* local_size, int* cross_rank, int* cross_size) { return false; }
  // MPI: whether MPI runs with MPI_THREAD_MULTIPLE.
  virtual bool threads_supported() const { return false; }
  // Whether operations may be issued from any thread, one thread at a time (the engine serialises
  // them): a caller waiting on a handle then runs cycles itself (engine.h). MPI: at least
  // MPI_THREAD_SERIALIZED.
  virtual bool any_thread() const { return true; }
  // How many of this rank's peers its messages reach through a shared-memory channel instead of
  // the network (Gloo's, between ranks of one host: BackendOptions::local_channel).
  virtual int local_channels() const { return 0; }

  // ---- Control plane (CPU backends). ----
  // Gatherv returns every rank's bytes on `root` (empty elsewhere); BroadcastBytes replaces `data`
  // on non-roots with root's bytes.
  virtual std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root);
  virtual void BroadcastBytes(std::vector<char>& data, int root);
  // Bitwise AND of `words` over every rank, in place (the response cache's agreement round).
  // This base implementation gathers to rank 0 and broadcasts the result (through Gatherv and
  // BroadcastBytes); a transport may do better.
  virtual void AllreduceBitsAnd(std::vector<uint64_t>& words);
  // Eager allreduce: the largest allreduce, in bytes, whose data AllreduceBitsAndEager carries (0:
  // none). It depends only on the transport and the number of ranks, so every rank of a
  // communicator gets the same answer, and for tensors up to it Allreduce leaves the bits of the
  // reduction in rank order.
  virtual int64_t EagerAllreduceBytes() const { return 0; }
  // AllreduceBitsAnd with, from every rank that has it, one allreduce's data (`eager`, tag 0 for
  // none): where EagerAllreduceBytes() > 0 every rank calls this instead of AllreduceBitsAnd in a
  // given round. Returns true when every rank sent data under one nonzero tag; `eager.output`
  // then holds the reduction, and it is untouched otherwise. The base class carries no data.
  virtual bool AllreduceBitsAndEager(std::vector<uint64_t>& words, const EagerAllreduceOptions& eager) {
    AllreduceBitsAnd(words);
    return false;
  }
  // Collective over this communicator: creates the communicator of `ranks` (ranks of this
  // communicator, sorted, unique), rendezvousing through options.store under options.key_prefix.
  // Returns nullptr on ranks outside `ranks`.
  virtual std::unique_ptr<Communicator> Split(const std::vector<int>& ranks, const BackendOptions& options);

  // ---- Data collectives. ----
  virtual void Allreduce(const AllreduceOptions& options);
  // Whether AllreducePieces reduces `num_pieces` tensors of `bytes` in all. The answer depends
  // only on the arguments and on state every rank agreed on, so all ranks take the same path.
  virtual bool SupportsPieces(int64_t bytes, size_t num_pieces) const { return false; }
  virtual void AllreducePieces(const AllreducePiecesOptions& options);
  // A bfloat16 allreduce of `count` elements of `buffer`, in place, accumulated in float32 and rounded
  // once (collectives/float32_accumulation.h: every rank gets postscale * op_r(prescale * x_r)
  // computed in float32 and rounded to nearest even), by a shape of the transport's own. Returns
  // false, touching nothing, where the transport has none for this count; the caller then runs a
  // float32 Reducescatter and a bfloat16 Allgather. The answer depends only on `count` and the
  // communicator, the same on every rank. Not forwarded by ForwardingCommunicator (a wrapper
  // reduces by its own path).
  virtual bool AllreduceBfloat16InFloat32(uint16_t* buffer, int64_t count, ReduceOp op, float prescale,
                                          float postscale) {
    return false;
  }
  virtual void Allgather(const AllgatherOptions& options);
  virtual void Broadcast(const BroadcastOptions& options);
  virtual void Alltoall(const AlltoallOptions& options);
  virtual void Reducescatter(const ReducescatterOptions& options);
  virtual void Barrier();
  virtual void SendRecv(const SendRecvOptions& options);

 protected:
  // Throws UnsupportedError("backend <name> does not support <what>").
  [[noreturn]] void Unsupported(const char* what) const;

  int rank_;
  int size_;
};

// A communicator that wraps another (`inner`) and forwards every operation it does not override
// to it. The inner communicator stays the job's identity: name, topology, thread support.
class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(std::unique_ptr<Communicator> inner);
  Communicator& inner() const { return *inner_; }

  const char* name() const override { return inner_->name(); }
  std::string Activity(const char* op) const override { return inner_->Activity(op); }
  bool Topology(int* local_rank, int* local_size, int* cross_rank, int* cross_size) override {
    return inner_->Topology(local_rank, local_size, cross_rank, cross_size);
  }
  bool threads_supported() const override { return inner_->threads_supported(); }
  bool any_thread() const override { return inner_->any_thread(); }
  int local_channels() const override { return inner_->local_channels(); }
  std::vector<std::vector<char>> Gatherv(const std::vector<char>& data, int root) override {
    return inner_->Gatherv(data, root);
  }
  void BroadcastBytes(std::vector<char>& data, int root) override { inner_->BroadcastBytes(data, root); }
  void AllreduceBitsAnd(std::vector<uint64_t>& words) override { inner_->AllreduceBitsAnd(words); }
  // Not forwarded: a wrapper that reduces by its own path (shared memory, hierarchical) would not
  // leave the bits of the inner communicator's reduction in rank order.
  int64_t EagerAllreduceBytes() const override { return 0; }
  std::unique_ptr<Communicator> Split(const std::vector<int>& ranks, const BackendOptions& options) override {
    return inner_->Split(ranks, options);
  }
  void Allreduce(const AllreduceOptions& options) override { inner_->Allreduce(options); }
  bool SupportsPieces(int64_t bytes, size_t num_pieces) const override {
    return inner_->SupportsPieces(bytes, num_pieces);
  }
  void AllreducePieces(const AllreducePiecesOptions& options) override { inner_->AllreducePieces(options); }
  void Allgather(const AllgatherOptions& options) override { inner_->Allgather(options); }
  void Broadcast(const BroadcastOptions& options) override { inner_->Broadcast(options); }
  void Alltoall(const AlltoallOptions& options) override { inner_->Alltoall(options); }
  void Reducescatter(const ReducescatterOptions& options) override { inner_->Reducescatter(options); }
  void Barrier() override { inner_->Barrier(); }
  void SendRecv(const SendRecvOptions& options) override { inner_->SendRecv(options); }

 protected:
  std::unique_ptr<Communicator> inner_;
};

}  // namespace horovod
