// The ring: a reduce-scatter, then an allgather, each in size - 1 steps to the next rank, in rounds
// of size x kSyncChunkBytes. It sends as many bytes per rank as a two-step scheme would, but only
// to the next rank: where ranks are numbered host by host, all but one of each host's messages
// stay on the host, where two steps would send (size - local size) / size of them across.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/gloo/peers.h"
#include "common/common.h"

namespace horovod::gloo_backend {

// In-place allreduce of `count` elements of `data`. Block b of each round is reduced along the ring
// from rank b + 1 to rank b, so every rank ends with the same bits, though not those of a reduction
// in rank order.
void RingAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op);

// The ring's reduce-scatter phase alone: `data` holds counts[0] + ... + counts[size-1] elements,
// block r being counts[r] elements after those of the ranks before r; afterwards this rank's
// block holds the reduction of every rank's (the other blocks hold partial results). Each rank
// sends (size - 1) / size of the data once, and reduces as much: half of a ring allreduce.
void RingReduceScatter(Peers& peers, char* data, const std::vector<int64_t>& counts, DataType dtype, ReduceOp op);

}  // namespace horovod::gloo_backend
