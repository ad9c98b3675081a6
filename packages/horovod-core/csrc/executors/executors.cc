#include "backends/nccl/gpu_ops.h"
#include "common/config.h"
#include "executors/device_executor.h"
#include "executors/gpu_error.h"

namespace horovod {

Executors::Executors(const Config& config) : config_(config), cpu_(MakeCpuExecutor()) {}

Executors::~Executors() = default;

DeviceExecutor& Executors::For(SetCommunicators& set, int32_t device, const std::vector<TensorTableEntry*>& entries) {
  // Only tensor operations carry a GPU device (control requests are made with kCpuDevice).
  if (device == kCpuDevice) return *cpu_;
  if (gpu_ == nullptr) {
    std::string why;
    gpu_ = LoadGpuOps(&why);
    if (gpu_ == nullptr) throw GpuError(why);
  }
  // This rank's device: its tensors', or (a joined rank without tensors) its communicator's.
  int on = -1;
  for (TensorTableEntry* e : entries) {
    if (e == nullptr) continue;
    if (on >= 0 && e->input.device != on) {
      throw GpuError("tensors of one fused operation are on GPUs " + std::to_string(on) + " and " +
                     std::to_string(e->input.device) + " of this rank; Horovod uses one GPU per process");
    }
    on = e->input.device;
  }
  if (on < 0) {
    if (!set.gpu_communicator) throw GpuError("a joined rank has no GPU to contribute zeros from");
    on = set.gpu_device;
  }
  std::unique_ptr<DeviceExecutor>& executor = gpus_[on];
  if (!executor) executor = MakeGpuExecutor(*gpu_, on, config_.batch_d2d_memcopies);
  return *executor;
}

bool RecordReadyEvents(std::vector<TensorTableEntry>& entries, intptr_t stream) {
  bool any = false;
  for (TensorTableEntry& entry : entries) {
    if (entry.input.device == kCpuDevice) continue;
    any = true;
    std::string why;
    GpuOps* gpu = LoadGpuOps(&why);
    if (gpu == nullptr) {
      throw EngineError(Status::PreconditionError("Cannot run '" + entry.name + "' on a GPU: " + why + "."));
    }
    entry.stream = stream;
    try {
      entry.ready_event = gpu->RecordEvent(entry.input.device, stream);
    } catch (const std::exception& e) {
      throw EngineError(Status::PreconditionError(e.what()));
    }
  }
  return any;
}

void Executors::Release() {
  if (gpu_ != nullptr) gpu_->Release();
}

}  // namespace horovod
