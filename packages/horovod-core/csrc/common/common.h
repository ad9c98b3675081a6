// Types shared by every part of the engine: data types, reduce ops, operation types and Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace horovod {

// Values match upstream's engine enum (spec core.md §4); BFLOAT16 is our addition.
enum class DataType : int32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, INT32 = 4, INT64 = 5,
  FLOAT16 = 6, FLOAT32 = 7, FLOAT64 = 8, BOOL = 9, BFLOAT16 = 10,
};

// Values match spec core.md §3 (hvd.Average == 0, ...).
enum class ReduceOp : int32_t { AVERAGE = 0, SUM = 1, ADASUM = 2, MIN = 3, MAX = 4, PRODUCT = 5 };

// The one operation type of requests and responses (csrc/collectives/ holds one implementation
// per type): the collective types of spec core.md §11.2, ERROR (a response only: the ranks
// disagreed, and every rank fails the operation), then the engine's own bookkeeping operations:
// registering and removing a process set are negotiated on the global set like any collective, so
// that every rank applies them at the same point of its operation sequence.
enum class OpType : int32_t {
  ALLREDUCE = 0, ALLGATHER = 1, BROADCAST = 2, JOIN = 3, ADASUM = 4,
  ALLTOALL = 5, BARRIER = 6, REDUCESCATTER = 7, ERROR = 8, REDUCE = 9,
  ADD_PROCESS_SET = 100, REMOVE_PROCESS_SET = 101,
};

const char* DataTypeName(DataType dtype);
size_t DataTypeSize(DataType dtype);
const char* OpTypeName(OpType type);
const char* ReduceOpName(ReduceOp op);
std::string ShapeString(const std::vector<int64_t>& shape);
int64_t NumElements(const std::vector<int64_t>& shape);

// How an operation ended. The Python binding maps each type onto one exception class in one place
// (bindings.cc): INVALID_ARGUMENT -> ValueError, everything else -> HorovodInternalError.
enum class StatusType : int32_t { OK = 0, UNKNOWN_ERROR, PRECONDITION_ERROR, ABORTED, INVALID_ARGUMENT };

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status UnknownError(std::string msg) { return Status(StatusType::UNKNOWN_ERROR, std::move(msg)); }
  static Status PreconditionError(std::string msg) {
    return Status(StatusType::PRECONDITION_ERROR, std::move(msg));
  }
  static Status Aborted(std::string msg) { return Status(StatusType::ABORTED, std::move(msg)); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusType::INVALID_ARGUMENT, std::move(msg));
  }
  bool ok() const { return type_ == StatusType::OK; }
  StatusType type() const { return type_; }
  const std::string& reason() const { return reason_; }

 private:
  Status(StatusType type, std::string reason) : type_(type), reason_(std::move(reason)) {}
  StatusType type_ = StatusType::OK;
  std::string reason_;
};

// Thrown on the caller's thread (enqueue, init) and translated to a Python exception by the binding.
class EngineError : public std::runtime_error {
 public:
  explicit EngineError(const Status& status) : std::runtime_error(status.reason()), status_(status) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// Device of a tensor as DLPack describes it; the CPU is device_type 1.
constexpr int32_t kCpuDevice = -1;

// One copy of `bytes` bytes from `src` to `dst` within one device's memory (the device executors,
// csrc/executors/, and the NCCL plugin's batched copy kernel).
struct DeviceCopy {
  const void* src;
  void* dst;
  size_t bytes;
};

}  // namespace horovod
