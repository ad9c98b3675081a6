// Tensors waiting for negotiation and the handles callers wait on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "message.h"

namespace horovod {

// A contiguous tensor owned by the caller, who keeps it alive until its handle completes.
struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::FLOAT32;
  std::vector<int64_t> shape;
  int32_t device = kCpuDevice;
  int64_t num_elements() const { return NumElements(shape); }
  size_t num_bytes() const { return static_cast<size_t>(num_elements()) * DataTypeSize(dtype); }
};

// A buffer the engine allocates for outputs whose shape is known only after negotiation
// (allgather, alltoall, reducescatter): 64-byte aligned host memory, or device memory of a GPU
// (from GpuOps::Allocate). It is handed to Python through DLPack and freed with its last owner.
class OutputBuffer {
 public:
  OutputBuffer(DataType dtype, std::vector<int64_t> shape);
  // Device memory `memory` of GPU `device`, at least num_bytes() long.
  OutputBuffer(DataType dtype, std::vector<int64_t> shape, int32_t device, std::shared_ptr<void> memory);
  ~OutputBuffer();
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;
  void* data() const { return data_; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int32_t device() const { return device_; }
  size_t num_bytes() const { return static_cast<size_t>(NumElements(shape_)) * DataTypeSize(dtype_); }

 private:
  void* data_ = nullptr;
  DataType dtype_;
  std::vector<int64_t> shape_;
  int32_t device_ = kCpuDevice;
  std::shared_ptr<void> device_memory_;
};

// Completion state of one handle, covering one tensor or a group submitted together. Completed by
// the background thread; waited on by any caller thread.
class HandleState {
 public:
  explicit HandleState(size_t num_tensors) : remaining_(num_tensors), outputs_(num_tensors) {}
  // The process set the handle's operations run on (set by Engine::Enqueue).
  int32_t process_set_id = 0;
  // Completes tensor `index` of the handle with its engine-allocated outputs (none where the caller
  // gave the output; alltoall: the output and the received splits).
  void Complete(size_t index, const Status& status, std::vector<std::shared_ptr<OutputBuffer>> outputs = {});
  // Completes an operation whose result is one integer (join, process set registration).
  void CompleteWithValue(size_t index, int64_t value);
  bool done();
  // Waits up to `timeout`; returns whether the handle is done.
  bool WaitFor(std::chrono::milliseconds timeout);
  Status status();
  std::vector<std::vector<std::shared_ptr<OutputBuffer>>> outputs();
  bool has_value();
  int64_t value();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t remaining_;
  Status status_;
  std::vector<std::vector<std::shared_ptr<OutputBuffer>>> outputs_;
  bool has_value_ = false;
  int64_t value_ = 0;
};

struct TensorTableEntry {
  std::string name;
  TensorView input;
  TensorView output;  // caller-provided output (may alias input); empty for allgather
  std::shared_ptr<HandleState> handle;
  size_t index = 0;  // position within the handle's group
  // GPU tensors: the framework's stream (a cudaStream_t) and the event recorded on it when the
  // tensor was submitted (gpu_ops.h). Unused for CPU tensors.
  intptr_t stream = 0;
  std::shared_ptr<void> ready_event;
  uint64_t flight_id = 0;  // the flight recorder's record (0: none)
};

// Requests submitted since the last cycle plus every entry not yet executed, keyed by name.
class TensorQueue {
 public:
  // Adds a group atomically. Throws EngineError: INVALID_ARGUMENT when a name is already in flight
  // on this rank, or the close status when the queue was closed by shutdown or a failure.
  void Add(std::vector<Request> requests, std::vector<TensorTableEntry> entries);
  std::vector<Request> PopRequests();
  bool Empty();
  // Where the input and output data of the entry for `name` lie, the entry left queued; false when
  // this rank has none. They stay valid while the entry is queued (until TryTake or Close, both of
  // which run under the engine's cycle, as does the caller of Peek).
  bool Peek(const std::string& name, const void** input, void** output);
  // Removes the entry for `name` into `*entry`; false when this rank has none (a joined rank).
  bool TryTake(const std::string& name, TensorTableEntry* entry);
  // Refuses further Adds with `status` and returns everything still queued.
  std::vector<TensorTableEntry> Close(const Status& status);

 private:
  std::mutex mu_;
  std::unordered_map<std::string, TensorTableEntry> table_;
  std::vector<Request> pending_;
  bool closed_ = false;
  Status close_status_;
};

}  // namespace horovod
