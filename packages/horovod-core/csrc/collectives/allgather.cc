// Allgather: every rank ends with the concatenation, along the first dimension and in set rank
// order, of every rank's tensor; the ranks may contribute different numbers of rows.
#include "collectives/collective.h"
#include "collectives/layouts.h"

namespace horovod {

AllgatherLayout MakeAllgatherLayout(const Response& response, size_t t, const TensorView& input, int size) {
  const int64_t row_bytes = RowBytes(input.dtype, input.shape);
  AllgatherLayout layout;
  layout.bytes_per_rank.resize(size);
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t dim0 = response.tensor_sizes[t * size + r];
    layout.bytes_per_rank[r] = dim0 * row_bytes;
    rows += dim0;
  }
  layout.shape = input.shape;
  layout.shape[0] = rows;
  layout.bytes = rows * row_bytes;
  return layout;
}

namespace {

class Allgather : public Collective {
 public:
  Allgather() : Collective(OpType::ALLGATHER) {}

  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext& context) const override {
    return agreement::GatherLikeShapes(requests, context.any_joined);
  }

  // The first dimension contributed by every member.
  void Describe(const std::vector<Request>& requests, int size, Response* response) const override {
    response->tensor_sizes.assign(size, 0);
    for (const Request& r : requests) response->tensor_sizes[r.rank] = r.shape[0];
  }

  bool cacheable() const override { return true; }

  void Execute(ExecutionContext& ctx) const override {
    const int size = ctx.communicator.size();
    const std::string activity = ActivityOf(ctx, "ALLGATHER");
    for (size_t t = 0; t < ctx.entries.size(); ++t) {
      TensorTableEntry& e = *ctx.entries[t];
      AllgatherLayout layout = MakeAllgatherLayout(ctx.response, t, e.input, size);
      std::shared_ptr<OutputBuffer> output = ctx.executor.Allocate(e.input.dtype, layout.shape);
      {
        ScopedActivity scoped(ctx.timeline, e.name, activity.c_str());
        ctx.communicator.Allgather({e.input.data, output->data(), std::move(layout.bytes_per_rank)});
      }
      ctx.outputs[t].push_back(std::move(output));
    }
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Allgather>());

}  // namespace

}  // namespace horovod
