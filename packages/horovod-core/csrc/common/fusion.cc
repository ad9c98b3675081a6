#include "fusion.h"

#include <cstdlib>
#include <new>

#include "common.h"

namespace horovod {

namespace {

int64_t AllreduceBytes(const Response& r) {
  int64_t elements = 0;
  for (int64_t n : r.tensor_sizes) elements += n;
  return elements * static_cast<int64_t>(DataTypeSize(r.dtype));
}

bool Compatible(const Response& a, const Response& b, bool group_fusion_only) {
  if (b.type != OpType::ALLREDUCE || a.dtype != b.dtype || a.reduce_op != b.reduce_op ||
      a.prescale_factor != b.prescale_factor || a.postscale_factor != b.postscale_factor || a.device != b.device) {
    return false;
  }
  if (group_fusion_only) return a.group_id != 0 && a.group_id == b.group_id;
  return true;
}

}  // namespace

std::vector<Response> FuseResponses(std::vector<Response> responses, int64_t threshold_bytes,
                                    bool group_fusion_only) {
  std::vector<Response> fused;
  std::vector<bool> taken(responses.size(), false);
  for (size_t i = 0; i < responses.size(); ++i) {
    if (taken[i]) continue;
    Response current = std::move(responses[i]);
    taken[i] = true;
    if (current.type == OpType::ALLREDUCE && threshold_bytes > 0) {
      int64_t bytes = AllreduceBytes(current);
      for (size_t j = i + 1; j < responses.size() && bytes < threshold_bytes; ++j) {
        if (taken[j] || !Compatible(current, responses[j], group_fusion_only)) continue;
        int64_t extra = AllreduceBytes(responses[j]);
        if (bytes + extra > threshold_bytes) continue;
        bytes += extra;
        for (auto& name : responses[j].names) current.names.push_back(std::move(name));
        current.tensor_sizes.insert(current.tensor_sizes.end(), responses[j].tensor_sizes.begin(),
                                    responses[j].tensor_sizes.end());
        taken[j] = true;
      }
    }
    fused.push_back(std::move(current));
  }
  return fused;
}

FusionBuffer::~FusionBuffer() { std::free(data_); }

void* FusionBuffer::Get(size_t bytes) {
  if (bytes > capacity_) {
    std::free(data_);
    capacity_ = (bytes + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, capacity_);
    if (data_ == nullptr) {
      capacity_ = 0;
      throw std::bad_alloc();
    }
  }
  return data_;
}

}  // namespace horovod
