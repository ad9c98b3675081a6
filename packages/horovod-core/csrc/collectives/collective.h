// A collective operation's home: one class per operation type (csrc/collectives/<name>.cc), holding
// everything that differs between operations, from the caller's enqueue to the execution:
//   - CheckRequest: the checks of one rank's request at enqueue, against its process set (caller's
//     thread; an error is raised to that caller at once);
//   - CheckAgreement / Describe: on the coordinator, the checks that every rank asked for the same
//     operation (a disagreement becomes an ERROR response every rank fails with) and the sizes the
//     response carries (first dimensions, splits);
//   - Execute: the data movement on the background thread, written once against a Communicator
//     (csrc/backends/communicator.h) and a DeviceExecutor (csrc/executors/device_executor.h), so
//     the same code runs on CPU and GPU tensors.
// The registry maps an OpType to its collective; each file registers its class from a static
// initialiser (the engine is an object library, so every registration is linked in).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/communicator.h"
#include "common/common.h"
#include "common/message.h"
#include "common/tensor_queue.h"
#include "common/timeline.h"
#include "executors/device_executor.h"

namespace horovod {

// The engine's process sets as the control operations change them (control.cc), at the same point
// of every rank's sequence; engine/process_sets.h's ProcessSetRegistry implements it, so that the
// collectives need nothing of the engine above them.
class ProcessSetChanges {
 public:
  // Registers a set of `ranks` (global, sorted); returns its id, or -1 when a set of these ranks exists.
  virtual int64_t Add(const std::vector<int>& ranks) = 0;
  // Removes set `id`; returns `id`, or -1 for the global set or an unknown id.
  virtual int64_t Remove(int32_t id) = 0;

 protected:
  ~ProcessSetChanges() = default;
};

// What a request is checked against at enqueue.
struct EnqueueContext {
  int32_t process_set_id = 0;
  const std::vector<int>* set_ranks = nullptr;  // global ranks of the set, sorted
  int global_size = 1;
  bool dynamic_process_sets = false;  // HOROVOD_DYNAMIC_PROCESS_SETS
};

// What the coordinator knows when it checks one tensor's requests.
struct AgreementContext {
  bool any_joined = false;         // some rank of the set has joined
  int64_t fusion_threshold_bytes = 0;
};

// Everything one response's execution works with on this rank.
struct ExecutionContext {
  const Response& response;
  // This rank's entries, one per name of the response; null where this rank has none (a joined
  // rank, for the operations a joined rank takes part in).
  std::vector<TensorTableEntry*>& entries;
  // Engine-allocated outputs per entry (left empty where the caller gave the output).
  std::vector<std::vector<std::shared_ptr<OutputBuffer>>>& outputs;
  Communicator& communicator;  // of the set, on the response's device (CPU backend or NCCL)
  DeviceExecutor& executor;
  const std::vector<int>& set_ranks;  // global ranks of the set, sorted
  int set_rank;                       // this rank's rank in the set
  Timeline& timeline;
  ProcessSetChanges* registry;  // the engine's process sets (control operations of the global set)
  // The result of an operation whose result is one integer (join, process set registration).
  std::optional<int64_t> value;
};

class Collective {
 public:
  explicit Collective(OpType type) : type_(type) {}
  virtual ~Collective() = default;
  OpType type() const { return type_; }
  const char* name() const { return OpTypeName(type_); }
  // The operation's name as callers give it (_core.enqueue) and as it leads its tensors' names
  // ("allreduce.<user name>"): name() in lower case.
  std::string lower_name() const;
  // Whether the operation carries tensors: false for barrier, join and the process set
  // operations, whose one request has no tensor (its shape holds the operation's integers).
  virtual bool has_tensors() const { return true; }

