// Allreduce and Adasum: every rank ends with the reduction of every rank's tensor.
//
// Execution, the same on every device: a single tensor is reduced in its output (after a copy
// from its input when they differ); several tensors fused by negotiation (csrc/common/fusion.h),
// or a joined rank's zeros, go through the device's fusion buffer, each at an offset aligned for
// the device. Where the communicator reduces separate tensors straight from their own memory (the
// shared-memory transport's single-copy path) and this rank has every tensor, the fusion buffer
// is skipped. AVERAGE is a SUM followed by a scale by 1/size, folded into the postscale factor.
// Eager allreduce (engine/controller.h): EagerAllreduceData gives the data of a small cached
// allreduce for the negotiation's cache round to carry; one whose data that round already reduced
// (`settled`) only applies its postscale.
//
// bfloat16 on the CPU is reduced in float32 and rounded once (collectives/float32_accumulation.h),
// from the fusion buffer or the output: neither the single-copy path nor the eager one, which
// reduce in the tensors' own dtype.
//
// Adasum (spec core.md §6.10) runs the same staging, then the adaptive summation of
// collectives/adasum.h over the communicator's point-to-point exchange instead of its allreduce.
#include <algorithm>

#include "collectives/collective.h"
#include "collectives/adasum.h"
#include "collectives/float32_accumulation.h"

namespace horovod {

// NCCL reduces these types only (it has no int16, uint16 or bool reductions).
Status CheckGpuReduction(const TensorView& view, const char* op) {
  if (view.device == kCpuDevice) return Status::OK();
  switch (view.dtype) {
    case DataType::UINT8: case DataType::INT8: case DataType::INT32: case DataType::INT64: case DataType::FLOAT16:
    case DataType::BFLOAT16: case DataType::FLOAT32: case DataType::FLOAT64:
      return Status::OK();
    default:
      return Status::InvalidArgument(std::string(op) + " of " + DataTypeName(view.dtype) +
                                     " GPU tensors is not supported (NCCL reduces uint8, int8, int32, int64, "
                                     "float16, bfloat16, float32 and float64).");
  }
}

EagerAllreduceOptions EagerAllreduceData(const Response& cached, const Request& request, uint32_t bit,
                                         int64_t max_bytes, int size, TensorQueue* queue) {
  // The request describes the tensor (its dtype, shape and device; the output matches the input, as
  // the allreduce's enqueue checks); the queue only holds where the data lies.
  const int64_t count = NumElements(request.shape);
  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(request.dtype));
  EagerAllreduceOptions eager;
  void* output = nullptr;
  if (queue == nullptr || cached.type != OpType::ALLREDUCE || cached.names.size() != 1 ||
      request.device != kCpuDevice || request.prescale_factor != 1.0 || bytes == 0 || bytes > max_bytes ||
      AccumulatesInFloat32(request.dtype, request.device) ||
      !queue->Peek(request.name, &eager.input, &output) || output == nullptr) {
    return {};
  }
  eager.tag = uint64_t{bit} + 1;
  eager.output = output;
  eager.count = count;
  eager.dtype = request.dtype;
  eager.op = EffectiveReduction(cached, size).op;
  return eager;
}

namespace {

class Allreduce : public Collective {
 public:
  explicit Allreduce(OpType type = OpType::ALLREDUCE) : Collective(type) {}

  Status CheckRequest(const Request& request, const TensorTableEntry& entry,
                      const EnqueueContext& context) const override {
    const TensorView& in = entry.input;
    const TensorView& out = entry.output;
    if (out.dtype != in.dtype || out.shape != in.shape) {
      return Status::InvalidArgument("allreduce output for '" + entry.name + "' must have the input's dtype and shape");
    }
    if (out.device != in.device) {
      return Status::InvalidArgument("allreduce output for '" + entry.name + "' must be on the input's device");
    }
    Status gpu = CheckGpuReduction(in, "allreduce");
    if (!gpu.ok()) return gpu;
    if (in.dtype == DataType::BOOL &&
        (request.prescale_factor != 1.0 || request.postscale_factor != 1.0 || request.reduce_op == ReduceOp::AVERAGE)) {
      return Status::InvalidArgument(
          "bool tensors support allreduce with Sum, Min, Max or Product and no scaling only");
    }
    return Status::OK();
  }

  std::string CheckAgreement(const std::vector<Request>& requests, const AgreementContext&) const override {
    std::string mismatch = agreement::SameShape(requests);
    return mismatch.empty() ? agreement::SameScaleAndOp(requests) : mismatch;
  }

  void Describe(const std::vector<Request>& requests, int, Response* response) const override {
    response->tensor_sizes.push_back(NumElements(requests[0].shape));
  }

  bool cacheable() const override { return true; }
  bool joined_ranks_take_part() const override { return true; }

