// The CPU executor: host memory, the calling (background) thread does the work.
#include <cstring>

#include "common/reduction.h"
#include "executors/device_executor.h"

namespace horovod {

namespace {

class CpuExecutor : public DeviceExecutor {
 public:
  Communicator& CommunicatorOf(SetCommunicators& set) override { return *set.communicator; }
  void Run(const std::vector<TensorTableEntry*>&, const std::function<void()>& body) override { body(); }
  void Copy(const std::vector<DeviceCopy>& copies) override {
    for (const DeviceCopy& c : copies) {
      if (c.src != c.dst) std::memcpy(c.dst, c.src, c.bytes);
    }
  }
  void Zero(void* data, size_t bytes) override { std::memset(data, 0, bytes); }
  void Scale(void* data, int64_t count, DataType dtype, double factor) override {
    horovod::Scale(data, count, dtype, factor);
  }
  std::shared_ptr<OutputBuffer> Allocate(DataType dtype, std::vector<int64_t> shape) override {
    return std::make_shared<OutputBuffer>(dtype, std::move(shape));
  }
  void* FusionBuffer(size_t bytes) override { return fusion_buffer_.Get(bytes); }
  size_t fusion_alignment() const override { return 1; }

 private:
  horovod::FusionBuffer fusion_buffer_;
};

}  // namespace

std::unique_ptr<DeviceExecutor> MakeCpuExecutor() { return std::make_unique<CpuExecutor>(); }

}  // namespace horovod
