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

// The parts of the tensor a rank holds in each step. Before step k it holds [lo[k], hi[k]); in step
// k it keeps [lo[k + 1], hi[k + 1]) and its partner rank ^ 2^k takes [given_lo[k], given_hi[k]).
// After the last step it holds [lo[steps], hi[steps]), the block it reduces for every rank.
struct Halving {
  static constexpr int kMaxSteps = 31;  // ranks are ints
  int steps = 0;
  int64_t lo[kMaxSteps + 1] = {0}, hi[kMaxSteps + 1] = {0}, given_lo[kMaxSteps] = {0}, given_hi[kMaxSteps] = {0};

  Halving(int rank, int size, int64_t count) {
    if ((size & (size - 1)) != 0) {
      throw std::logic_error("recursive halving and doubling at " + std::to_string(size) +
                             " ranks (not a power of two)");
    }
    while ((1 << steps) < size) ++steps;
    hi[0] = count;
    for (int k = 0; k < steps; ++k) {
      const int64_t mid = lo[k] + (hi[k] - lo[k]) / 2;
      const bool upper = (rank >> k) & 1;
      lo[k + 1] = upper ? mid : lo[k];
      hi[k + 1] = upper ? hi[k] : mid;
      given_lo[k] = upper ? lo[k] : mid;
      given_hi[k] = upper ? mid : hi[k];
    }
  }
};

void Step(Peers& peers, int peer, char* data, int64_t send_lo, int64_t send_hi, int64_t keep_lo, int64_t keep_hi,
          bool reduce, DataType dtype, ReduceOp op) {
  if (CrossMemoryPeer* cross = peers.cross_memory(peer)) {
    CrossMemoryExchange(peers, peer, *cross, data, send_lo, send_hi, keep_lo, keep_hi, reduce, dtype, op);
  } else {
    Exchange(peers, peer, data, send_lo, send_hi, keep_lo, keep_hi, reduce, dtype, op);
  }
}

void ReduceScatterPhase(Peers& peers, const Halving& plan, char* data, DataType dtype, ReduceOp op) {
  for (int k = 0; k < plan.steps; ++k) {
    Step(peers, peers.rank() ^ (1 << k), data, plan.given_lo[k], plan.given_hi[k], plan.lo[k + 1], plan.hi[k + 1],
         true, dtype, op);
  }
}

void AllgatherPhase(Peers& peers, const Halving& plan, char* data, DataType dtype) {
  for (int k = plan.steps - 1; k >= 0; --k) {
    Step(peers, peers.rank() ^ (1 << k), data, plan.lo[k + 1], plan.hi[k + 1], plan.given_lo[k], plan.given_hi[k],
         false, dtype, ReduceOp::SUM);
  }
}

}  // namespace

void HalvingDoublingAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op) {
  const Halving plan(peers.rank(), peers.size(), count);
  if (peers.size() == 1 || count == 0) return;
  ReduceScatterPhase(peers, plan, data, dtype, op);
  AllgatherPhase(peers, plan, data, dtype);
}

void HalvingDoublingAllreduceBfloat16(Peers& peers, uint16_t* data, float* wide, int64_t count, ReduceOp op,
                                      float postscale) {
  const Halving plan(peers.rank(), peers.size(), count);
  if (count == 0) return;
  ReduceScatterPhase(peers, plan, reinterpret_cast<char*>(wide), DataType::FLOAT32, op);
  const int64_t lo = plan.lo[plan.steps];
  NarrowToBfloat16(wide + lo, plan.hi[plan.steps] - lo, postscale, data + lo);
  // The allgather writes into the partners' bfloat16 buffers, not the float32 ones the reduce-scatter
  // read: the partners of this host learn where those lie, in the order the allgather meets them.
  for (int k = plan.steps - 1; k >= 0; --k) {
    const int peer = peers.rank() ^ (1 << k);
    if (CrossMemoryPeer* cross = peers.cross_memory(peer)) {
      CrossMemoryShareData(peers, peer, *cross, reinterpret_cast<const char*>(data));
    }
  }
  AllgatherPhase(peers, plan, reinterpret_cast<char*>(data), DataType::BFLOAT16);
}

}  // namespace horovod::gloo_backend
