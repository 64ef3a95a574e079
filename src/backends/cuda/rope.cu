// Rotary position embedding (rope.h): a thread rotates W pairs (4 where the head's half and the pointers
// allow 16-byte loads of float32, 8-byte loads of bf16; else 1) of one head of one row, reading the pairs'
// two halves and the table's cos and sin once and writing both halves back. The reference's expressions in
// its order, each product rounded before the sum as the CPU rounds it, so a float32 x comes out bit for bit
// as the CPU's; a bf16 x is rounded once at the end. The table rows are shared by every head and batch row,
// so they stay in L1/L2: the op moves x's bytes in and out once.
#include "rope.h"

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_pack;
using elementwise::Pack;
using ops_internal::aligned16;
using ops_internal::flat_grid;
using ops_internal::kThreads;
using ops_internal::store_pack;

struct RotaryShape {
  int64_t T;
  int64_t W;
  int64_t heads;
  int64_t half;    // hs / 2
  int64_t groups;  // of W pairs in one head
};

template <int kPairs, typename X>
__global__ void __launch_bounds__(kThreads)
    rotary_kernel(X* x, const float* table, RotaryShape s, int64_t work, float sin_sign) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < work; g += stride) {
    const int64_t i = (g % s.groups) * kPairs;
    const int64_t head_row = g / s.groups;  // (b T + t) heads + h
    const int64_t row = head_row / s.heads;
    const int64_t h = head_row - row * s.heads;
    const int64_t t = row % s.T;
    X* v = x + row * s.W + h * 2 * s.half + i;
    const float* cos = table + t * 2 * s.half + i;
    const Pack<kPairs> c = load_pack<kPairs>(cos), sn = load_pack<kPairs>(cos + s.half);
    Pack<kPairs> x1 = load_pack<kPairs>(v), x2 = load_pack<kPairs>(v + s.half);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const float sine = sin_sign * sn.v[k];  // exact: a sign
      const float a = x1.v[k], b = x2.v[k];
      x1.v[k] = __fsub_rn(__fmul_rn(a, c.v[k]), __fmul_rn(b, sine));
      x2.v[k] = __fadd_rn(__fmul_rn(b, c.v[k]), __fmul_rn(a, sine));
    }
    store_pack<kPairs>(v, x1);
    store_pack<kPairs>(v + s.half, x2);
  }
}

template <typename X>
void rotary_of(X* x, const float* table, int64_t B, int64_t T, int64_t W, int64_t heads, int64_t hs,
               bool inverse, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0 && heads >= 1 && hs >= 2 && hs % 2 == 0 && heads * hs <= W,
              "rotary_embedding: B, T >= 0 and {} heads of an even size {} within a row of {}, got B={} T={}",
              heads, hs, W, B, T);
  const int64_t half = hs / 2;
  if (B * T == 0) return;
  const bool vector = half % 4 == 0 && W % 4 == 0 && elementwise::pack_aligned(x) && aligned16(table);
  const int kPairs = vector ? 4 : 1;
  const RotaryShape s{T, W, heads, half, half / kPairs};
  const int64_t work = B * T * heads * s.groups;
  const float sin_sign = inverse ? -1.0f : 1.0f;
  if (vector) {
    rotary_kernel<4><<<flat_grid(work), kThreads, 0, stream>>>(x, table, s, work, sin_sign);
  } else {
    rotary_kernel<1><<<flat_grid(work), kThreads, 0, stream>>>(x, table, s, work, sin_sign);
  }
  OCTET_CUDA_CHECK_LAUNCH("rotary_kernel");
}

}  // namespace

void rotary_embedding(float* x, const float* table, int64_t B, int64_t T, int64_t W, int64_t heads,
                      int64_t hs, bool inverse, cudaStream_t stream) {
  rotary_of(x, table, B, T, W, heads, hs, inverse, stream);
}

void rotary_embedding(uint16_t* x, const float* table, int64_t B, int64_t T, int64_t W, int64_t heads,
                      int64_t hs, bool inverse, cudaStream_t stream) {
  rotary_of(x, table, B, T, W, heads, hs, inverse, stream);
}

}  // namespace octet::cuda
