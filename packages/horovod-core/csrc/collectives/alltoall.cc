// Alltoall: each rank sends splits[r] rows of its tensor (consecutive, in rank order) to each rank
// r of the set and receives, in rank order, the rows every rank sent it, with the received row
// counts as a second output. Without splits the first dimension is divided equally.
#include "collectives/collective.h"
#include "collectives/layouts.h"

namespace horovod {

AlltoallLayout MakeAlltoallLayout(const Response& response, const TensorView& input, int size, int me) {
  const int64_t row_bytes = RowBytes(input.dtype, input.shape);
  AlltoallLayout layout;
  layout.send_bytes.resize(size);
  layout.recv_bytes.resize(size);
  layout.received_splits = std::make_shared<OutputBuffer>(DataType::INT32, std::vector<int64_t>{size});
  auto* received_rows = static_cast<int32_t*>(layout.received_splits->data());
  int64_t rows = 0;
  for (int r = 0; r < size; ++r) {
    layout.send_bytes[r] = response.tensor_sizes[me * size + r] * row_bytes;
    const int64_t from = response.tensor_sizes[r * size + me];
    layout.recv_bytes[r] = from * row_bytes;
    received_rows[r] = static_cast<int32_t>(from);
    rows += from;
  }
  layout.shape = input.shape;
  layout.shape[0] = rows;
  layout.bytes = rows * row_bytes;
  return layout;
}

namespace {

class Alltoall : public Collective {
 public:
  Alltoall() : Collective(OpType::ALLTOALL) {}

  Status CheckRequest(const Request& r, const TensorTableEntry&, const EnqueueContext& context) const override {
    const int64_t size = static_cast<int64_t>(context.set_ranks->size());
    const int64_t dim0 = r.shape.empty() ? 0 : r.shape[0];
    if (r.splits.empty()) {
      if (dim0 % size != 0) {
        return Status::InvalidArgument(
            "alltoall: splits were not given and the first dimension (" + std::to_string(dim0) +
            ") is not divisible by the number of workers in the process set (" + std::to_string(size) + ").");
      }
      return Status::OK();
    }
    if (static_cast<int64_t>(r.splits.size()) != size) {
      return Status::InvalidArgument("alltoall: splits must have one entry per member of the process set: expected " +
                                     std::to_string(size) + " entries, got " + std::to_string(r.splits.size()) + ".");
    }
    int64_t total = 0;
    for (int64_t s : r.splits) {
      if (s < 0) return Status::InvalidArgument("alltoall: splits must not be negative.");
      total += s;
    }
    if (total > dim0) {
      return Status::InvalidArgument("alltoall: the splits add up to " + std::to_string(total) +
                                     ", more than the first dimension of the tensor (" + std::to_string(dim0) + ").");
    }
    return Status::OK();
  }

  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext& context) const override {
    return agreement::GatherLikeShapes(requests, context.any_joined);
  }

  // The size x size matrix of rows sent, [sender * size + receiver].
  void Describe(const std::vector<Request>& requests, int size, Response* response) const override {
    response->tensor_sizes.assign(static_cast<size_t>(size) * size, 0);
    for (const Request& r : requests) {
      for (int to = 0; to < size; ++to) {
        response->tensor_sizes[r.rank * size + to] = r.splits.empty() ? r.shape[0] / size : r.splits[to];
      }
    }
  }

  bool cacheable() const override { return true; }

  void Execute(ExecutionContext& ctx) const override {
    TensorTableEntry& e = *ctx.entries[0];
    // The received splits stay on the host whatever the device.
    AlltoallLayout layout = MakeAlltoallLayout(ctx.response, e.input, ctx.communicator.size(), ctx.set_rank);
    std::shared_ptr<OutputBuffer> output = ctx.executor.Allocate(e.input.dtype, layout.shape);
    {
      ScopedActivity scoped(ctx.timeline, e.name, ActivityOf(ctx, "ALLTOALL").c_str());
      ctx.communicator.Alltoall(
          {e.input.data, std::move(layout.send_bytes), output->data(), std::move(layout.recv_bytes)});
    }
    ctx.outputs[0].push_back(std::move(output));
    ctx.outputs[0].push_back(std::move(layout.received_splits));
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Alltoall>());

}  // namespace

}  // namespace horovod
