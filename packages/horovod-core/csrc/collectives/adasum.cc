#include "collectives/adasum.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/reduction.h"

namespace horovod {

namespace {

// Element access in float64 for the three dtypes Adasum supports.
double Load(const void* base, int64_t i, DataType dtype) {
  switch (dtype) {
    case DataType::FLOAT16: return HalfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::FLOAT32: return static_cast<const float*>(base)[i];
    case DataType::FLOAT64: return static_cast<const double*>(base)[i];
    default: throw std::logic_error("Adasum supports float16, float32 and float64 only");
  }
}

void StoreElement(void* base, int64_t i, DataType dtype, double value) {
  switch (dtype) {
    case DataType::FLOAT16: static_cast<uint16_t*>(base)[i] = FloatToHalf(static_cast<float>(value)); break;
    case DataType::FLOAT32: static_cast<float*>(base)[i] = static_cast<float>(value); break;
    case DataType::FLOAT64: static_cast<double*>(base)[i] = value; break;
    default: throw std::logic_error("Adasum supports float16, float32 and float64 only");
  }
}

double Coefficient(double dot, double norm2) {
  // A (near) zero vector keeps its coefficient at 1 instead of dividing by ~0.
  return norm2 < std::sqrt(DBL_MIN) ? 1.0 : 1.0 - dot / (2.0 * norm2);
}

}  // namespace

void AdasumAllreduce(Communicator& backend, void* buffer, int64_t count, DataType dtype) {
  const int size = backend.size();
  const int rank = backend.rank();
  if (size == 1 || count == 0) return;
  if ((size & (size - 1)) != 0) throw std::logic_error("Adasum needs a power-of-two number of ranks");
  const size_t element = DataTypeSize(dtype);
  char* data = static_cast<char*>(buffer);
  std::vector<char> received;

  // Segments [start, end) kept at each level, to walk back in the allgather.
  std::vector<std::pair<int64_t, int64_t>> kept;
  int64_t start = 0, end = count;
  for (int distance = 1; distance < size; distance *= 2) {
    const int peer = rank ^ distance;
    const bool lower = (rank & distance) == 0;
    const int64_t mid = start + (end - start) / 2;
    // The lower rank keeps the first half and sends the second; the upper rank the reverse.
    const int64_t keep_start = lower ? start : mid, keep_end = lower ? mid : end;
    const int64_t send_start = lower ? mid : start, send_end = lower ? end : mid;
    const int64_t n = keep_end - keep_start;
    received.resize(static_cast<size_t>(n) * element);
    backend.SendRecv({data + send_start * element, (send_end - send_start) * static_cast<int64_t>(element),
                      received.data(), n * static_cast<int64_t>(element), peer});

    // Partial dot(left, right), |left|², |right|² over this rank's half, where "left" is the
    // vector of the lower block of ranks.
    const void* mine = data + keep_start * element;
    const void* theirs = received.data();
    const void* left = lower ? mine : theirs;
    const void* right = lower ? theirs : mine;
    double sums[3] = {0, 0, 0};
    for (int64_t i = 0; i < n; ++i) {
      double l = Load(left, i, dtype), r = Load(right, i, dtype);
      sums[0] += l * r;
      sums[1] += l * l;
      sums[2] += r * r;
    }
    // Sum the partials over the block of 2 * distance ranks (recursive doubling inside it).
    for (int d = 1; d <= distance; d *= 2) {
      double theirs_sums[3];
      backend.SendRecv({sums, sizeof(sums), theirs_sums, sizeof(theirs_sums), rank ^ d});
      for (int k = 0; k < 3; ++k) sums[k] += theirs_sums[k];
    }
    const double left_coefficient = Coefficient(sums[0], sums[1]);
    const double right_coefficient = Coefficient(sums[0], sums[2]);
    for (int64_t i = 0; i < n; ++i) {
      double value = left_coefficient * Load(left, i, dtype) + right_coefficient * Load(right, i, dtype);
      StoreElement(data + keep_start * element, i, dtype, value);
    }
    kept.emplace_back(start, end);
    start = keep_start;
    end = keep_end;
  }

  // Distance-halving allgather: undo the splits, exchanging kept halves with the same peers.
  for (int distance = size / 2; distance >= 1; distance /= 2) {
    const int peer = rank ^ distance;
    const bool lower = (rank & distance) == 0;
    auto [outer_start, outer_end] = kept.back();
    kept.pop_back();
    const int64_t mid = outer_start + (outer_end - outer_start) / 2;
    const int64_t mine_start = lower ? outer_start : mid, mine_end = lower ? mid : outer_end;
    const int64_t theirs_start = lower ? mid : outer_start, theirs_end = lower ? outer_end : mid;
    backend.SendRecv({data + mine_start * element, (mine_end - mine_start) * static_cast<int64_t>(element),
                      data + theirs_start * element, (theirs_end - theirs_start) * static_cast<int64_t>(element),
                      peer});
  }
}

}  // namespace horovod
