#include "backends/gloo/allreduce_ring.h"

#include <algorithm>

#include "backends/gloo/tuning.h"
#include "common/reduction.h"

namespace horovod::gloo_backend {
namespace {

int Wrap(int block, int size) { return ((block % size) + size) % size; }

// One round's blocks: block b is elements [lo[b], lo[b] + len[b]) of the data.
struct Round {
  std::vector<int64_t> lo, len;
};

// The reduce-scatter phase over one round's blocks: in step s a rank sends block rank - s to the
// next rank and reduces block rank - s - 1 from the previous one into its own, so block b, which
// starts at rank b, is complete at rank b - 1 after size - 1 steps. A rank can be at most size - 1
// steps ahead of the next one, and never all ranks ahead of their next ones at once, so the ring
// cannot close into writers that all wait on full sockets.
void ReduceScatterRound(Peers& peers, char* data, const Round& round, DataType dtype, ReduceOp op) {
  const int rank = peers.rank(), size = peers.size();
  const int64_t item = DataTypeSize(dtype);
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  for (int step = 0; step < size - 1; ++step) {
    const int out = Wrap(rank - step, size), in = Wrap(rank - step - 1, size);
    if (round.len[out] > 0) peers.Send(right, data + round.lo[out] * item, round.len[out] * item);
    if (round.len[in] > 0) {
      char* mine = data + round.lo[in] * item;
      Reduce(mine, peers.Recv(left, round.len[in] * item), mine, round.len[in], dtype, op);
    }
  }
}

// The allgather phase: rank r starts with block r + 1 complete and passes it on along the ring.
void AllgatherRound(Peers& peers, char* data, const Round& round, int64_t item) {
  const int rank = peers.rank(), size = peers.size();
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  for (int step = 0; step < size - 1; ++step) {
    const int out = Wrap(rank + 1 - step, size), in = Wrap(rank - step, size);
    if (round.len[out] > 0) peers.Send(right, data + round.lo[out] * item, round.len[out] * item);
    if (round.len[in] > 0) peers.RecvInto(left, data + round.lo[in] * item, round.len[in] * item);
  }
}

}  // namespace

void RingAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op) {
  const int size = peers.size();
  if (size == 1 || count == 0) return;
  const int64_t item = DataTypeSize(dtype);
  const int64_t span = static_cast<int64_t>(kSyncChunkBytes) / item * size;
  Round round{std::vector<int64_t>(size), std::vector<int64_t>(size)};
  for (int64_t start = 0; start < count; start += span) {
    const int64_t n = std::min(span, count - start);
    for (int b = 0; b < size; ++b) {
      round.lo[b] = start + n * b / size;
      round.len[b] = start + n * (b + 1) / size - round.lo[b];
    }
    ReduceScatterRound(peers, data, round, dtype, op);
    AllgatherRound(peers, data, round, item);
  }
}

void RingReduceScatter(Peers& peers, char* data, const std::vector<int64_t>& counts, DataType dtype, ReduceOp op) {
  const int size = peers.size();
  if (size == 1) return;
  const int64_t item = DataTypeSize(dtype);
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kSyncChunkBytes) / item);
  std::vector<int64_t> offsets(size + 1, 0);
  int64_t longest = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r + 1] = offsets[r] + counts[r];
    longest = std::max(longest, counts[r]);
  }
  // Round k moves elements [k * chunk, (k + 1) * chunk) of every rank's block. The phase leaves
  // ring block b + 1 complete at rank b, so ring block b is rank b - 1's block.
  Round round{std::vector<int64_t>(size), std::vector<int64_t>(size)};
  for (int64_t start = 0; start < longest; start += chunk) {
    for (int b = 0; b < size; ++b) {
      const int owner = Wrap(b - 1, size);
      round.lo[b] = offsets[owner] + start;
      round.len[b] = std::clamp<int64_t>(counts[owner] - start, 0, chunk);
    }
    ReduceScatterRound(peers, data, round, dtype, op);
  }
}

}  // namespace horovod::gloo_backend
