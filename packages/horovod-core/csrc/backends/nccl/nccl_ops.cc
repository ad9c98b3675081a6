// The NCCL plugin (_nccl_ops.so): implements GpuOps (gpu_ops.h) and its communicator with the CUDA runtime
// (linked statically) and NCCL (libnccl.so.2, found through this library's RUNPATH). The core
// loads it with dlopen and calls horovod_nccl_create_ops once per process.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/nccl/gpu_ops.h"
#include "gpu_kernels.h"

namespace horovod {
namespace {

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
  }
}

void Check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) {
    std::string detail;
    if (const char* last = ncclGetLastError(nullptr)) detail = last;
    throw std::runtime_error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(status) +
                             (detail.empty() ? "" : " (" + detail + ")"));
  }
}

// Makes `device` current. With `restore` (on a framework's thread, which keeps its own current
// device) the previous device is made current again at the end of the scope, if it changed. The
// engine's thread is Horovod's: it keeps the device, since making device 0 current again on a
// thread that never used it would create a CUDA context there (memory on GPU 0 for every rank).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool restore = false) {
    Check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      Check(cudaSetDevice(device), "cudaSetDevice");
      restore_ = restore;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

ncclDataType_t ToNccl(DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return ncclUint8;
    case DataType::INT8: return ncclInt8;
    case DataType::INT32: return ncclInt32;
    case DataType::INT64: return ncclInt64;
    case DataType::FLOAT16: return ncclFloat16;
    case DataType::BFLOAT16: return ncclBfloat16;
    case DataType::FLOAT32: return ncclFloat32;
    case DataType::FLOAT64: return ncclFloat64;
    default:
      throw std::runtime_error(std::string("NCCL has no reduction for ") + DataTypeName(dtype) +
                               " tensors; use uint8, int8, int32, int64, float16, bfloat16, float32 or float64");
  }
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return ncclSum;
    case ReduceOp::MIN: return ncclMin;
    case ReduceOp::MAX: return ncclMax;
    case ReduceOp::PRODUCT: return ncclProd;
    default: throw std::runtime_error(std::string("NCCL cannot reduce with ") + ReduceOpName(op));
  }
}

