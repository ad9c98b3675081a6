// Output layouts of the collectives whose output shape is known only after negotiation.
#include <gtest/gtest.h>

#include "collectives/layouts.h"

namespace horovod {
namespace {

TensorView View(DataType dtype, std::vector<int64_t> shape) {
  TensorView view;
  view.dtype = dtype;
  view.shape = std::move(shape);
  return view;
}

TEST(Layout, AllgatherConcatenatesFirstDimensions) {
  Response response;
  response.type = OpType::ALLGATHER;
  // Two tensors over 3 ranks, tensor-major: tensor 0 has 2, 0, 5 rows; tensor 1 has 1, 1, 1.
  response.tensor_sizes = {2, 0, 5, 1, 1, 1};
  const AllgatherLayout first = MakeAllgatherLayout(response, 0, View(DataType::FLOAT64, {2, 3, 4}), 3);
  EXPECT_EQ(first.bytes_per_rank, (std::vector<int64_t>{2 * 96, 0, 5 * 96}));
  EXPECT_EQ(first.shape, (std::vector<int64_t>{7, 3, 4}));
  EXPECT_EQ(first.bytes, 7 * 96);
  const AllgatherLayout second = MakeAllgatherLayout(response, 1, View(DataType::UINT8, {1}), 3);
  EXPECT_EQ(second.bytes_per_rank, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(second.shape, (std::vector<int64_t>{3}));
}

TEST(Layout, AlltoallSendsItsRowAndReceivesItsColumn) {
  Response response;
  response.type = OpType::ALLTOALL;
  // rows[sender * 3 + receiver]
  response.tensor_sizes = {0, 1, 2,
                           3, 4, 5,
                           6, 7, 8};
  const AlltoallLayout layout = MakeAlltoallLayout(response, View(DataType::INT32, {12, 2}), 3, 1);
  EXPECT_EQ(layout.send_bytes, (std::vector<int64_t>{3 * 8, 4 * 8, 5 * 8}));
  EXPECT_EQ(layout.recv_bytes, (std::vector<int64_t>{1 * 8, 4 * 8, 7 * 8}));
  EXPECT_EQ(layout.shape, (std::vector<int64_t>{12, 2}));
  EXPECT_EQ(layout.bytes, 12 * 8);
  ASSERT_NE(layout.received_splits, nullptr);
  EXPECT_EQ(layout.received_splits->shape(), std::vector<int64_t>{3});
  const auto* splits = static_cast<const int32_t*>(layout.received_splits->data());
  EXPECT_EQ(std::vector<int32_t>(splits, splits + 3), (std::vector<int32_t>{1, 4, 7}));
}

TEST(Layout, ReducescatterGivesTheFirstRanksTheExtraRows) {
  // 7 rows of 2 elements over 3 ranks: 3, 2, 2 rows.
  const std::vector<int64_t> counts = {6, 4, 4};
  const std::vector<int64_t> offsets = {0, 6, 10};
  for (int me = 0; me < 3; ++me) {
    const ReducescatterLayout layout = MakeReducescatterLayout(View(DataType::FLOAT32, {7, 2}), 3, me);
    EXPECT_EQ(layout.counts, counts);
    EXPECT_EQ(layout.offset, offsets[me]);
    EXPECT_EQ(layout.shape, (std::vector<int64_t>{counts[me] / 2, 2}));
  }
  // Fewer rows than ranks: the last ranks get none.
  const ReducescatterLayout empty = MakeReducescatterLayout(View(DataType::FLOAT32, {1}), 2, 1);
  EXPECT_EQ(empty.counts, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(empty.shape, std::vector<int64_t>{0});
}

}  // namespace
}  // namespace horovod
