// Tensor fusion: merging ready allreduce responses into one operation over a fusion buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "message.h"

namespace horovod {

// Merges allreduce responses that share dtype, reduce op, scale factors and device while their
// total size stays within `threshold_bytes` (0 disables fusion). A response that cannot join the
// current fused one is skipped over (look-ahead) and keeps its relative order. With
// `group_fusion_only`, members of one group fuse only with each other and ungrouped tensors alone.
std::vector<Response> FuseResponses(std::vector<Response> responses, int64_t threshold_bytes,
                                    bool group_fusion_only);

// The persistent staging buffer of fused allreduces; grows to the largest fused size seen.
class FusionBuffer {
 public:
  FusionBuffer() = default;
  ~FusionBuffer();
  FusionBuffer(const FusionBuffer&) = delete;
  FusionBuffer& operator=(const FusionBuffer&) = delete;
  // Returns a 64-byte aligned buffer of at least `bytes` bytes (contents unspecified).
  void* Get(size_t bytes);

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace horovod
