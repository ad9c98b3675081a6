#include "reduction.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace horovod {

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf / nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                         // result is subnormal or zero
    if (abs < 0x33000000u) return sign;            // below half the smallest subnormal
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    // f = mantissa * 2^(exponent - 150); in units of the smallest subnormal (2^-24) that is
    // mantissa >> (126 - exponent), rounded to nearest even.
    uint32_t shift = 126 - exponent;
    uint32_t value = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (value & 1u))) ++value;
    return sign | static_cast<uint16_t>(value);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, nearest even.
  uint32_t value = abs - 0x38000000u;  // (127 - 15) << 23
  uint32_t rounded = (value + 0xfffu + ((value >> 13) & 1u)) >> 13;
  return sign | static_cast<uint16_t>(rounded);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet nan
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float* Float32Staging::Widen(const uint16_t* in, int64_t n, float prescale) {
  if (values_.size() < static_cast<size_t>(n)) values_.resize(n);
  float* out = values_.data();
  for (int64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
  if (prescale != 1.0f) {
    for (int64_t i = 0; i < n; ++i) out[i] *= prescale;
  }
  return out;
}

void NarrowToBfloat16(const float* in, int64_t n, float postscale, uint16_t* out) {
  if (postscale != 1.0f) {
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i] * postscale);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
  }
}

namespace {

struct SumOp { template <typename T> static T apply(T a, T b) { return a + b; } };
struct MinOp { template <typename T> static T apply(T a, T b) { return std::min(a, b); } };
struct MaxOp { template <typename T> static T apply(T a, T b) { return std::max(a, b); } };
struct ProductOp { template <typename T> static T apply(T a, T b) { return a * b; } };

template <typename T, typename Op>
void ReduceTyped(void* dst, const void* a, const void* b, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(Op::apply(x[i], y[i]));
}

template <typename Op, float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Reduce16(void* dst, const void* a, const void* b, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (int64_t i = 0; i < n; ++i) d[i] = FromFloat(Op::apply(ToFloat(x[i]), ToFloat(y[i])));
}

template <typename Op>
void ReduceDispatch(void* dst, const void* a, const void* b, int64_t n, DataType dtype) {
  switch (dtype) {
    case DataType::UINT8: return ReduceTyped<uint8_t, Op>(dst, a, b, n);
    case DataType::INT8: return ReduceTyped<int8_t, Op>(dst, a, b, n);
    case DataType::UINT16: return ReduceTyped<uint16_t, Op>(dst, a, b, n);
    case DataType::INT16: return ReduceTyped<int16_t, Op>(dst, a, b, n);
    case DataType::INT32: return ReduceTyped<int32_t, Op>(dst, a, b, n);
    case DataType::INT64: return ReduceTyped<int64_t, Op>(dst, a, b, n);
    case DataType::FLOAT32: return ReduceTyped<float, Op>(dst, a, b, n);
    case DataType::FLOAT64: return ReduceTyped<double, Op>(dst, a, b, n);
    case DataType::FLOAT16: return Reduce16<Op, HalfToFloat, FloatToHalf>(dst, a, b, n);
    case DataType::BFLOAT16: return Reduce16<Op, BFloat16ToFloat, FloatToBFloat16>(dst, a, b, n);
    case DataType::BOOL: break;
  }
}

void ReduceBool(void* dst, const void* a, const void* b, int64_t n, bool logical_and) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (int64_t i = 0; i < n; ++i) d[i] = logical_and ? (x[i] && y[i]) : (x[i] || y[i]);
}

template <typename T>
void ScaleInteger(void* buf, int64_t n, double factor) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<double>(p[i]) * factor);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Scale16(void* buf, int64_t n, double factor) {
  uint16_t* p = static_cast<uint16_t*>(buf);
  float f = static_cast<float>(factor);
  for (int64_t i = 0; i < n; ++i) p[i] = FromFloat(ToFloat(p[i]) * f);
}

}  // namespace

void Reduce(void* dst, const void* a, const void* b, int64_t n, DataType dtype, ReduceOp op) {
  if (dtype == DataType::BOOL) {
    ReduceBool(dst, a, b, n, op == ReduceOp::MIN || op == ReduceOp::PRODUCT);
    return;
  }
  switch (op) {
    case ReduceOp::SUM: case ReduceOp::AVERAGE: return ReduceDispatch<SumOp>(dst, a, b, n, dtype);
    case ReduceOp::MIN: return ReduceDispatch<MinOp>(dst, a, b, n, dtype);
    case ReduceOp::MAX: return ReduceDispatch<MaxOp>(dst, a, b, n, dtype);
    case ReduceOp::PRODUCT: return ReduceDispatch<ProductOp>(dst, a, b, n, dtype);
    case ReduceOp::ADASUM: break;
  }
  throw std::invalid_argument(std::string("reduction ") + ReduceOpName(op) + " is not an element-wise reduction");
}

void Scale(void* buf, int64_t n, DataType dtype, double factor) {
  switch (dtype) {
    case DataType::UINT8: return ScaleInteger<uint8_t>(buf, n, factor);
    case DataType::INT8: return ScaleInteger<int8_t>(buf, n, factor);
    case DataType::UINT16: return ScaleInteger<uint16_t>(buf, n, factor);
    case DataType::INT16: return ScaleInteger<int16_t>(buf, n, factor);
    case DataType::INT32: return ScaleInteger<int32_t>(buf, n, factor);
    case DataType::INT64: return ScaleInteger<int64_t>(buf, n, factor);
    case DataType::FLOAT16: return Scale16<HalfToFloat, FloatToHalf>(buf, n, factor);
    case DataType::BFLOAT16: return Scale16<BFloat16ToFloat, FloatToBFloat16>(buf, n, factor);
    case DataType::FLOAT32: {
      float* p = static_cast<float*>(buf);
      float f = static_cast<float>(factor);
      for (int64_t i = 0; i < n; ++i) p[i] *= f;
      return;
    }
    case DataType::FLOAT64: {
      double* p = static_cast<double*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] *= factor;
      return;
    }
    case DataType::BOOL: break;
  }
  throw std::invalid_argument("bool tensors cannot be scaled");
}

}  // namespace horovod
