// The engine's view of GPU support: an abstract interface implemented by the NCCL plugin
// (_nccl_ops.so beside the core, nccl_ops.cc in this folder), which the core loads with dlopen
// (backends/plugin_loader.h) the first time a GPU tensor is submitted. The core itself never
// links CUDA or NCCL, and nothing here is touched for CPU tensors.
//
// Streams. Every call that enqueues GPU work does so on Horovod's own stream for the device (one
// per device, created on first use). The caller's thread records a "ready" event on the
// framework's stream when it submits a tensor (RecordEvent); the background thread makes
// Horovod's stream wait on it before reading the tensor (WaitEvent), runs the copies, scaling
// and collectives, then makes the framework's stream wait for Horovod's (SignalStream) and waits
// on the CPU for Horovod's stream (Synchronize) before it completes the handle, so that an error
// of CUDA or NCCL is reported through the handle.
//
// The plugin throws errors of CUDA or NCCL as std::runtime_error with their error string (its
// own type information is private to it); the GPU executor rethrows them as GpuError
// (executors/gpu_error.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/communicator.h"
#include "common/common.h"

namespace horovod {

// An event recorded on a stream, destroyed with its last owner.
using GpuEvent = std::shared_ptr<void>;

class GpuOps {
 public:
  virtual ~GpuOps() = default;
  // NCCL's version code of the library loaded at run time (e.g. 23203).
  virtual int NcclVersion() = 0;
  // Caller thread: an event recorded now on `stream` (a cudaStream_t of `device`; 0 is the legacy
  // default stream).
  virtual GpuEvent RecordEvent(int device, intptr_t stream) = 0;

  // Background thread only, from here on.
  virtual void WaitEvent(int device, const GpuEvent& event) = 0;
  // Makes `stream` wait (on the GPU) for the work enqueued so far on Horovod's stream.
  virtual void SignalStream(int device, intptr_t stream) = 0;
  // Blocks until Horovod's stream of `device` is idle; throws on a failed kernel or
  // collective.
  virtual void Synchronize(int device) = 0;
  // Device memory, freed (cudaFree) with its last owner; may be handed to Python.
  virtual std::shared_ptr<void> Allocate(int device, size_t bytes) = 0;
  // The device's persistent fusion buffer, grown to at least `bytes` (contents unspecified).
  virtual void* FusionBuffer(int device, size_t bytes) = 0;
  // All `copies` in one kernel launch on Horovod's stream.
  virtual void BatchedCopy(int device, const std::vector<DeviceCopy>& copies) = 0;
  // One cudaMemcpyAsync per copy (HOROVOD_BATCH_D2D_MEMCOPIES=0).
  virtual void Copy(int device, const std::vector<DeviceCopy>& copies) = 0;
  virtual void Zero(int device, void* data, size_t bytes) = 0;
  // data[i] *= factor for `count` elements of `dtype` (integers round toward zero, as on the CPU).
  virtual void Scale(int device, void* data, int64_t count, DataType dtype, double factor) = 0;
  // ncclGetUniqueId, as bytes to broadcast over the control plane.
  virtual std::vector<char> UniqueId() = 0;
  // ncclCommInitRank: collective over the members, which all pass the bytes of one UniqueId. The
  // communicator (named "nccl", communicator.h) serves the members, each rank on its own device:
  // all calls run on the engine's background thread, in the same order on every member, on
  // buffers in memory of `device` (the caller keeps track of which), enqueued on Horovod's stream
  // of it. It implements Allreduce, Allgather, Broadcast, Alltoall and Reducescatter; everything
  // else (the control plane stays the CPU communicator's) throws UnsupportedError.
  virtual std::unique_ptr<Communicator> CreateCommunicator(const std::vector<char>& unique_id, int rank, int size,
                                                           int device) = 0;
  // Destroys the streams, events and fusion buffers (communicators belong to their owners).
  virtual void Release() = 0;
};

// The NCCL version code this core was built with (0: built without NCCL), and whether with CUDA.
int NcclVersionBuilt();
bool CudaBuilt();
// The plugin's GpuOps (loaded once per process, never unloaded), or nullptr with *error saying
// why: built without NCCL, or the plugin or a library it needs (libnccl.so.2) cannot be loaded.
GpuOps* LoadGpuOps(std::string* error);

}  // namespace horovod
