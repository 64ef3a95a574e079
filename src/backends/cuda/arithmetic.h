// Element-wise float32 arithmetic on the GPU (arithmetic.cu), on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// out = a + b; out may be a (a += b).
void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
// x *= factor
void scale(float* x, int64_t n, float factor, cudaStream_t stream);
void fill_zero(float* x, int64_t n, cudaStream_t stream);

}  // namespace octet::cuda
