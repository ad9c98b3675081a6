// The control operations: barrier, join, and registering and removing a process set. They carry
// no tensor; join and the process set operations run on the global set only and complete their
// handles with one integer.
#include "collectives/collective.h"

namespace horovod {

namespace {

Status GlobalSetOnly(OpType type, const EnqueueContext& context) {
  if (context.process_set_id == 0) return Status::OK();
  return Status::InvalidArgument(std::string(OpTypeName(type)) + " runs on the global process set only.");
}

class Barrier : public Collective {
 public:
  Barrier() : Collective(OpType::BARRIER) {}
  bool has_tensors() const override { return false; }
  void Execute(ExecutionContext& ctx) const override {
    ScopedActivity scoped(ctx.timeline, ctx.response.names, ActivityOf(ctx, "BARRIER").c_str());
    ctx.communicator.Barrier();
  }
};

// Negotiated by the controller itself (a joined rank stops counting as a submitter); the response
// carries the global rank that joined last.
class Join : public Collective {
 public:
  Join() : Collective(OpType::JOIN) {}
  bool has_tensors() const override { return false; }
  Status CheckRequest(const Request& request, const TensorTableEntry&, const EnqueueContext& context) const override {
    return GlobalSetOnly(type(), context);
  }
  // Every rank executes the join while it is still joined.
  bool joined_ranks_take_part() const override { return true; }
  void Execute(ExecutionContext& ctx) const override { ctx.value = ctx.response.tensor_sizes[0]; }
};

// Registering (the request's shape: the global ranks) or removing (the request's shape: the set
// id) a process set, at the same point of every rank's operation sequence.
class ProcessSetOperation : public Collective {
 public:
  explicit ProcessSetOperation(OpType type) : Collective(type) {}
  bool has_tensors() const override { return false; }
  Status CheckRequest(const Request& request, const TensorTableEntry&, const EnqueueContext& context) const override {
    const bool add = type() == OpType::ADD_PROCESS_SET;
    if (!context.dynamic_process_sets) {
      return Status::InvalidArgument(std::string(add ? "hvd.add_process_set()" : "hvd.remove_process_set()") +
                                     " needs dynamic process sets: set HOROVOD_DYNAMIC_PROCESS_SETS=1 or call "
                                     "hvd.init(process_sets=\"dynamic\").");
    }
    Status status = GlobalSetOnly(type(), context);
    if (!status.ok() || !add) return status;
    // The ranks of a new set: global ranks, sorted by the caller, each once.
    const std::vector<int64_t>& ranks = request.shape;
    if (ranks.empty()) return Status::InvalidArgument("A process set needs at least one rank.");
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] < 0 || ranks[i] >= context.global_size) {
        return Status::InvalidArgument("Process set rank " + std::to_string(ranks[i]) +
                                       " is out of range: expected 0 <= rank < " +
                                       std::to_string(context.global_size) + ".");
      }
      if (i > 0 && ranks[i] == ranks[i - 1]) {
        return Status::InvalidArgument("Process set rank " + std::to_string(ranks[i]) + " is listed twice.");
      }
    }
    return Status::OK();
  }
  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext&) const override {
    const Request& first = requests[0];
    for (const Request& r : requests) {
      if (r.shape != first.shape) {
        return std::string("Mismatched ") + name() + " arguments: one rank gave " + ShapeString(first.shape) +
               ", but another rank gave " + ShapeString(r.shape) + ".";
      }
    }
    return "";
  }
  void Describe(const std::vector<Request>& requests, int, Response* response) const override {
    response->tensor_sizes = requests[0].shape;
  }
  void Execute(ExecutionContext& ctx) const override {
    const std::vector<int64_t>& args = ctx.response.tensor_sizes;
    if (type() == OpType::ADD_PROCESS_SET) {
      ctx.value = ctx.registry->Add(std::vector<int>(args.begin(), args.end()));
    } else {
      ctx.value = ctx.registry->Remove(static_cast<int32_t>(args[0]));
    }
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Barrier>()) &&
                         RegisterCollective(std::make_unique<Join>()) &&
                         RegisterCollective(std::make_unique<ProcessSetOperation>(OpType::ADD_PROCESS_SET)) &&
                         RegisterCollective(std::make_unique<ProcessSetOperation>(OpType::REMOVE_PROCESS_SET));

}  // namespace

}  // namespace horovod
