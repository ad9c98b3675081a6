// The control plane's byte encoding: what one rank serializes, another reads back unchanged.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>

#include "common/message.h"

namespace horovod {
namespace {

Request FullRequest(const std::string& name) {
  Request r;
  r.type = OpType::ALLTOALL;
  r.dtype = DataType::BFLOAT16;
  r.name = name;
  r.shape = {6, 0, 3};
  r.root_rank = 2;
  r.reduce_op = ReduceOp::PRODUCT;
  r.prescale_factor = 0.25;
  r.postscale_factor = -3.5;
  r.device = 1;
  r.group_id = 1234567890123LL;
  r.splits = {1, 0, 5};
  return r;
}

TEST(Message, RequestListRoundTrip) {
  RequestList list;
  list.shutdown = true;
  list.shutdown_reason = "rank 3 lost its peer";
  list.waiting = true;
  list.requests.push_back(FullRequest("grad/layer1"));
  list.requests.push_back(FullRequest(std::string("with\0nul and \xc3\xa9", 15)));
  list.requests.push_back(Request());  // every field at its default
  list.requests[0].rank = 7;           // filled in by the coordinator, never sent

  RequestList back = DeserializeRequestList(Serialize(list));
  EXPECT_TRUE(back.shutdown);
  EXPECT_EQ(back.shutdown_reason, list.shutdown_reason);
  EXPECT_TRUE(back.waiting);
  ASSERT_EQ(back.requests.size(), list.requests.size());
  for (size_t i = 0; i < list.requests.size(); ++i) {
    EXPECT_TRUE(SameOperation(back.requests[i], list.requests[i])) << "request " << i;
    EXPECT_EQ(back.requests[i].name, list.requests[i].name);
  }
  EXPECT_EQ(back.requests[0].rank, 0);
}

TEST(Message, EmptyListsRoundTrip) {
  RequestList requests = DeserializeRequestList(Serialize(RequestList()));
  EXPECT_FALSE(requests.shutdown);
  EXPECT_FALSE(requests.waiting);
  EXPECT_TRUE(requests.requests.empty());
  ResponseList responses = DeserializeResponseList(Serialize(ResponseList()));
  EXPECT_FALSE(responses.shutdown);
  EXPECT_FALSE(responses.any_joined);
  EXPECT_FALSE(responses.parameters.has_value());
  EXPECT_TRUE(responses.responses.empty());
}

TEST(Message, ResponseListRoundTrip) {
  ResponseList list;
  list.shutdown = true;
  list.shutdown_reason = "stalled";
  list.any_joined = true;
  Response fused;
  fused.type = OpType::ALLREDUCE;
  fused.names = {"a", "b", ""};
  fused.dtype = DataType::FLOAT16;
  fused.reduce_op = ReduceOp::MAX;
  fused.prescale_factor = 2.0;
  fused.postscale_factor = 0.5;
  fused.root_rank = 1;
  fused.device = 3;
  fused.group_id = -9;
  fused.tensor_sizes = {10, 0, 1LL << 40};
  Response error;
  error.type = OpType::ERROR;
  error.names = {"bad"};
  error.error_message = "Mismatched data types";
  list.responses = {fused, error};
  TunedParameters p;
  p.fusion_threshold_bytes = 64 << 20;
  p.cycle_time_ms = 2.5;
  p.cache_enabled = true;
  p.hierarchical_allgather = true;
  p.tuning = true;
  list.parameters = p;

  ResponseList back = DeserializeResponseList(Serialize(list));
  EXPECT_TRUE(back.shutdown);
  EXPECT_EQ(back.shutdown_reason, "stalled");
  EXPECT_TRUE(back.any_joined);
  ASSERT_TRUE(back.parameters.has_value());
  EXPECT_TRUE(*back.parameters == p);
  ASSERT_EQ(back.responses.size(), 2u);
  const Response& f = back.responses[0];
  EXPECT_EQ(f.type, OpType::ALLREDUCE);
  EXPECT_EQ(f.names, fused.names);
  EXPECT_EQ(f.dtype, DataType::FLOAT16);
  EXPECT_EQ(f.reduce_op, ReduceOp::MAX);
  EXPECT_EQ(f.prescale_factor, 2.0);
  EXPECT_EQ(f.postscale_factor, 0.5);
  EXPECT_EQ(f.root_rank, 1);
  EXPECT_EQ(f.device, 3);
  EXPECT_EQ(f.group_id, -9);
  EXPECT_EQ(f.tensor_sizes, fused.tensor_sizes);
  EXPECT_EQ(back.responses[1].type, OpType::ERROR);
  EXPECT_EQ(back.responses[1].names, error.names);
  EXPECT_EQ(back.responses[1].error_message, error.error_message);
}

TEST(Message, TruncatedBytesThrow) {
  RequestList list;
  list.requests.push_back(FullRequest("x"));
  std::vector<char> bytes = Serialize(list);
  for (size_t cut : {size_t{0}, size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    std::vector<char> truncated(bytes.begin(), bytes.begin() + cut);
    EXPECT_THROW(DeserializeRequestList(truncated), std::runtime_error) << "cut at " << cut;
  }
  ResponseList responses;
  responses.responses.resize(1);
  responses.responses[0].names = {"y"};
  std::vector<char> response_bytes = Serialize(responses);
  response_bytes.pop_back();
  EXPECT_THROW(DeserializeResponseList(response_bytes), std::runtime_error);
}

TEST(Message, SameOperationComparesEveryFieldButRank) {
  const Request base = FullRequest("t");
  Request other = base;
  other.rank = 5;
  EXPECT_TRUE(SameOperation(base, other));
  std::vector<std::function<void(Request&)>> changes = {
      [](Request& r) { r.type = OpType::ALLGATHER; },   [](Request& r) { r.dtype = DataType::FLOAT32; },
      [](Request& r) { r.name = "u"; },                      [](Request& r) { r.shape[2] = 4; },
      [](Request& r) { r.root_rank = 0; },                   [](Request& r) { r.reduce_op = ReduceOp::SUM; },
      [](Request& r) { r.prescale_factor = 1.0; },           [](Request& r) { r.postscale_factor = 1.0; },
      [](Request& r) { r.device = kCpuDevice; },             [](Request& r) { r.group_id = 0; },
      [](Request& r) { r.splits = {2, 2, 2}; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    Request changed = base;
    changes[i](changed);
    EXPECT_FALSE(SameOperation(base, changed)) << "change " << i;
  }
}

}  // namespace
}  // namespace horovod
