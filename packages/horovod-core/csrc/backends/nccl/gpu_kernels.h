// CUDA kernels of the NCCL plugin: the batched copy into and out of the fusion buffer, and
// scaling by a factor (prescale, postscale, average). Both enqueue on `stream` and return the
// launch's error code (cudaSuccess when none).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/common.h"
#include "backends/nccl/gpu_ops.h"

namespace horovod {
namespace gpu {

cudaError_t BatchedCopy(const DeviceCopy* copies, size_t count, cudaStream_t stream);
cudaError_t Scale(void* data, int64_t count, DataType dtype, double factor, cudaStream_t stream);

}  // namespace gpu
}  // namespace horovod