  void Execute(ExecutionContext& ctx) const override {
    const Response& response = ctx.response;
    auto& entries = ctx.entries;
    DeviceExecutor& executor = ctx.executor;
    Communicator& comm = ctx.communicator;
    const DataType dtype = response.dtype;
    const size_t element_size = DataTypeSize(dtype);
    const Reduction reduction = EffectiveReduction(response, comm.size());
    const bool complete =
        std::none_of(entries.begin(), entries.end(), [](TensorTableEntry* e) { return e == nullptr; });

    int64_t count = 0;
    for (int64_t n : response.tensor_sizes) count += n;
    if (response.settled) {
      // The cache round carried the data and left the reduction in the output (eager allreduce,
      // engine/controller.h).
      if (reduction.postscale != 1.0) executor.Scale(entries[0]->output.data, count, dtype, reduction.postscale);
      return;
    }
    const bool in_float32 = type() != OpType::ADASUM && AccumulatesInFloat32(dtype, response.device);
    if (type() != OpType::ADASUM && !in_float32 && response.prescale_factor == 1.0 && complete &&
        comm.SupportsPieces(count * static_cast<int64_t>(element_size), entries.size())) {
      AllreducePiecesOptions options;
      options.pieces.reserve(entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        options.pieces.push_back({entries[i]->input.data, entries[i]->output.data, response.tensor_sizes[i]});
      }
      options.dtype = dtype;
      options.op = reduction.op;
      options.scale = reduction.postscale;
      ScopedActivity activity(ctx.timeline, response.names, ActivityOf(ctx, "ALLREDUCE").c_str());
      comm.AllreducePieces(options);
      return;
    }

    // Fused tensors lie at offsets aligned for the device in the fusion buffer.
    const size_t alignment = executor.fusion_alignment();
    auto aligned = [alignment](size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; };
    const bool direct = entries.size() == 1 && entries[0] != nullptr;
    void* buffer;
    if (direct) {
      TensorTableEntry& e = *entries[0];
      executor.Copy({{e.input.data, e.output.data, e.input.num_bytes()}});
      buffer = e.output.data;
    } else {
      ScopedActivity activity(ctx.timeline, response.names, "MEMCPY_IN_FUSION_BUFFER");
      size_t total = 0;
      for (int64_t n : response.tensor_sizes) total += aligned(static_cast<size_t>(n) * element_size);
      buffer = executor.FusionBuffer(total);
      std::vector<DeviceCopy> copies;
      copies.reserve(entries.size());
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = static_cast<size_t>(response.tensor_sizes[i]) * element_size;
        char* slot = static_cast<char*>(buffer) + offset;
        if (entries[i]) {
          copies.push_back({entries[i]->input.data, slot, bytes});
        } else {
          executor.Zero(slot, bytes);
        }
        offset += aligned(bytes);
      }
      executor.Copy(copies);
      count = static_cast<int64_t>(total / element_size);
    }
    if (in_float32) {
      ScopedActivity activity(ctx.timeline, response.names, ActivityOf(ctx, "ALLREDUCE").c_str());
      AllreduceInFloat32(comm, static_cast<uint16_t*>(buffer), count, reduction.op, response.prescale_factor,
                         reduction.postscale);
    } else {
      if (response.prescale_factor != 1.0) executor.Scale(buffer, count, dtype, response.prescale_factor);
      if (type() == OpType::ADASUM) {
        ScopedActivity activity(ctx.timeline, response.names, "ADASUM_ALLREDUCE");
        AdasumAllreduce(comm, buffer, count, dtype);
      } else {
        ScopedActivity activity(ctx.timeline, response.names, ActivityOf(ctx, "ALLREDUCE").c_str());
        comm.Allreduce({buffer, count, dtype, reduction.op});
      }
      if (reduction.postscale != 1.0) executor.Scale(buffer, count, dtype, reduction.postscale);
    }
    if (!direct) {
      ScopedActivity activity(ctx.timeline, response.names, "MEMCPY_OUT_FUSION_BUFFER");
      std::vector<DeviceCopy> copies;
      copies.reserve(entries.size());
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = static_cast<size_t>(response.tensor_sizes[i]) * element_size;
        if (entries[i]) copies.push_back({static_cast<char*>(buffer) + offset, entries[i]->output.data, bytes});
        offset += aligned(bytes);
      }
      executor.Copy(copies);
    }
  }
};

class Adasum : public Allreduce {
 public:
  Adasum() : Allreduce(OpType::ADASUM) {}

  // Spec core.md §6.10: the global set only; on CPU tensors of floating point types, a
  // power-of-two number of ranks.
  Status CheckRequest(const Request& request, const TensorTableEntry& entry,
                      const EnqueueContext& context) const override {
    if (context.process_set_id != 0) {
      return Status::PreconditionError("Adasum is supported on the global process set only.");
    }
    const int size = context.global_size;
    if ((size & (size - 1)) != 0) {
      return Status::PreconditionError("Adasum on CPU tensors needs a power-of-two number of ranks; this job has " +
                                       std::to_string(size) + " (non-power-of-2 ranks unsupported).");
    }
    if (entry.input.device != kCpuDevice) {
      return Status::PreconditionError("Adasum is not supported on GPU tensors by this build of Horovod.");
    }
    const DataType dtype = entry.input.dtype;
    if (dtype != DataType::FLOAT16 && dtype != DataType::FLOAT32 && dtype != DataType::FLOAT64) {
      return Status::InvalidArgument(std::string("Adasum supports float16, float32 and float64 tensors; got ") +
                                     DataTypeName(dtype) + ".");
    }
    return Allreduce::CheckRequest(request, entry, context);
  }
};

const bool kRegistered = RegisterCollective(std::make_unique<Allreduce>()) &&
                         RegisterCollective(std::make_unique<Adasum>());

}  // namespace

}  // namespace horovod