  // Caller's thread: the checks of this rank's `request` (and its tensors, `entry`) against its
  // process set. Returns OK, or the error raised to the caller (INVALID_ARGUMENT -> ValueError).
  virtual Status CheckRequest(const Request& request, const TensorTableEntry& entry,
                              const EnqueueContext& context) const {
    return Status::OK();
  }
  // Coordinator: this operation's checks of every rank's request for one tensor (the common
  // checks of data type, operation type and device are done around it, in spec core.md §6.11's
  // order). Returns the error text, or "" when the ranks agree.
  virtual std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext& context) const {
    return "";
  }
  // Coordinator: fills response->tensor_sizes from the agreeing requests (indexed by set rank via
  // Request::rank) of a set of `size` ranks.
  virtual void Describe(const std::vector<Request>& requests, int size, Response* response) const {}
  // Whether responses of this operation may be kept in the response cache.
  virtual bool cacheable() const { return false; }
  // Whether a joined rank takes part (contributing zeros) instead of the operation being an error.
  virtual bool joined_ranks_take_part() const { return false; }
  // Background thread: executes the negotiated response on this rank. Throws std::exception on a
  // transport failure (the engine then stops).
  virtual void Execute(ExecutionContext& context) const = 0;

 private:
  OpType type_;
};

// The timeline activity of `op` on the context's communicator (Communicator::Activity), built
// only while the timeline records: the execution path pays nothing for names otherwise.
inline std::string ActivityOf(const ExecutionContext& ctx, const char* op) {
  return ctx.timeline.recording() ? ctx.communicator.Activity(op) : std::string();
}

// The collective of `type`; throws std::logic_error for a type without one (ERROR).
const Collective& CollectiveFor(OpType type);
// The collective whose lower_name() is `name` ("allreduce"), or null.
const Collective* CollectiveNamed(std::string_view name);
// The lower_name() of every registered collective, sorted.
std::vector<std::string> CollectiveNames();
// Called from the static initialiser of each collective's file; returns true.
bool RegisterCollective(std::unique_ptr<Collective> collective);

// Checks every rank's request for one tensor: data types, operation types, the operation's own
// checks, then the kind of device. Returns the first disagreement's text, or "".
std::string FindMismatch(const std::vector<Request>& requests, const AgreementContext& context);

// Building blocks of CheckAgreement, each returning an error text or "".
namespace agreement {
std::string SameShape(const std::vector<Request>& requests);
std::string SameScaleAndOp(const std::vector<Request>& requests);
// Allgather, alltoall: no joined rank, at least one dimension, the same rank and trailing
// dimensions.
std::string GatherLikeShapes(const std::vector<Request>& requests, bool any_joined);
}  // namespace agreement

// A reduction's op and scale as the communicator runs them: AVERAGE becomes SUM followed by a
// division by the number of ranks folded into the postscale factor.
struct Reduction {
  ReduceOp op;
  double postscale;
};
Reduction EffectiveReduction(const Response& response, int size);

// Eager allreduce (engine/controller.h; allreduce.cc): the options under which the cache round of
// a set of `size` ranks carries the data of this rank's one cache hit, `request` (cache bit `bit`,
// cached response `cached`), whose data lies in `queue`; tag 0 (no data) when it is not an
// allreduce of a CPU tensor of at most `max_bytes` without prescale.
EagerAllreduceOptions EagerAllreduceData(const Response& cached, const Request& request, uint32_t bit,
                                         int64_t max_bytes, int size, TensorQueue* queue);

// The set rank of global rank `global_rank` in `set_ranks` (sorted).
int SetRankOf(const std::vector<int>& set_ranks, int global_rank);

// Whether a reduction (`op`: "allreduce", "reducescatter") of `view` can run where it lies: GPU
// tensors only of the types NCCL reduces. INVALID_ARGUMENT otherwise.
Status CheckGpuReduction(const TensorView& view, const char* op);

// The bytes of one row (all dimensions but the first) of a tensor of `dtype` and `shape`.
int64_t RowBytes(DataType dtype, const std::vector<int64_t>& shape);

}  // namespace horovod
