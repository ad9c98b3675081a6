// Device executors: the memory operations a collective needs around its communicator calls
// (copies into and out of the fusion buffer, zeroing, scaling, output allocation), for one kind of
// device. The collectives (csrc/collectives/) are written once against this interface; the CPU
// executor works on host memory, the GPU executor (executors/gpu_executor.cc) enqueues kernels on
// Horovod's stream of one device through the NCCL plugin (backends/nccl/gpu_ops.h). Nothing outside
// csrc/executors/ asks which device a tensor is on.
//
// Used by the thread running the engine's cycle only (engine.h, "Threading contract"); the GPU
// executors by the background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backends/communicator.h"
#include "common/common.h"
#include "common/fusion.h"
#include "common/tensor_queue.h"

namespace horovod {

struct Config;
class GpuOps;

// The communicators of one process set on this rank, all the executors need of a set (the
// engine's ProcessSet, engine/process_sets.h, is one): the executors live below the engine and
// see only this.
struct SetCommunicators {
  int32_t id = 0;
  // The set's CPU backend (its rank and size are this rank's in the set); null on a non-member.
  std::unique_ptr<Communicator> communicator;
  // The NCCL communicator of the members and its device, created by the first GPU operation on
  // the set (the background thread only: caller execution is off once GPU tensors are submitted;
  // gpu_executor.cc).
  std::unique_ptr<Communicator> gpu_communicator;
  int gpu_device = -1;
};

class DeviceExecutor {
 public:
  virtual ~DeviceExecutor() = default;

  // The communicator of process set `set` on this device: the set's CPU backend, or its NCCL
  // communicator (created on first use, through the set's control plane).
  virtual Communicator& CommunicatorOf(SetCommunicators& set) = 0;
  // Runs `body`, the execution of one response over `entries` (null entries are skipped): first
  // makes the inputs ready to read (GPU: waits for the framework's stream events), afterwards makes
  // the results visible to the framework before returning (GPU: the framework's streams wait for
  // Horovod's, and this thread waits for Horovod's stream, so that a failed kernel or collective
  // throws here). GPU failures are thrown as GpuError (gpu_error.h).
  virtual void Run(const std::vector<TensorTableEntry*>& entries, const std::function<void()>& body) = 0;

  // All `copies` (one kernel launch where the device batches them). Copies onto themselves are
  // skipped.
  virtual void Copy(const std::vector<DeviceCopy>& copies) = 0;
  virtual void Zero(void* data, size_t bytes) = 0;
  // data[i] *= factor for `count` elements of `dtype` (integers round toward zero).
  virtual void Scale(void* data, int64_t count, DataType dtype, double factor) = 0;
  // An engine-allocated output on this device.
  virtual std::shared_ptr<OutputBuffer> Allocate(DataType dtype, std::vector<int64_t> shape) = 0;
  // The device's persistent fusion buffer, grown to at least `bytes` (contents unspecified).
  virtual void* FusionBuffer(size_t bytes) = 0;
  // Offsets of fused tensors in the fusion buffer are multiples of this many bytes.
  virtual size_t fusion_alignment() const = 0;
};

// The executors of one engine: the CPU one, and one per GPU once a GPU tensor was executed.
class Executors {
 public:
  explicit Executors(const Config& config);
  ~Executors();
  // The executor of a response's tensors: the CPU's for host tensors; for GPU tensors, that of
  // their device (a joined rank without tensors uses its set's NCCL communicator's device),
  // loading the NCCL plugin on first use. Throws GpuError when it cannot be loaded or the tensors
  // of one operation are on different GPUs.
  DeviceExecutor& For(SetCommunicators& set, int32_t device, const std::vector<TensorTableEntry*>& entries);
  // Releases device resources (streams, events, fusion buffers) on the background thread before
  // it exits.
  void Release();

 private:
  const Config& config_;
  std::unique_ptr<DeviceExecutor> cpu_;
  GpuOps* gpu_ = nullptr;  // the NCCL plugin, once loaded
  std::map<int, std::unique_ptr<DeviceExecutor>> gpus_;
};

// Caller's thread, at enqueue: for GPU tensors, records on the framework's `stream` the event the
// background thread waits for before reading them (loading the NCCL plugin on first use). Throws
// EngineError(PRECONDITION_ERROR) when GPU tensors cannot be used. Nothing happens for CPU tensors.
// Returns whether any entry is on a GPU.
bool RecordReadyEvents(std::vector<TensorTableEntry>& entries, intptr_t stream);

// The executors themselves (cpu_executor.cc, gpu_executor.cc). `gpu`: the NCCL plugin's
// operations; `batched_copies`: HOROVOD_BATCH_D2D_MEMCOPIES.
std::unique_ptr<DeviceExecutor> MakeCpuExecutor();
std::unique_ptr<DeviceExecutor> MakeGpuExecutor(GpuOps& gpu, int device, bool batched_copies);

}  // namespace horovod