// A cudaStream_t travels as an integer through the core and the bindings.
cudaStream_t AsStream(intptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

// Per device: Horovod's stream and fusion buffer.
struct DeviceState {
  cudaStream_t stream = nullptr;
  void* fusion = nullptr;
  size_t fusion_capacity = 0;
};

class NcclOps;

// The data collectives of one process set's members on their devices, enqueued on Horovod's stream;
// the control-plane operations keep Communicator's defaults (unsupported).
class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream)
      : Communicator(rank, size), comm_(comm), device_(device), stream_(stream) {}
  ~NcclCommunicator() override {
    DeviceGuard guard(device_);
    ncclCommDestroy(comm_);
  }
  const char* name() const override { return "nccl"; }

  void Allreduce(const AllreduceOptions& options) override {
    DeviceGuard guard(device_);
    Check(ncclAllReduce(options.buffer, options.buffer, static_cast<size_t>(options.count), ToNccl(options.dtype),
                        ToNccl(options.op), comm_, stream_),
          "ncclAllReduce");
  }

  void Allgather(const AllgatherOptions& options) override {
    DeviceGuard guard(device_);
    const void* input = options.input;
    void* output = options.output;
    const std::vector<int64_t>& bytes_per_rank = options.bytes_per_rank;
    bool equal = true;
    for (int64_t b : bytes_per_rank) equal = equal && b == bytes_per_rank[0];
    if (equal) {
      Check(ncclAllGather(input, output, static_cast<size_t>(bytes_per_rank[0]), ncclUint8, comm_, stream_),
            "ncclAllGather");
      return;
    }
    // Uneven first dimensions: one broadcast per rank into its slot of the output, fused by NCCL
    // into one group.
    Check(ncclGroupStart(), "ncclGroupStart");
    char* out = static_cast<char*>(output);
    for (int r = 0; r < size_; ++r) {
      Check(ncclBroadcast(r == rank_ ? input : out, out, static_cast<size_t>(bytes_per_rank[r]), ncclUint8, r, comm_,
                          stream_),
            "ncclBroadcast");
      out += bytes_per_rank[r];
    }
    Check(ncclGroupEnd(), "ncclGroupEnd");
  }

  void Broadcast(const BroadcastOptions& options) override {
    DeviceGuard guard(device_);
    Check(ncclBroadcast(options.buffer, options.buffer, static_cast<size_t>(options.bytes), ncclUint8, options.root,
                        comm_, stream_),
          "ncclBroadcast");
  }

  void Alltoall(const AlltoallOptions& options) override {
    DeviceGuard guard(device_);
    const std::vector<int64_t>& send_bytes = options.send_bytes;
    const std::vector<int64_t>& recv_bytes = options.recv_bytes;
    const char* in = static_cast<const char*>(options.input);
    char* out = static_cast<char*>(options.output);
    Check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      if (send_bytes[r] > 0) {
        Check(ncclSend(in, static_cast<size_t>(send_bytes[r]), ncclUint8, r, comm_, stream_), "ncclSend");
      }
      if (recv_bytes[r] > 0) {
        Check(ncclRecv(out, static_cast<size_t>(recv_bytes[r]), ncclUint8, r, comm_, stream_), "ncclRecv");
      }
      in += send_bytes[r];
      out += recv_bytes[r];
    }
    Check(ncclGroupEnd(), "ncclGroupEnd");
  }

  void Reducescatter(const ReducescatterOptions& options) override {
    DeviceGuard guard(device_);
    const std::vector<int64_t>& counts = options.counts;
    const DataType dtype = options.dtype;
    const ReduceOp op = options.op;
    bool equal = true;
    for (int64_t c : counts) equal = equal && c == counts[0];
    const size_t element = DataTypeSize(dtype);
    char* data = static_cast<char*>(options.buffer);
    if (equal && counts[0] > 0) {
      // In place: NCCL's receive buffer may be the sender's own block.
      Check(ncclReduceScatter(data, data + rank_ * counts[0] * element, static_cast<size_t>(counts[0]), ToNccl(dtype),
                              ToNccl(op), comm_, stream_),
            "ncclReduceScatter");
      return;
    }
    // Uneven blocks: one reduction per block to its owner, in one group.
    Check(ncclGroupStart(), "ncclGroupStart");
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      if (counts[r] > 0) {
        char* block = data + offset * element;
        Check(ncclReduce(block, block, static_cast<size_t>(counts[r]), ToNccl(dtype), ToNccl(op), r, comm_, stream_),
              "ncclReduce");
      }
      offset += counts[r];
    }
    Check(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_;
};

class NcclOps : public GpuOps {
 public:
  int NcclVersion() override {
    int version = 0;
    Check(ncclGetVersion(&version), "ncclGetVersion");
    return version;
  }

