// Broadcast: the root rank's tensor replaces every other rank's, in place.
#include <algorithm>

#include "collectives/collective.h"

namespace horovod {

namespace {

class Broadcast : public Collective {
 public:
  Broadcast() : Collective(OpType::BROADCAST) {}

  // root_rank is a global rank, and must be a member of the set.
  Status CheckRequest(const Request& request, const TensorTableEntry&, const EnqueueContext& context) const override {
    const std::vector<int>& ranks = *context.set_ranks;
    if (!std::binary_search(ranks.begin(), ranks.end(), request.root_rank)) {
      return Status::InvalidArgument("Broadcast root rank " + std::to_string(request.root_rank) +
                                     " is not a member of process set " + std::to_string(context.process_set_id) +
                                     " (ranks " + ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end())) +
                                     "); root_rank is a global rank.");
    }
    return Status::OK();
  }

  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext& context) const override {
    std::string mismatch = agreement::SameShape(requests);
    if (!mismatch.empty()) return mismatch;
    const Request& first = requests[0];
    if (context.any_joined) return "BROADCAST is not supported with Join at this time (tensor " + first.name + ").";
    for (const Request& r : requests) {
      if (r.root_rank != first.root_rank) {
        return "Mismatched BROADCAST root ranks: one rank specified root rank " + std::to_string(first.root_rank) +
               ", but another rank specified root rank " + std::to_string(r.root_rank) + " (tensor " + first.name +
               ").";
      }
    }
    return "";
  }

  bool cacheable() const override { return true; }

  void Execute(ExecutionContext& ctx) const override {
    const int root = SetRankOf(ctx.set_ranks, ctx.response.root_rank);
    const std::string activity = ActivityOf(ctx, "BCAST");
    for (TensorTableEntry* e : ctx.entries) {
      if (ctx.set_rank == root) ctx.executor.Copy({{e->input.data, e->output.data, e->input.num_bytes()}});
      ScopedActivity scoped(ctx.timeline, e->name, activity.c_str());
      ctx.communicator.Broadcast({e->output.data, static_cast<int64_t>(e->output.num_bytes()), root});
    }
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Broadcast>());

}  // namespace

}  // namespace horovod
