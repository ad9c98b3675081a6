#include "backends/gloo/allreduce_one_step.h"

#include <algorithm>
#include <cstring>

#include "backends/gloo/tuning.h"
#include "common/reduction.h"

namespace horovod::gloo_backend {
namespace {

// `mine` (n elements) becomes x_0 op x_1 op ... op x_(size-1), evaluated left to right, where
// x_rank is `mine` and every other x_r is the next message from rank r.
void ReduceInRankOrder(Peers& peers, char* mine, int64_t n, DataType dtype, ReduceOp op, std::vector<char>& scratch) {
  const int rank = peers.rank(), size = peers.size();
  const size_t bytes = static_cast<size_t>(n * DataTypeSize(dtype));
  const void* first = rank == 0 ? mine : peers.Recv(0, bytes);
  const void* second = rank == 1 ? mine : peers.Recv(1, bytes);
  if (rank > 1 && scratch.size() < bytes) scratch.resize(bytes);
  char* acc = rank <= 1 ? mine : scratch.data();
  Reduce(acc, first, second, n, dtype, op);
  for (int r = 2; r < size; ++r) Reduce(acc, acc, r == rank ? mine : peers.Recv(r, bytes), n, dtype, op);
  if (acc != mine) std::memcpy(mine, acc, bytes);
}

}  // namespace

void OneStepAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op,
                      std::vector<char>& scratch) {
  const int rank = peers.rank(), size = peers.size();
  if (size == 1 || count == 0) return;
  const int64_t item = DataTypeSize(dtype);
  // Each step's message is read by every peer before that peer sends its next one, so at most two
  // messages of a rank are unread by a peer.
  const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(kSyncChunkBytes) / item);
  for (int64_t start = 0; start < count; start += piece) {
    const int64_t n = std::min(piece, count - start);
    char* mine = data + start * item;
    for (int r = 0; r < size; ++r) {
      if (r != rank) peers.Send(r, mine, static_cast<size_t>(n * item));
    }
    ReduceInRankOrder(peers, mine, n, dtype, op, scratch);
  }
}

}  // namespace horovod::gloo_backend
