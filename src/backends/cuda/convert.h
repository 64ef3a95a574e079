// Conversions between float32 and the 16-bit formats on the GPU (convert.cu), on device pointers, enqueued
// on a stream.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "octet/numerics/minifloat.h"

namespace octet::cuda {

// Conversions round to nearest, ties to even, as octet::round_to_bf16 / round_to_f16.
void convert_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream);
// out = the float32 value of each bf16 (exact).
void convert_from_bf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream);
void convert_to_f16(__half* out, const float* in, int64_t n, cudaStream_t stream);
// x = round_to_bf16(x) or round_to_f16(x); `dtype` is Dtype::bf16 or Dtype::f16.
void round_in_place(float* x, int64_t n, Dtype dtype, cudaStream_t stream);
// out = in rounded so, in one pass (out may be in).
void round_copy(float* out, const float* in, int64_t n, Dtype dtype, cudaStream_t stream);

}  // namespace octet::cuda
