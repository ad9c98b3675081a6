#include "backends/gloo/allreduce_halving_doubling.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backends/gloo/cross_memory.h"
#include "backends/gloo/tuning.h"
#include "common/reduction.h"

namespace horovod::gloo_backend {
namespace {

// Sends elements [send_lo, send_hi) of `data` to `peer` while reading its [keep_lo, keep_hi),
// in messages of kExchangePieceBytes, each sent before the partner's is read; what arrives is
// reduced into the local elements, the lower rank's operand first (`reduce`), or overwrites them.
void Exchange(Peers& peers, int peer, char* data, int64_t send_lo, int64_t send_hi, int64_t keep_lo, int64_t keep_hi,
              bool reduce, DataType dtype, ReduceOp op) {
  const int64_t item = DataTypeSize(dtype);
  const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(kExchangePieceBytes) / item);
  for (int64_t i = 0; send_lo + i < send_hi || keep_lo + i < keep_hi; i += piece) {
    if (send_lo + i < send_hi) {
      peers.Send(peer, data + (send_lo + i) * item, std::min(piece, send_hi - send_lo - i) * item);
    }
    if (keep_lo + i < keep_hi) {
      const int64_t n = std::min(piece, keep_hi - keep_lo - i);
      char* mine = data + (keep_lo + i) * item;
      if (!reduce) {
        peers.RecvInto(peer, mine, n * item);
      } else if (peer < peers.rank()) {
        Reduce(mine, peers.Recv(peer, n * item), mine, n, dtype, op);
      } else {
        Reduce(mine, mine, peers.Recv(peer, n * item), n, dtype, op);
      }
    }
  }
}

}  // namespace

void HalvingDoublingAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op) {
  const int rank = peers.rank(), size = peers.size();
  if ((size & (size - 1)) != 0) {
    throw std::logic_error("recursive halving and doubling at " + std::to_string(size) + " ranks (not a power of two)");
  }
  if (size == 1 || count == 0) return;
  static constexpr int kMaxSteps = 31;  // ranks are ints
  int steps = 0;
  while ((1 << steps) < size) ++steps;
  auto exchange = [&](int peer, int64_t send_lo, int64_t send_hi, int64_t keep_lo, int64_t keep_hi, bool reduce) {
    if (CrossMemoryPeer* cross = peers.cross_memory(peer)) {
      CrossMemoryExchange(peers, peer, *cross, data, send_lo, send_hi, keep_lo, keep_hi, reduce, dtype, op);
    } else {
      Exchange(peers, peer, data, send_lo, send_hi, keep_lo, keep_hi, reduce, dtype, op);
    }
  };
  // The part of the tensor this rank holds before step k is [lo[k], hi[k]); in step k it keeps
  // [lo[k + 1], hi[k + 1]) and its partner the other half, [given_lo[k], given_hi[k]).
  int64_t lo[kMaxSteps + 1] = {0}, hi[kMaxSteps + 1] = {count}, given_lo[kMaxSteps], given_hi[kMaxSteps];
  for (int k = 0; k < steps; ++k) {
    const int64_t mid = lo[k] + (hi[k] - lo[k]) / 2;
    const bool upper = (rank >> k) & 1;
    lo[k + 1] = upper ? mid : lo[k];
    hi[k + 1] = upper ? hi[k] : mid;
    given_lo[k] = upper ? lo[k] : mid;
    given_hi[k] = upper ? mid : hi[k];
    exchange(rank ^ (1 << k), given_lo[k], given_hi[k], lo[k + 1], hi[k + 1], true);
  }
  for (int k = steps - 1; k >= 0; --k) {
    exchange(rank ^ (1 << k), lo[k + 1], hi[k + 1], given_lo[k], given_hi[k], false);
  }
}

}  // namespace horovod::gloo_backend
