// Element-wise reductions and scaling on CPU buffers, shared by every CPU backend.
//
// float16 and bfloat16 are combined in float32 and rounded back (round to nearest even) after
// each pairwise step, as spec core.md §6.2 requires. Scaling follows §6.2 too: integers are scaled
// in float64 and truncated toward zero, float16/bfloat16 in float32, float32 with the factor cast
// to float32, float64 in float64.
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"

namespace horovod {

// dst[i] = op(a[i], b[i]) for i < n; dst may alias a or b. `op` is SUM, MIN, MAX or PRODUCT
// (AVERAGE is SUM followed by Scale). On bool, SUM and MAX are "or", MIN and PRODUCT are "and".
void Reduce(void* dst, const void* a, const void* b, int64_t n, DataType dtype, ReduceOp op);

// buf[i] *= factor for i < n.
void Scale(void* buf, int64_t n, DataType dtype, double factor);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// The two ends of a bfloat16 reduction accumulated in float32 (collectives/float32_accumulation.h).
// The float32 values live in a Float32Staging, kept between calls so that a training step's
// reductions reuse its memory (one per transport, or per thread).
class Float32Staging {
 public:
  // Widens `n` bfloat16 values of `in`, times `prescale` (1: no multiplication), into the staging
  // memory, grown as needed; returns it, valid until the next call.
  float* Widen(const uint16_t* in, int64_t n, float prescale);

 private:
  std::vector<float> values_;
};

// out[i] = in[i] * postscale rounded once to bfloat16 (to nearest even) for i < n; a postscale of
// 1 multiplies nothing.
void NarrowToBfloat16(const float* in, int64_t n, float postscale, uint16_t* out);

}  // namespace horovod
