// Reduce: the root rank ends with the reduction of every rank's tensor, `postscale ·
// REDUCE(prescale · x)` as for allreduce (Average: Sum, then division by the set's size); on the
// other ranks the output is a copy of the input (unchanged when in place).
//
// Execution, the same on every device: the communicator's allreduce, run on the root in its output
// and on the other ranks in the device's fusion buffer, which is then dropped. A transport with a
// real reduce would move half the bytes; correctness first, and every transport has an allreduce.
// Responses are never fused (csrc/common/fusion.cc fuses allreduces only): one entry each.
#include <algorithm>

#include "collectives/collective.h"

namespace horovod {

namespace {

class Reduce : public Collective {
 public:
  Reduce() : Collective(OpType::REDUCE) {}

  Status CheckRequest(const Request& request, const TensorTableEntry& entry,
                      const EnqueueContext& context) const override {
    const std::vector<int>& ranks = *context.set_ranks;
    if (!std::binary_search(ranks.begin(), ranks.end(), request.root_rank)) {
      return Status::InvalidArgument("Reduce root rank " + std::to_string(request.root_rank) +
                                     " is not a member of process set " + std::to_string(context.process_set_id) +
                                     "; root_rank is a global rank.");
    }
    const TensorView& in = entry.input;
    const TensorView& out = entry.output;
    if (out.dtype != in.dtype || out.shape != in.shape || out.device != in.device) {
      return Status::InvalidArgument("reduce output for '" + entry.name +
                                     "' must have the input's dtype, shape and device");
    }
    if (request.reduce_op == ReduceOp::ADASUM) {
      return Status::InvalidArgument("reduce supports Average, Sum, Min, Max and Product, not Adasum");
    }
    Status gpu = CheckGpuReduction(in, "reduce");
    if (!gpu.ok()) return gpu;
    if (in.dtype == DataType::BOOL &&
        (request.prescale_factor != 1.0 || request.postscale_factor != 1.0 || request.reduce_op == ReduceOp::AVERAGE)) {
      return Status::InvalidArgument("bool tensors support reduce with Sum, Min, Max or Product and no scaling only");
    }
    return Status::OK();
  }

  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext& context) const override {
    std::string mismatch = agreement::SameShape(requests);
    if (mismatch.empty()) mismatch = agreement::SameScaleAndOp(requests);
    if (!mismatch.empty()) return mismatch;
    const Request& first = requests[0];
    if (context.any_joined) return "REDUCE is not supported with Join at this time (tensor " + first.name + ").";
    for (const Request& r : requests) {
      if (r.root_rank != first.root_rank) {
        return "Mismatched REDUCE root ranks: one rank specified root rank " + std::to_string(first.root_rank) +
               ", but another rank specified root rank " + std::to_string(r.root_rank) + " (tensor " + first.name +
               ").";
      }
    }
    return "";
  }

  void Describe(const std::vector<Request>& requests, int, Response* response) const override {
    response->tensor_sizes.push_back(NumElements(requests[0].shape));
  }

  bool cacheable() const override { return true; }

  void Execute(ExecutionContext& ctx) const override {
    const Response& response = ctx.response;
    DeviceExecutor& executor = ctx.executor;
    const Reduction reduction = EffectiveReduction(response, ctx.communicator.size());
    const bool root = ctx.set_rank == SetRankOf(ctx.set_ranks, response.root_rank);
    const std::string activity = ActivityOf(ctx, "ALLREDUCE");
    for (TensorTableEntry* e : ctx.entries) {
      const size_t bytes = e->input.num_bytes();
      const int64_t count = NumElements(e->input.shape);
      void* buffer = root ? e->output.data : executor.FusionBuffer(bytes);
      executor.Copy({{e->input.data, buffer, bytes}});
      if (!root && e->output.data != e->input.data) executor.Copy({{e->input.data, e->output.data, bytes}});
      if (response.prescale_factor != 1.0) executor.Scale(buffer, count, response.dtype, response.prescale_factor);
      {
        ScopedActivity scoped(ctx.timeline, e->name, activity.c_str());
        ctx.communicator.Allreduce({buffer, count, response.dtype, reduction.op});
      }
      if (root && reduction.postscale != 1.0) executor.Scale(buffer, count, response.dtype, reduction.postscale);
    }
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Reduce>());

}  // namespace

}  // namespace horovod
