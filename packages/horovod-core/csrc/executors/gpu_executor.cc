// The GPU executor of one device: every copy, zeroing and scaling is a kernel enqueued on
// Horovod's stream of the device through the NCCL plugin (backends/nccl/gpu_ops.h), and the
// communicator is the process set's NCCL communicator, so the collective runs on that stream too.
#include <algorithm>
#include <set>

#include "backends/nccl/gpu_ops.h"
#include "common/config.h"
#include "executors/device_executor.h"
#include "executors/gpu_error.h"

namespace horovod {

namespace {

// With batched copies (HOROVOD_BATCH_D2D_MEMCOPIES, default on) offsets of fused tensors in the
// device fusion buffer are rounded up to 16 bytes, so that the copy kernel moves 16 bytes per
// load (spec core.md §7); without, tensors lie back to back and each is one cudaMemcpyAsync.
constexpr size_t kGpuAlignment = 16;

class GpuExecutor : public DeviceExecutor {
 public:
  GpuExecutor(GpuOps& gpu, int device, bool batched) : gpu_(gpu), device_(device), batched_(batched) {}

  Communicator& CommunicatorOf(SetCommunicators& set) override {
    if (set.gpu_communicator) {
      if (set.gpu_device != device_) {
        throw GpuError("process set " + std::to_string(set.id) + " runs its GPU operations on device " +
                       std::to_string(set.gpu_device) + " of this rank, but a tensor is on device " +
                       std::to_string(device_) + "; Horovod uses one GPU per process (pin it with "
                       "torch.cuda.set_device(hvd.local_rank()))");
      }
      return *set.gpu_communicator;
    }
    // Bootstrap through the control plane: the set's rank 0 makes the NCCL id and broadcasts it.
    Communicator& control = *set.communicator;
    std::vector<char> id;
    if (control.rank() == 0) id = gpu_.UniqueId();
    control.BroadcastBytes(id, 0);
    set.gpu_communicator = gpu_.CreateCommunicator(id, control.rank(), control.size(), device_);
    set.gpu_device = device_;
    return *set.gpu_communicator;
  }

  void Run(const std::vector<TensorTableEntry*>& entries, const std::function<void()>& body) override {
    try {
      for (TensorTableEntry* e : entries) {
        if (e != nullptr) gpu_.WaitEvent(device_, e->ready_event);
      }
      body();
      // The framework's streams wait (on the GPU) for Horovod's; this thread waits (on the CPU)
      // too, so that a failed kernel or collective fails the handle and the handle's completion
      // means the results are in place.
      std::set<intptr_t> streams;
      for (TensorTableEntry* e : entries) {
        if (e != nullptr) streams.insert(e->stream);
      }
      for (intptr_t stream : streams) gpu_.SignalStream(device_, stream);
      gpu_.Synchronize(device_);
    } catch (const GpuError&) {
      throw;
    } catch (const std::logic_error&) {
      throw;
    } catch (const std::exception& e) {
      throw GpuError(e.what());
    }
  }

  void Copy(const std::vector<DeviceCopy>& copies) override {
    std::vector<DeviceCopy> moves;
    moves.reserve(copies.size());
    for (const DeviceCopy& c : copies) {
      if (c.src != c.dst) moves.push_back(c);
    }
    if (moves.empty()) return;
    if (batched_) {
      gpu_.BatchedCopy(device_, moves);
    } else {
      gpu_.Copy(device_, moves);
    }
  }
  void Zero(void* data, size_t bytes) override { gpu_.Zero(device_, data, bytes); }
  void Scale(void* data, int64_t count, DataType dtype, double factor) override {
    gpu_.Scale(device_, data, count, dtype, factor);
  }
  std::shared_ptr<OutputBuffer> Allocate(DataType dtype, std::vector<int64_t> shape) override {
    const size_t bytes = static_cast<size_t>(NumElements(shape)) * DataTypeSize(dtype);
    std::shared_ptr<void> memory = gpu_.Allocate(device_, bytes);
    return std::make_shared<OutputBuffer>(dtype, std::move(shape), device_, std::move(memory));
  }
  void* FusionBuffer(size_t bytes) override { return gpu_.FusionBuffer(device_, std::max(bytes, kGpuAlignment)); }
  size_t fusion_alignment() const override { return batched_ ? kGpuAlignment : 1; }

 private:
  GpuOps& gpu_;
  const int device_;
  const bool batched_;
};

}  // namespace

std::unique_ptr<DeviceExecutor> MakeGpuExecutor(GpuOps& gpu, int device, bool batched_copies) {
  return std::make_unique<GpuExecutor>(gpu, device, batched_copies);
}

}  // namespace horovod
