// bfloat16 reductions accumulated in float32 and rounded once (issue 43).
//
// A reduction that combined bfloat16 values pairwise on the way between ranks (a ring, a tree, a
// shared-memory reduce) would round every partial sum to bfloat16's 8 significant bits: from three
// ranks on, the result is the sum rounded two or more times. Here the ranks' values are widened to
// float32 (after the prescale, in float32), reduced as float32 by the communicator's reduce-scatter,
// each rank scales its block by the postscale in float32 and rounds it once to bfloat16 (to nearest,
// ties to even), and the rounded blocks are allgathered in bfloat16. On the wire that is float32's
// bytes for the reduce-scatter half and bfloat16's for the allgather half: 0.75 of a float32
// allreduce, 1.5 of a bfloat16 one. The result equals the float32 reduction of the ranks' values
// rounded once; where float32 holds every partial sum exactly (bfloat16 values whose exponents lie
// within 16 of each other, summed over a few ranks), it does not depend on the order of the sum.
//
// CPU buffers only: GPU tensors go to NCCL as ncclBfloat16.
#pragma once

#include <cstdint>
#include <vector>

#include "backends/communicator.h"
#include "common/common.h"

namespace horovod {

// Whether a reduction of `dtype` on `device` takes this path: bfloat16 on the CPU.
bool AccumulatesInFloat32(DataType dtype, int32_t device);

// The engine's split of `count` elements over `size` ranks: the first count % size ranks get one
// element more.
std::vector<int64_t> SplitCounts(int64_t count, int size);

// Reduce-scatter of sum(counts) bfloat16 values (uint16 bit patterns) from `input` over `comm`:
// this rank's block, counts[rank] elements from offset sum(counts[0..rank)), of
// postscale * op_r(prescale * x_r), computed in float32 and rounded once, is written to `output`.
// `op` is SUM, MIN, MAX or PRODUCT.
void ReducescatterInFloat32(Communicator& comm, const uint16_t* input, const std::vector<int64_t>& counts,
                            ReduceOp op, double prescale, double postscale, uint16_t* output);

// Allreduce of `count` bfloat16 values of `buffer` in place over `comm`: the communicator's own
// shape where it has one (Communicator::AllreduceBfloat16InFloat32: Gloo's recursive halving and
// doubling, which keeps the largest exchanges on a host), else ReducescatterInFloat32, then an
// allgather of the rounded blocks.
void AllreduceInFloat32(Communicator& comm, uint16_t* buffer, int64_t count, ReduceOp op, double prescale,
                        double postscale);

}  // namespace horovod
