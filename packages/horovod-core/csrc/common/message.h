// Requests (what a rank wants to run) and responses (what the coordinator decided every rank runs),
// with their byte encoding for the control plane.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/tuned_parameters.h"
#include "common.h"

namespace horovod {

struct Request {
  int32_t rank = 0;  // set by the coordinator from the position of the rank's list; not sent
  OpType type = OpType::ALLREDUCE;
  DataType dtype = DataType::FLOAT32;
  std::string name;
  std::vector<int64_t> shape;
  int32_t root_rank = -1;
  ReduceOp reduce_op = ReduceOp::SUM;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t device = kCpuDevice;
  // Requests submitted together (grouped ops) share a group id (0: not grouped); with
  // HOROVOD_DISABLE_GROUP_FUSION only members of one group are fused together.
  int64_t group_id = 0;
  // ALLTOALL: rows sent to each member of the set (empty: equal split).
  std::vector<int64_t> splits;
};

// Whether `a` and `b` describe the same operation on this rank (everything but the rank).
bool SameOperation(const Request& a, const Request& b);

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;
  std::string shutdown_reason;  // why this rank asks to shut down ("" = hvd.shutdown())
  // Whether a caller of this rank is blocked waiting on an operation of the set (deadlock detection,
  // controller.h).
  bool waiting = false;
};

// One operation every rank executes, possibly covering several fused tensors.
struct Response {
  OpType type = OpType::ALLREDUCE;
  std::vector<std::string> names;
  std::string error_message;
  DataType dtype = DataType::FLOAT32;
  ReduceOp reduce_op = ReduceOp::SUM;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t root_rank = -1;
  int32_t device = kCpuDevice;
  int64_t group_id = 0;
  // ALLREDUCE, REDUCESCATTER: number of elements of each tensor. ALLGATHER: for each tensor, the
  // first dimension contributed by every member (names.size() * size entries, tensor-major).
  // ALLTOALL: the size x size matrix of rows sent, [sender * size + receiver]. JOIN: the global
  // rank that joined last. ADD_PROCESS_SET: the global ranks. REMOVE_PROCESS_SET: the set id.
  std::vector<int64_t> tensor_sizes;
  // Not serialized: this rank's cache round already carried the allreduce's data and left the
  // reduction (before the postscale) in the tensor's output (eager allreduce, controller.h).
  bool settled = false;
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::string shutdown_reason;
  // Whether some rank of the set has joined and not every rank has yet (known to every rank
  // after each negotiation round; joins change only in rounds).
  bool any_joined = false;
  // Autotune: new parameters published by global rank 0, applied by every rank of the global set
  // once this list is negotiated.
  std::optional<TunedParameters> parameters;
};

std::vector<char> Serialize(const RequestList& list);
RequestList DeserializeRequestList(const std::vector<char>& bytes);
std::vector<char> Serialize(const ResponseList& list);
ResponseList DeserializeResponseList(const std::vector<char>& bytes);

}  // namespace horovod
