#include "collectives/float32_accumulation.h"

#include "common/reduction.h"

namespace horovod {

bool AccumulatesInFloat32(DataType dtype, int32_t device) {
  return dtype == DataType::BFLOAT16 && device == kCpuDevice;
}

std::vector<int64_t> SplitCounts(int64_t count, int size) {
  std::vector<int64_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = count / size + (r < count % size ? 1 : 0);
  return counts;
}

void ReducescatterInFloat32(Communicator& comm, const uint16_t* input, const std::vector<int64_t>& counts,
                            ReduceOp op, double prescale, double postscale, uint16_t* output) {
  int64_t count = 0, offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) == comm.rank()) offset = count;
    count += counts[r];
  }
  const int64_t mine = counts[comm.rank()];
  // The float32 staging buffer: one per thread (the background thread, or a caller running a
  // cycle), kept between calls so that a training step's reductions reuse it.
  thread_local Float32Staging staging;
  float* wide = staging.Widen(input, count, static_cast<float>(prescale));
  comm.Reducescatter({wide, count, counts, DataType::FLOAT32, op});
  NarrowToBfloat16(wide + offset, mine, static_cast<float>(postscale), output);
}

void AllreduceInFloat32(Communicator& comm, uint16_t* buffer, int64_t count, ReduceOp op, double prescale,
                        double postscale) {
  if (comm.AllreduceBfloat16InFloat32(buffer, count, op, static_cast<float>(prescale), static_cast<float>(postscale))) {
    return;
  }
  std::vector<int64_t> counts = SplitCounts(count, comm.size());
  // This rank's rounded block, apart from the buffer that the allgather writes.
  std::vector<uint16_t> mine(counts[comm.rank()]);
  ReducescatterInFloat32(comm, buffer, counts, op, prescale, postscale, mine.data());
  std::vector<int64_t> bytes(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * static_cast<int64_t>(sizeof(uint16_t));
  comm.Allgather({mine.data(), buffer, std::move(bytes)});
}

}  // namespace horovod
