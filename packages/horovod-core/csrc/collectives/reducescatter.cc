// Reducescatter: the reduction of every rank's tensor, split along the first dimension; rank r
// keeps part r (dim0 / size rows, one more for the first dim0 % size ranks). The tensor is staged
// in the device's fusion buffer, reduced there by the communicator, and this rank's part is copied
// into a new output. AVERAGE is a SUM and a scale of this rank's part by 1/size. bfloat16 on the
// CPU is reduced in float32 and rounded once, straight from the input into the output
// (collectives/float32_accumulation.h).
#include "collectives/collective.h"
#include "collectives/float32_accumulation.h"
#include "collectives/layouts.h"

namespace horovod {

ReducescatterLayout MakeReducescatterLayout(const TensorView& input, int size, int me) {
  const int64_t dim0 = input.shape[0];
  std::vector<int64_t> row_shape(input.shape.begin() + 1, input.shape.end());
  const int64_t row_elements = NumElements(row_shape);
  ReducescatterLayout layout;
  layout.counts.resize(size);
  for (int r = 0; r < size; ++r) {
    layout.counts[r] = (dim0 / size + (r < dim0 % size ? 1 : 0)) * row_elements;
    if (r < me) layout.offset += layout.counts[r];
  }
  layout.shape = input.shape;
  layout.shape[0] = dim0 / size + (me < dim0 % size ? 1 : 0);
  return layout;
}

namespace {

class Reducescatter : public Collective {
 public:
  Reducescatter() : Collective(OpType::REDUCESCATTER) {}

  Status CheckRequest(const Request& request, const TensorTableEntry& entry, const EnqueueContext&) const override {
    if (request.reduce_op != ReduceOp::AVERAGE && request.reduce_op != ReduceOp::SUM) {
      return Status::Aborted("Reducescatter supports only the Average and Sum reduce ops; got op " +
                             std::to_string(static_cast<int32_t>(request.reduce_op)) + ".");
    }
    if (entry.input.dtype == DataType::BOOL) {
      return Status::InvalidArgument("reducescatter does not support bool tensors.");
    }
    return CheckGpuReduction(entry.input, "reducescatter");
  }

  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext& context) const override {
    std::string mismatch = agreement::SameShape(requests);
    if (mismatch.empty()) mismatch = agreement::SameScaleAndOp(requests);
    if (!mismatch.empty()) return mismatch;
    const Request& first = requests[0];
    if (context.any_joined) return "REDUCESCATTER is not supported with Join at this time (tensor " + first.name + ").";
    if (first.shape.empty()) {
      return "REDUCESCATTER requires tensors of at least one dimension; the ranks sent a scalar (tensor " +
             first.name + ").";
    }
    const int64_t bytes = NumElements(first.shape) * static_cast<int64_t>(DataTypeSize(first.dtype));
    if (first.prescale_factor != 1.0 && bytes > context.fusion_threshold_bytes) {
      return "REDUCESCATTER with a prescale factor needs the tensor to fit the fusion buffer, which is too small: "
             "tensor " + first.name + " has " + std::to_string(bytes) + " bytes and HOROVOD_FUSION_THRESHOLD is " +
             std::to_string(context.fusion_threshold_bytes) + " bytes.";
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
    const int size = ctx.communicator.size();
    const int me = ctx.set_rank;
    const Reduction reduction = EffectiveReduction(response, size);
    const std::string activity = ActivityOf(ctx, "REDUCESCATTER");
    for (size_t t = 0; t < ctx.entries.size(); ++t) {
      TensorTableEntry& e = *ctx.entries[t];
      const DataType dtype = e.input.dtype;
      const size_t element_size = DataTypeSize(dtype);
      ReducescatterLayout layout = MakeReducescatterLayout(e.input, size, me);
      const int64_t count = e.input.num_elements();
      const size_t bytes = static_cast<size_t>(count) * element_size;
      if (AccumulatesInFloat32(dtype, e.input.device)) {
        std::shared_ptr<OutputBuffer> output = executor.Allocate(dtype, layout.shape);
        ScopedActivity scoped(ctx.timeline, e.name, activity.c_str());
        ReducescatterInFloat32(ctx.communicator, static_cast<const uint16_t*>(e.input.data), layout.counts,
                               reduction.op, response.prescale_factor, reduction.postscale,
                               static_cast<uint16_t*>(output->data()));
        ctx.outputs[t].push_back(std::move(output));
        continue;
      }
      ScopedActivity scoped(ctx.timeline, e.name, "MEMCPY_IN_FUSION_BUFFER");
      void* buffer = executor.FusionBuffer(bytes);
      executor.Copy({{e.input.data, buffer, bytes}});
      if (response.prescale_factor != 1.0) executor.Scale(buffer, count, dtype, response.prescale_factor);
      scoped.Next(activity.c_str());
      const int64_t mine_count = layout.counts[me];
      ctx.communicator.Reducescatter({buffer, count, std::move(layout.counts), dtype, reduction.op});
      char* mine = static_cast<char*>(buffer) + layout.offset * element_size;
      if (reduction.postscale != 1.0) executor.Scale(mine, mine_count, dtype, reduction.postscale);
      std::shared_ptr<OutputBuffer> output = executor.Allocate(dtype, layout.shape);
      scoped.Next("MEMCPY_OUT_FUSION_BUFFER");
      executor.Copy({{mine, output->data(), static_cast<size_t>(mine_count) * element_size}});
      ctx.outputs[t].push_back(std::move(output));
    }
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Reducescatter>());

}  // namespace

}  // namespace horovod
