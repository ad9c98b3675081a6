// The one-step allreduce: every rank sends its data to every other and reduces all of it in rank
// order, so every rank ends with the bits of x_0 op x_1 op ... op x_(size-1), evaluated left to
// right (the same bits as the shared-memory transport and the eager cache round).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/gloo/peers.h"
#include "common/common.h"

namespace horovod::gloo_backend {

// In-place allreduce of `count` elements of `data`. The mesh takes it up to its one-step size (a
// single message); larger data goes in messages of kSyncChunkBytes, each step of which repeats the
// scheme. `scratch` holds the running result at more than two ranks (grown to a message's size).
void OneStepAllreduce(Peers& peers, char* data, int64_t count, DataType dtype, ReduceOp op,
                      std::vector<char>& scratch);

}  // namespace horovod::gloo_backend
