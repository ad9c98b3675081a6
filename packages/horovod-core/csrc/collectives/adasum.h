// Adasum on CPU (spec core.md §6.10): an adaptive summation that combines two gradient vectors a, b
// as  (1 - a·b / (2|a|²)) a + (1 - a·b / (2|b|²)) b,  which is their sum when they are orthogonal
// and their average when they are equal (Maleki et al., "Scaling Distributed Training with
// Adaptive Summation", MLSys 2021).
//
// Over 2^k ranks it runs as recursive vector halving with distance doubling: at level d = 1, 2, 4,
// ... each rank exchanges half of its current segment with rank XOR d, the two sides' partial dot
// products and squared norms (float64) are summed over the block of 2d ranks that shares the
// vectors being combined, and each rank combines its half. A distance-halving allgather then gives
// every rank the whole result.
#pragma once

#include <cstdint>

#include "backends/communicator.h"
#include "common/common.h"

namespace horovod {

// Combines `buffer` (count elements of float16, float32 or float64) over every rank of `backend`
// in place. The number of ranks must be a power of two (checked by the caller at enqueue).
void AdasumAllreduce(Communicator& backend, void* buffer, int64_t count, DataType dtype);

}  // namespace horovod
