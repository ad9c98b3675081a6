// The error of a GPU operation: the NCCL plugin failed to load, a kernel or collective failed on
// Horovod's stream, or tensors lie where the GPU executor cannot run them. The executors throw
// it (the plugin's own std::runtime_error is rethrown as one), and the engine ends on it with a
// message naming the GPU as the cause.
#pragma once

#include <stdexcept>

namespace horovod {

class GpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace horovod
