// The element arithmetic of a gather of rows, shared by expert_rows.cu's gather_rows and fused_gather.cu's
// gather with an FP8 cast, so that both compute each element alike. Internal to the CUDA backend: include only
// from .cu files.
#pragma once

#include <cstdint>

#include "elementwise.cuh"

namespace octet::cuda::elementwise {

// Elements c .. c+W-1 of row m of a gather of rows (expert_rows.h's gather_rows and the fused gather's):
// scale[a] (null: 1) x src [R, C] row a / divisor, a = index[m], one product per element (without a scale,
// a copy); zero where a < 0 (padding), NaN where the row lies past src's R rows (an index the host cannot
// check inside a step).
template <int W>
__device__ __forceinline__ Pack<W> gathered(const float* src, const int32_t* index, const float* scale, int64_t R,
                                            int64_t C, int64_t divisor, int64_t m, int64_t c) {
  const int64_t a = index[m];
  Pack<W> x;
  if (a < 0 || a / divisor >= R) {
    const float fill = a < 0 ? 0.0f : __int_as_float(0x7FC00000);
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = fill;
    return x;
  }
  x = load_pack<W>(src + (a / divisor) * C + c);
  if (scale != nullptr) {
    const float f = scale[a];
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = __fmul_rn(f, x.v[k]);
  }
  return x;
}

}  // namespace octet::cuda::elementwise
