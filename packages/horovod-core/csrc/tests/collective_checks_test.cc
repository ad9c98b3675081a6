// The collectives' own rules, each tested on its own (no ranks, no transport): the registry, the
// checks of one rank's request at enqueue (what the Python binding used to hold), the agreement
// building blocks, the response sizes, and the CPU executor and timeline helper the executions
// are written against.
#include <gtest/gtest.h>

#include <cstring>

#include "collectives/collective.h"
#include "common/reduction.h"
#include "executors/device_executor.h"

namespace horovod {
namespace {

Request Req(OpType type, DataType dtype, std::vector<int64_t> shape, ReduceOp op = ReduceOp::SUM) {
  Request r;
  r.type = type;
  r.dtype = dtype;
  r.name = "t";
  r.shape = std::move(shape);
  r.reduce_op = op;
  return r;
}

TensorTableEntry Entry(DataType dtype, std::vector<int64_t> shape, int32_t device = kCpuDevice) {
  TensorTableEntry e;
  e.name = "t";
  e.input.dtype = e.output.dtype = dtype;
  e.input.shape = e.output.shape = std::move(shape);
  e.input.device = e.output.device = device;
  return e;
}

struct Context {
  std::vector<int> ranks{0, 1, 2, 3};
  EnqueueContext context{0, &ranks, 4, true};
};

Status Check(const Request& r, const TensorTableEntry& e, const EnqueueContext& c) {
  return CollectiveFor(r.type).CheckRequest(r, e, c);
}

TEST(CollectiveRegistry, EveryOperationTypeHasItsCollective) {
  for (OpType type : {OpType::ALLREDUCE, OpType::ALLGATHER, OpType::BROADCAST, OpType::JOIN, OpType::ADASUM,
                      OpType::ALLTOALL, OpType::BARRIER, OpType::REDUCESCATTER, OpType::ADD_PROCESS_SET,
                      OpType::REMOVE_PROCESS_SET}) {
    EXPECT_EQ(CollectiveFor(type).type(), type) << OpTypeName(type);
    EXPECT_STREQ(CollectiveFor(type).name(), OpTypeName(type));
  }
  EXPECT_THROW(CollectiveFor(OpType::ERROR), std::logic_error);
}

TEST(CollectiveRegistry, CacheableAndJoinRules) {
  for (OpType type : {OpType::ALLREDUCE, OpType::ADASUM, OpType::ALLGATHER, OpType::BROADCAST, OpType::ALLTOALL,
                      OpType::REDUCESCATTER}) {
    EXPECT_TRUE(CollectiveFor(type).cacheable()) << OpTypeName(type);
  }
  for (OpType type : {OpType::JOIN, OpType::BARRIER, OpType::ADD_PROCESS_SET, OpType::REMOVE_PROCESS_SET}) {
    EXPECT_FALSE(CollectiveFor(type).cacheable()) << OpTypeName(type);
  }
  EXPECT_TRUE(CollectiveFor(OpType::ALLREDUCE).joined_ranks_take_part());
  EXPECT_TRUE(CollectiveFor(OpType::ADASUM).joined_ranks_take_part());
  EXPECT_FALSE(CollectiveFor(OpType::ALLGATHER).joined_ranks_take_part());
  EXPECT_FALSE(CollectiveFor(OpType::REDUCESCATTER).joined_ranks_take_part());
}

TEST(EnqueueChecks, AllreduceOutputMustMatchInput) {
  Context c;
  TensorTableEntry e = Entry(DataType::FLOAT32, {4});
  EXPECT_TRUE(Check(Req(OpType::ALLREDUCE, DataType::FLOAT32, {4}), e, c.context).ok());
  e.output.shape = {5};
  Status s = Check(Req(OpType::ALLREDUCE, DataType::FLOAT32, {4}), e, c.context);
  EXPECT_EQ(s.type(), StatusType::INVALID_ARGUMENT);
  EXPECT_NE(s.reason().find("dtype and shape"), std::string::npos) << s.reason();
  e = Entry(DataType::FLOAT32, {4});
  e.output.device = 0;
  EXPECT_EQ(Check(Req(OpType::ALLREDUCE, DataType::FLOAT32, {4}), e, c.context).type(), StatusType::INVALID_ARGUMENT);
}

TEST(EnqueueChecks, BoolAllreduceHasNoAverageOrScaling) {
  Context c;
  TensorTableEntry e = Entry(DataType::BOOL, {3});
  EXPECT_TRUE(Check(Req(OpType::ALLREDUCE, DataType::BOOL, {3}, ReduceOp::MAX), e, c.context).ok());
  EXPECT_EQ(Check(Req(OpType::ALLREDUCE, DataType::BOOL, {3}, ReduceOp::AVERAGE), e, c.context).type(),
            StatusType::INVALID_ARGUMENT);
  Request scaled = Req(OpType::ALLREDUCE, DataType::BOOL, {3});
  scaled.postscale_factor = 2.0;
  EXPECT_EQ(Check(scaled, e, c.context).type(), StatusType::INVALID_ARGUMENT);
}

TEST(EnqueueChecks, GpuReductionsOnlyOfTypesNcclReduces) {
  Context c;
  for (DataType dtype : {DataType::INT16, DataType::UINT16, DataType::BOOL}) {
    Status s = Check(Req(OpType::ALLREDUCE, dtype, {2}, ReduceOp::MAX), Entry(dtype, {2}, /*device=*/0), c.context);
    EXPECT_EQ(s.type(), StatusType::INVALID_ARGUMENT) << DataTypeName(dtype);
    EXPECT_NE(s.reason().find("NCCL"), std::string::npos) << s.reason();
  }
  EXPECT_TRUE(
      Check(Req(OpType::ALLREDUCE, DataType::BFLOAT16, {2}), Entry(DataType::BFLOAT16, {2}, 0), c.context).ok());
  // The same types on the CPU are fine.
  EXPECT_TRUE(Check(Req(OpType::ALLREDUCE, DataType::INT16, {2}), Entry(DataType::INT16, {2}), c.context).ok());
  Status rs = Check(Req(OpType::REDUCESCATTER, DataType::INT16, {2}), Entry(DataType::INT16, {2}, 0), c.context);
  EXPECT_NE(rs.reason().find("reducescatter of int16 GPU tensors"), std::string::npos) << rs.reason();
}

TEST(EnqueueChecks, AdasumRules) {
  Context c;
  TensorTableEntry e = Entry(DataType::FLOAT32, {8});
  const Request adasum = Req(OpType::ADASUM, DataType::FLOAT32, {8}, ReduceOp::ADASUM);
  EXPECT_TRUE(Check(adasum, e, c.context).ok());
  EnqueueContext on_set = c.context;
  on_set.process_set_id = 1;
  EXPECT_EQ(Check(adasum, e, on_set).type(), StatusType::PRECONDITION_ERROR);
  EnqueueContext three = c.context;
  three.global_size = 3;
  Status s = Check(adasum, e, three);
  EXPECT_EQ(s.type(), StatusType::PRECONDITION_ERROR);
  EXPECT_NE(s.reason().find("power-of-two"), std::string::npos) << s.reason();
  EXPECT_EQ(Check(adasum, Entry(DataType::FLOAT32, {8}, 0), c.context).type(), StatusType::PRECONDITION_ERROR);
  EXPECT_EQ(Check(Req(OpType::ADASUM, DataType::INT32, {8}, ReduceOp::ADASUM), Entry(DataType::INT32, {8}), c.context)
                .type(),
            StatusType::INVALID_ARGUMENT);
}

TEST(EnqueueChecks, BroadcastRootMustBeAMember) {
  std::vector<int> ranks{1, 3};
  EnqueueContext context{2, &ranks, 4, false};
  Request r = Req(OpType::BROADCAST, DataType::FLOAT32, {2});
  r.root_rank = 3;
  EXPECT_TRUE(Check(r, Entry(DataType::FLOAT32, {2}), context).ok());
  r.root_rank = 2;
  Status s = Check(r, Entry(DataType::FLOAT32, {2}), context);
  EXPECT_EQ(s.type(), StatusType::INVALID_ARGUMENT);
  EXPECT_NE(s.reason().find("root rank 2 is not a member of process set 2 (ranks [1, 3])"), std::string::npos)
      << s.reason();
}

TEST(EnqueueChecks, AlltoallSplits) {
  Context c;
  const TensorTableEntry e = Entry(DataType::FLOAT32, {6, 2});
  Request r = Req(OpType::ALLTOALL, DataType::FLOAT32, {6, 2});
  EXPECT_EQ(Check(r, e, c.context).type(), StatusType::INVALID_ARGUMENT);  // 6 rows, 4 ranks, no splits
  r.splits = {1, 2, 3, 0};
  EXPECT_TRUE(Check(r, e, c.context).ok());
  r.splits = {1, 2, 3};
  EXPECT_NE(Check(r, e, c.context).reason().find("expected 4 entries, got 3"), std::string::npos);
  r.splits = {1, -1, 3, 0};
  EXPECT_NE(Check(r, e, c.context).reason().find("negative"), std::string::npos);
  r.splits = {1, 2, 3, 1};
  EXPECT_NE(Check(r, e, c.context).reason().find("add up to 7"), std::string::npos);
}

TEST(EnqueueChecks, ReducescatterOpsAndTypes) {
  Context c;
  EXPECT_TRUE(Check(Req(OpType::REDUCESCATTER, DataType::FLOAT32, {4}, ReduceOp::AVERAGE),
                    Entry(DataType::FLOAT32, {4}), c.context)
                  .ok());
  EXPECT_EQ(Check(Req(OpType::REDUCESCATTER, DataType::FLOAT32, {4}, ReduceOp::MAX), Entry(DataType::FLOAT32, {4}),
                  c.context)
                .type(),
            StatusType::ABORTED);
  EXPECT_EQ(Check(Req(OpType::REDUCESCATTER, DataType::BOOL, {4}), Entry(DataType::BOOL, {4}), c.context).type(),
            StatusType::INVALID_ARGUMENT);
}

TEST(EnqueueChecks, ControlOperations) {
  Context c;
  EnqueueContext on_set = c.context;
  on_set.process_set_id = 1;
  const TensorTableEntry none;
  EXPECT_TRUE(Check(Req(OpType::BARRIER, DataType::UINT8, {}), none, on_set).ok());
  EXPECT_NE(Check(Req(OpType::JOIN, DataType::UINT8, {}), none, on_set).reason().find("global process set only"),
            std::string::npos);
  EXPECT_TRUE(Check(Req(OpType::ADD_PROCESS_SET, DataType::UINT8, {0, 2}), none, c.context).ok());
  EXPECT_NE(Check(Req(OpType::ADD_PROCESS_SET, DataType::UINT8, {}), none, c.context).reason().find("at least one"),
            std::string::npos);
  EXPECT_NE(Check(Req(OpType::ADD_PROCESS_SET, DataType::UINT8, {0, 4}), none, c.context).reason().find("out of range"),
            std::string::npos);
  EXPECT_NE(Check(Req(OpType::ADD_PROCESS_SET, DataType::UINT8, {1, 1}), none, c.context).reason().find("twice"),
            std::string::npos);
  EnqueueContext fixed = c.context;
  fixed.dynamic_process_sets = false;
  Status s = Check(Req(OpType::REMOVE_PROCESS_SET, DataType::UINT8, {1}), none, fixed);
  EXPECT_EQ(s.type(), StatusType::INVALID_ARGUMENT);
  EXPECT_NE(s.reason().find("hvd.remove_process_set() needs dynamic process sets"), std::string::npos) << s.reason();
}

TEST(Agreement, CommonChecksComeInSpecOrder) {
  // dtype first, then the operation type, then the operation's own checks, then the device.
  std::vector<Request> requests{Req(OpType::ALLREDUCE, DataType::FLOAT32, {2}),
                                Req(OpType::ALLGATHER, DataType::FLOAT64, {3})};
  EXPECT_NE(FindMismatch(requests, {}).find("Mismatched data types"), std::string::npos);
  requests[1].dtype = DataType::FLOAT32;
  EXPECT_NE(FindMismatch(requests, {}).find("Mismatched operations"), std::string::npos);
  requests[1].type = OpType::ALLREDUCE;
  EXPECT_NE(FindMismatch(requests, {}).find("tensor shapes"), std::string::npos);
  requests[1].shape = {2};
  requests[1].device = 0;
  EXPECT_NE(FindMismatch(requests, {}).find("CPU/GPU device selection"), std::string::npos);
  requests[1].device = kCpuDevice;
  EXPECT_EQ(FindMismatch(requests, {}), "");
}

TEST(Agreement, JoinedRanksRuleOutGatherLikeOperations) {
  std::vector<Request> requests{Req(OpType::ALLGATHER, DataType::FLOAT32, {2, 3}),
                                Req(OpType::ALLGATHER, DataType::FLOAT32, {5, 3})};
  EXPECT_EQ(FindMismatch(requests, {false, 0}), "");
  EXPECT_NE(FindMismatch(requests, {true, 0}).find("not supported with Join"), std::string::npos);
}

TEST(Describe, ResponseSizesPerOperation) {
  std::vector<Request> requests{Req(OpType::ALLGATHER, DataType::FLOAT32, {2, 3}),
                                Req(OpType::ALLGATHER, DataType::FLOAT32, {5, 3})};
  requests[1].rank = 1;
  Response gather;
  CollectiveFor(OpType::ALLGATHER).Describe(requests, 2, &gather);
  EXPECT_EQ(gather.tensor_sizes, (std::vector<int64_t>{2, 5}));
  Response reduce;
  CollectiveFor(OpType::ALLREDUCE).Describe({Req(OpType::ALLREDUCE, DataType::FLOAT32, {2, 3})}, 2, &reduce);
  EXPECT_EQ(reduce.tensor_sizes, std::vector<int64_t>{6});
  std::vector<Request> all{Req(OpType::ALLTOALL, DataType::FLOAT32, {4}),
                           Req(OpType::ALLTOALL, DataType::FLOAT32, {6})};
  all[1].rank = 1;
  all[1].splits = {1, 5};
  Response alltoall;
  CollectiveFor(OpType::ALLTOALL).Describe(all, 2, &alltoall);
  EXPECT_EQ(alltoall.tensor_sizes, (std::vector<int64_t>{2, 2, 1, 5}));
}

TEST(Reduction, AverageIsSumAndPostscale) {
  Response r;
  r.reduce_op = ReduceOp::AVERAGE;
  r.postscale_factor = 3.0;
  Reduction reduction = EffectiveReduction(r, 4);
  EXPECT_EQ(reduction.op, ReduceOp::SUM);
  EXPECT_DOUBLE_EQ(reduction.postscale, 0.75);
  r.reduce_op = ReduceOp::MAX;
  EXPECT_EQ(EffectiveReduction(r, 4).op, ReduceOp::MAX);
  EXPECT_DOUBLE_EQ(EffectiveReduction(r, 4).postscale, 3.0);
  EXPECT_EQ(SetRankOf({1, 4, 7}, 4), 1);
}

TEST(CpuExecutor, CopiesZeroesScalesAndAllocates) {
  std::unique_ptr<DeviceExecutor> cpu = MakeCpuExecutor();
  EXPECT_EQ(cpu->fusion_alignment(), 1u);
  float a[4] = {1, 2, 3, 4}, b[4] = {0, 0, 0, 0};
  cpu->Copy({{a, b, sizeof(a)}, {a, a, sizeof(a)}});
  EXPECT_EQ(std::memcmp(a, b, sizeof(a)), 0);
  cpu->Scale(b, 4, DataType::FLOAT32, 0.5);
  EXPECT_FLOAT_EQ(b[3], 2.0f);
  cpu->Zero(b, sizeof(float) * 2);
  EXPECT_FLOAT_EQ(b[0], 0.0f);
  EXPECT_FLOAT_EQ(b[2], 1.5f);
  auto out = cpu->Allocate(DataType::INT64, {3, 2});
  EXPECT_EQ(out->num_bytes(), 48u);
  EXPECT_EQ(out->device(), kCpuDevice);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cpu->FusionBuffer(1000)) % 64, 0u);
  int ran = 0;
  cpu->Run({}, [&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace horovod