  GpuEvent RecordEvent(int device, intptr_t stream) override {
    DeviceGuard guard(device, /*restore=*/true);
    cudaEvent_t event;
    Check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    GpuEvent owned(static_cast<void*>(event), [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
    Check(cudaEventRecord(event, AsStream(stream)), "cudaEventRecord");
    return owned;
  }

  void WaitEvent(int device, const GpuEvent& event) override {
    if (!event) return;
    DeviceGuard guard(device);
    Check(cudaStreamWaitEvent(State(device).stream, static_cast<cudaEvent_t>(event.get()), 0), "cudaStreamWaitEvent");
  }

  void SignalStream(int device, intptr_t stream) override {
    DeviceGuard guard(device);
    GpuEvent done = RecordEvent(device, reinterpret_cast<intptr_t>(State(device).stream));
    Check(cudaStreamWaitEvent(AsStream(stream), static_cast<cudaEvent_t>(done.get()), 0), "cudaStreamWaitEvent");
  }

  void Synchronize(int device) override {
    DeviceGuard guard(device);
    Check(cudaStreamSynchronize(State(device).stream), "cudaStreamSynchronize");
  }

  std::shared_ptr<void> Allocate(int device, size_t bytes) override {
    DeviceGuard guard(device);
    void* data = nullptr;
    // A zero-byte result still needs a distinct pointer for DLPack.
    Check(cudaMalloc(&data, bytes == 0 ? 16 : bytes), "cudaMalloc");
    // Freed on whichever thread drops the last reference (usually the framework's); with unified
    // addressing cudaFree finds the pointer's device itself. It may run at interpreter exit,
    // after the CUDA runtime began unloading: errors are ignored.
    return std::shared_ptr<void>(data, [](void* p) { cudaFree(p); });
  }

  void* FusionBuffer(int device, size_t bytes) override {
    DeviceState& state = State(device);
    if (bytes > state.fusion_capacity) {
      DeviceGuard guard(device);
      if (state.fusion != nullptr) {
        // The old buffer may still be read by work on Horovod's stream.
        Check(cudaStreamSynchronize(state.stream), "cudaStreamSynchronize");
        Check(cudaFree(state.fusion), "cudaFree");
        state.fusion = nullptr;
        state.fusion_capacity = 0;
      }
      Check(cudaMalloc(&state.fusion, bytes), "cudaMalloc (fusion buffer)");
      state.fusion_capacity = bytes;
    }
    return state.fusion;
  }

  void BatchedCopy(int device, const std::vector<DeviceCopy>& copies) override {
    DeviceGuard guard(device);
    Check(gpu::BatchedCopy(copies.data(), copies.size(), State(device).stream), "the batched copy kernel");
  }

  void Copy(int device, const std::vector<DeviceCopy>& copies) override {
    DeviceGuard guard(device);
    for (const DeviceCopy& c : copies) {
      Check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, State(device).stream), "cudaMemcpyAsync");
    }
  }

  void Zero(int device, void* data, size_t bytes) override {
    DeviceGuard guard(device);
    Check(cudaMemsetAsync(data, 0, bytes, State(device).stream), "cudaMemsetAsync");
  }

  void Scale(int device, void* data, int64_t count, DataType dtype, double factor) override {
    DeviceGuard guard(device);
    Check(gpu::Scale(data, count, dtype, factor, State(device).stream), "the scaling kernel");
  }

  std::vector<char> UniqueId() override {
    ncclUniqueId id;
    Check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
  }

  std::unique_ptr<Communicator> CreateCommunicator(const std::vector<char>& unique_id, int rank, int size,
                                                   int device) override {
    ncclUniqueId id;
    if (unique_id.size() != sizeof(id.internal)) {
      throw std::runtime_error("NCCL unique id of " + std::to_string(unique_id.size()) + " bytes, expected " +
                               std::to_string(sizeof(id.internal)) + " (ranks built against different NCCLs?)");
    }
    std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
    DeviceGuard guard(device);
    cudaStream_t stream = State(device).stream;
    ncclComm_t comm;
    Check(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
    return std::make_unique<NcclCommunicator>(comm, rank, size, device, stream);
  }

  void Release() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [device, state] : devices_) {
      cudaSetDevice(device);
      if (state.stream != nullptr) cudaStreamSynchronize(state.stream);
      if (state.fusion != nullptr) cudaFree(state.fusion);
      if (state.stream != nullptr) cudaStreamDestroy(state.stream);
    }
    devices_.clear();
  }

 private:
  // Creates Horovod's stream of `device` on first use. Non-blocking: it does not synchronise with
  // the legacy default stream; ordering with the framework goes through events only.
  DeviceState& State(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    DeviceState& state = devices_[device];
    if (state.stream == nullptr) {
      DeviceGuard guard(device);
      Check(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    }
    return state;
  }

  std::mutex mu_;
  std::map<int, DeviceState> devices_;
};

}  // namespace
}  // namespace horovod

extern "C" __attribute__((visibility("default"))) horovod::GpuOps* horovod_nccl_create_ops(std::string* error) {
  try {
    int devices = 0;
    cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess) {
      *error = std::string("CUDA is not usable: ") + cudaGetErrorString(status);
      return nullptr;
    }
    return new horovod::NcclOps();
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
