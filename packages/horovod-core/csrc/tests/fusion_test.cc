// Fusion planning: which ready allreduces merge into one fused operation, and the fusion buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>

#include "common/fusion.h"

namespace horovod {
namespace {

Response Allreduce(const std::string& name, int64_t elements, DataType dtype = DataType::FLOAT32) {
  Response r;
  r.type = OpType::ALLREDUCE;
  r.names = {name};
  r.dtype = dtype;
  r.tensor_sizes = {elements};
  return r;
}

std::vector<std::vector<std::string>> Names(const std::vector<Response>& responses) {
  std::vector<std::vector<std::string>> names;
  for (const auto& r : responses) names.push_back(r.names);
  return names;
}

using Groups = std::vector<std::vector<std::string>>;

TEST(Fusion, CompatibleAllreducesMergeInOrder) {
  std::vector<Response> fused = FuseResponses({Allreduce("a", 3), Allreduce("b", 5), Allreduce("c", 1)}, 1 << 20, false);
  ASSERT_EQ(fused.size(), 1u);
  EXPECT_EQ(fused[0].names, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(fused[0].tensor_sizes, (std::vector<int64_t>{3, 5, 1}));
}

TEST(Fusion, ThresholdZeroDisablesFusion) {
  EXPECT_EQ(Names(FuseResponses({Allreduce("a", 3), Allreduce("b", 5)}, 0, false)), (Groups{{"a"}, {"b"}}));
}

TEST(Fusion, ThresholdBoundsTheFusedBytes) {
  // 10 float32 = 40 bytes each: two fit in 80 bytes exactly, the third does not.
  std::vector<Response> in = {Allreduce("a", 10), Allreduce("b", 10), Allreduce("c", 10)};
  EXPECT_EQ(Names(FuseResponses(in, 80, false)), (Groups{{"a", "b"}, {"c"}}));
  EXPECT_EQ(Names(FuseResponses(in, 79, false)), (Groups{{"a"}, {"b"}, {"c"}}));
  EXPECT_EQ(Names(FuseResponses(in, 120, false)), (Groups{{"a", "b", "c"}}));
  // Look-ahead past a tensor too big for the rest of the buffer: the small one after it still fits.
  EXPECT_EQ(Names(FuseResponses({Allreduce("a", 10), Allreduce("big", 100), Allreduce("c", 10)}, 80, false)),
            (Groups{{"a", "c"}, {"big"}}));
  // A tensor larger than the threshold runs alone.
  EXPECT_EQ(Names(FuseResponses({Allreduce("big", 100), Allreduce("b", 1)}, 80, false)), (Groups{{"big"}, {"b"}}));
}

TEST(Fusion, ThresholdCountsBytesOfEachDtype) {
  // 10 float64 = 80 bytes: with one float64 tensor of 10 elements a second does not fit in 100.
  EXPECT_EQ(Names(FuseResponses({Allreduce("a", 10, DataType::FLOAT64), Allreduce("b", 10, DataType::FLOAT64)}, 100,
                                false)),
            (Groups{{"a"}, {"b"}}));
  EXPECT_EQ(Names(FuseResponses({Allreduce("a", 10, DataType::INT16), Allreduce("b", 10, DataType::INT16)}, 40, false)),
            (Groups{{"a", "b"}}));
}

TEST(Fusion, OnlyMatchingDtypeOpScaleAndDeviceFuse) {
  Response base = Allreduce("base", 4);
  std::vector<std::pair<std::string, std::function<void(Response&)>>> differences = {
      {"dtype", [](Response& r) { r.dtype = DataType::INT32; }},
      {"op", [](Response& r) { r.reduce_op = ReduceOp::MAX; }},
      {"prescale", [](Response& r) { r.prescale_factor = 2.0; }},
      {"postscale", [](Response& r) { r.postscale_factor = 0.5; }},
      {"device", [](Response& r) { r.device = 0; }},
  };
  for (const auto& [what, change] : differences) {
    Response other = Allreduce("other", 4);
    change(other);
    // The odd one is skipped over; the tensor after it still joins the first.
    std::vector<Response> fused = FuseResponses({base, other, Allreduce("same", 4)}, 1 << 20, false);
    EXPECT_EQ(Names(fused), (Groups{{"base", "same"}, {"other"}})) << what;
  }
}

TEST(Fusion, OtherOperationsNeverFuse) {
  for (OpType type : {OpType::ALLGATHER, OpType::BROADCAST, OpType::ALLTOALL,
                            OpType::REDUCESCATTER, OpType::ADASUM, OpType::ERROR,
                            OpType::BARRIER}) {
    Response a = Allreduce("a", 1), b = Allreduce("b", 1), c = Allreduce("c", 1);
    a.type = b.type = type;
    EXPECT_EQ(Names(FuseResponses({a, b, c}, 1 << 20, false)), (Groups{{"a"}, {"b"}, {"c"}}))
        << OpTypeName(type);
  }
  // An allreduce never absorbs one of another type either.
  Response gather = Allreduce("g", 1);
  gather.type = OpType::ALLGATHER;
  EXPECT_EQ(Names(FuseResponses({Allreduce("a", 1), gather, Allreduce("b", 1)}, 1 << 20, false)),
            (Groups{{"a", "b"}, {"g"}}));
}

TEST(Fusion, GroupFusionOnly) {
  Response a1 = Allreduce("a1", 1), a2 = Allreduce("a2", 1), b1 = Allreduce("b1", 1), u1 = Allreduce("u1", 1),
           u2 = Allreduce("u2", 1);
  a1.group_id = a2.group_id = 7;
  b1.group_id = 8;
  std::vector<Response> in = {a1, u1, b1, a2, u2};
  EXPECT_EQ(Names(FuseResponses(in, 1 << 20, true)), (Groups{{"a1", "a2"}, {"u1"}, {"b1"}, {"u2"}}));
  // Without the switch, groups do not matter.
  EXPECT_EQ(Names(FuseResponses(in, 1 << 20, false)), (Groups{{"a1", "u1", "b1", "a2", "u2"}}));
}

TEST(Fusion, FusionBufferIsAlignedAndGrows) {
  FusionBuffer buffer;
  void* small = buffer.Get(10);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  std::memset(small, 1, 10);
  EXPECT_EQ(buffer.Get(64), small);  // the rounded-up capacity is reused
  void* large = buffer.Get(1 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % 64, 0u);
  std::memset(large, 2, 1 << 20);     // all of it is usable
  EXPECT_EQ(buffer.Get(100), large);  // never shrinks
}

}  // namespace
}  // namespace horovod
