#include "gpu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace horovod {
namespace gpu {

namespace {

// Copies per launch: the descriptors travel as a kernel parameter (no host-to-device copy of a
// table), so one launch takes up to this many tensors; a larger fusion takes several launches.
constexpr int kCopiesPerLaunch = 32;
constexpr int kThreads = 256;

struct CopyBatch {
  const void* src[kCopiesPerLaunch];
  void* dst[kCopiesPerLaunch];
  size_t bytes[kCopiesPerLaunch];
};

// blockIdx.y picks the copy; the blocks along x stride over its bytes, 16 at a time when both
// pointers and the length allow it (the fusion buffer keeps tensors 16-byte aligned), else byte by
// byte.
__global__ void BatchedCopyKernel(CopyBatch batch) {
  const int c = blockIdx.y;
  const char* src = static_cast<const char*>(batch.src[c]);
  char* dst = static_cast<char*>(batch.dst[c]);
  const size_t bytes = batch.bytes[c];
  const size_t start = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  const bool vector = (reinterpret_cast<uintptr_t>(src) % 16 == 0) && (reinterpret_cast<uintptr_t>(dst) % 16 == 0);
  size_t done = 0;
  if (vector) {
    const size_t n = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (size_t i = start; i < n; i += step) d[i] = s[i];
    done = n * 16;
  }
  for (size_t i = done + start; i < bytes; i += step) dst[i] = src[i];
}

template <typename T>
__global__ void ScaleKernel(T* data, int64_t count, double factor) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = static_cast<T>(static_cast<double>(data[i]) * factor);
  }
}

__global__ void ScaleHalfKernel(__half* data, int64_t count, float factor) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = __float2half(__half2float(data[i]) * factor);
  }
}

__global__ void ScaleBfloat16Kernel(__nv_bfloat16* data, int64_t count, float factor) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = __float2bfloat16(__bfloat162float(data[i]) * factor);
  }
}

__global__ void ScaleFloatKernel(float* data, int64_t count, float factor) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] *= factor;
  }
}

unsigned int Blocks(int64_t work) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, 4096)));
}

}  // namespace

cudaError_t BatchedCopy(const DeviceCopy* copies, size_t count, cudaStream_t stream) {
  for (size_t first = 0; first < count; first += kCopiesPerLaunch) {
    CopyBatch batch{};
    const int n = static_cast<int>(std::min<size_t>(kCopiesPerLaunch, count - first));
    size_t largest = 0;
    for (int i = 0; i < n; ++i) {
      batch.src[i] = copies[first + i].src;
      batch.dst[i] = copies[first + i].dst;
      batch.bytes[i] = copies[first + i].bytes;
      largest = std::max(largest, copies[first + i].bytes);
    }
    if (largest == 0) continue;
    dim3 grid(Blocks(static_cast<int64_t>((largest + 15) / 16)), n);
    BatchedCopyKernel<<<grid, kThreads, 0, stream>>>(batch);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t Scale(void* data, int64_t count, DataType dtype, double factor, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned int blocks = Blocks(count);
  switch (dtype) {
    case DataType::UINT8: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(data), count, factor); break;
    case DataType::INT8: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<int8_t*>(data), count, factor); break;
    case DataType::UINT16: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(data), count, factor); break;
    case DataType::INT16: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<int16_t*>(data), count, factor); break;
    case DataType::INT32: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<int32_t*>(data), count, factor); break;
    case DataType::INT64: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<int64_t*>(data), count, factor); break;
    case DataType::FLOAT16:
      ScaleHalfKernel<<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(data), count, static_cast<float>(factor));
      break;
    case DataType::BFLOAT16:
      ScaleBfloat16Kernel<<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count,
                                                           static_cast<float>(factor));
      break;
    case DataType::FLOAT32:
      ScaleFloatKernel<<<blocks, kThreads, 0, stream>>>(static_cast<float*>(data), count, static_cast<float>(factor));
      break;
    case DataType::FLOAT64: ScaleKernel<<<blocks, kThreads, 0, stream>>>(static_cast<double*>(data), count, factor); break;
    default: return cudaErrorInvalidValue;  // bool: refused at enqueue
  }
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace horovod
