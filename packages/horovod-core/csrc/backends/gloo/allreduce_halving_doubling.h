// Recursive halving and doubling, for a power-of-two number of ranks: a reduce-scatter by recursive
// halving, then an allgather by recursive doubling (Thakur, Rabenseifner and Gropp, "Optimization
// of Collective Communication Operations in MPICH", IJHPCA 2005), in log2(size) steps each where
// the ring takes size - 1.
#pragma once

#include <cstdint>

#include "backends/gloo/peers.h"
#include "common/common.h"

namespace horovod::gloo_backend {

// In-place allreduce of `count` elements of `data`; peers.size() must be a power of two. In step k
// of the reduce-scatter a rank and its partner rank ^ 2^k split the part of the tensor they share,
// each sending the other the half it gives up and reducing the half it keeps; the allgather
// retraces the steps backwards. The nearest partner comes first, so where ranks are numbered host
// by host the largest exchanges stay on a host: at 2 hosts x 2 ranks each host sends the other as
// many bytes as the tensor holds, against 1.5 times as many in the ring, and every rank still sends
// 1.5 times the tensor in all, as in the ring. A step's halves travel in messages of
// kExchangePieceBytes, each rank sending one before reading its partner's, so at most one message
// of a rank is unread by its partner of the step and one by its partner of the next. Between two
// ranks of one host that may access each other's memory (peers.cross_memory), the reduce-scatter
// reads the kept half straight from the partner's data instead, and the allgather writes the
// finished half into it (cross_memory.h): at 2 hosts x 2 ranks the largest exchanges then skip TCP.
// Each element is reduced on one rank, the lower rank's operand first, and copied to the others:
// every rank ends with the same bits: at two ranks those of the reduction in rank order, at four
// those of (x0 op x1) op (x2 op x3), and so on.
void HalvingDoublingAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op);

// A bfloat16 allreduce accumulated in float32 and rounded once (collectives/float32_accumulation.h),
// in the same steps: `wide` holds this rank's `count` values of `data` widened to float32 (and
// prescaled); the reduce-scatter reduces it in float32, each rank rounds its block, times
// `postscale`, once into `data` (to nearest even), and the allgather moves bfloat16. At 2 hosts x 2
// ranks each host sends the other 0.75 of what the float32 allreduce sends, where a float32 ring
// reduce-scatter followed by a bfloat16 allgather sends 1.1 times as much.
void HalvingDoublingAllreduceBfloat16(Peers& peers, uint16_t* data, float* wide, int64_t count, ReduceOp op,
                                      float postscale);

}  // namespace horovod::gloo_backend
