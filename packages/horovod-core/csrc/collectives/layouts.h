// Output layouts of the collectives whose output shape is known only after negotiation, each
// defined in its collective's file (and unit-tested in csrc/tests/layout_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/message.h"
#include "common/tensor_queue.h"

namespace horovod {

// Where the rows of tensor `t` of an allgather response come from: bytes from each rank of the
// set (first dimensions in response.tensor_sizes[t * size + r]) and the gathered shape.
struct AllgatherLayout {
  std::vector<int64_t> bytes_per_rank;
  std::vector<int64_t> shape;
  int64_t bytes = 0;  // of the whole output
};
AllgatherLayout MakeAllgatherLayout(const Response& response, size_t t, const TensorView& input, int size);

// The bytes this rank (`me`) sends to and receives from each rank of an alltoall response, the
// received shape, and the received splits (rows per sender) as the host array the caller gets.
struct AlltoallLayout {
  std::vector<int64_t> send_bytes, recv_bytes;
  std::vector<int64_t> shape;
  int64_t bytes = 0;  // received in all
  std::shared_ptr<OutputBuffer> received_splits;
};
AlltoallLayout MakeAlltoallLayout(const Response& response, const TensorView& input, int size, int me);

// How a reducescatter splits a tensor of dim0 rows among the ranks of the set: counts[r] elements
// for rank r (rank r gets dim0 / size rows, one more when r < dim0 % size), this rank's (`me`)
// first element, and the shape of its part.
struct ReducescatterLayout {
  std::vector<int64_t> counts;
  int64_t offset = 0;
  std::vector<int64_t> shape;
};
ReducescatterLayout MakeReducescatterLayout(const TensorView& input, int size, int me);

}  // namespace horovod
