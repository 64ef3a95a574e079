// The row moves of a mixture-of-experts layer (expert_rows.h). gather_rows and combine_rows are element-wise
// over their output (four columns at a time where the rows allow 16-byte loads) and compute each element as
// the CPU reference (src/backends/cpu/cpu_routing.cpp) does, one product and one sum at a time in j order,
// each rounded as it rounds them: their results are the reference's bits. row_dots gives each dot product a
// warp: lane l sums the products of columns 4 l .. 4 l + 3, 4 (l + 32) .., in order, and a butterfly adds
// the lanes; the order depends on C alone (the scalar path takes the same groups of four), so the results
// are bitwise repeatable but not the reference's sequential sums. scatter_rows (rows copied to their places:
// a sum of gathered rows written back) copies bits. The conventions that every op follows are
// ops_common.cuh's.
#include "expert_rows.h"

#include <type_traits>

#include "elementwise.cuh"
#include "gathered_rows.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_pack;
using elementwise::Pack;
using ops_internal::store_pack;  // float32 (elementwise.cuh's) and bf16
using ops_internal::aligned16;
using ops_internal::ceil_div;
using ops_internal::check_size;
using ops_internal::for_each;
using ops_internal::kThreads;
using ops_internal::kWarp;
using ops_internal::warp_float_sum;

// With W = 4, C is a multiple of 4, so a group of four elements lies in one row. Out is float (float32) or
// uint16_t (bf16: each float32 value rounded once, to nearest even).
template <typename Out>
struct GatherRows {
  Out* out;
  const float* src;
  const int32_t* index;
  const float* scale;  // null: 1
  int64_t R;
  int64_t C;
  int64_t divisor;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t m = i / C;
    store_pack<W>(out + i, elementwise::gathered<W>(src, index, scale, R, C, divisor, m, i - m * C));
  }
};

// out may be base: each element is read and then written by the same thread.
struct CombineRows {
  float* out;
  const float* base;  // null: zero
  const float* src;
  const int32_t* positions;
  const float* weights;  // null: 1
  int64_t C;
  int64_t k;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t r = i / C;
    const int64_t c = i - r * C;
    Pack<W> sum;
    if (base != nullptr) {
      sum = load_pack<W>(base + i);
    } else {
#pragma unroll
      for (int v = 0; v < W; ++v) sum.v[v] = 0.0f;
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t m = positions[r * k + j];
      const float w = weights != nullptr ? weights[r * k + j] : 1.0f;
      const Pack<W> s = load_pack<W>(src + m * C + c);
#pragma unroll
      for (int v = 0; v < W; ++v) sum.v[v] = __fadd_rn(sum.v[v], __fmul_rn(w, s.v[v]));
    }
    store_pack<W>(out + i, sum);
  }
};

// Element-wise over src: each element copied to its row of out. With W = 4, C is a multiple of 4.
struct ScatterRows {
  float* out;
  const float* src;
  const int32_t* index;
  int64_t R;
  int64_t C;
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t m = i / C;
    const int64_t r = index[m];
    if (r < 0 || r >= R) return;
    store_pack<W>(out + r * C + (i - m * C), load_pack<W>(src + i));
  }
};

constexpr int kDotsPerBlock = kThreads / kWarp;

// A warp per dot product. Vector: C is a multiple of 4 and the rows 16-byte aligned.
template <bool Vector>
__global__ void __launch_bounds__(kThreads)
    row_dots_kernel(float* out, const float* a, const float* src, const int32_t* positions, int64_t outputs,
                    int64_t C, int64_t k) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kDotsPerBlock + threadIdx.x / kWarp;  // r k + j
  if (o >= outputs) return;  // the whole warp: o is the warp's
  const float* x = a + (o / k) * C;
  const float* y = src + static_cast<int64_t>(positions[o]) * C;
  float acc = 0.0f;
  for (int64_t c = 4 * lane; c < C; c += 4 * kWarp) {
    Pack<4> p, q;
    if constexpr (Vector) {
      p = load_pack<4>(x + c);
      q = load_pack<4>(y + c);
    } else {
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        p.v[v] = c + v < C ? x[c + v] : 0.0f;
        q.v[v] = c + v < C ? y[c + v] : 0.0f;
      }
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) acc = __fmaf_rn(p.v[v], q.v[v], acc);
  }
  acc = warp_float_sum(acc);
  if (lane == 0) out[o] = acc;
}

}  // namespace

namespace {

template <typename Out>
void gather_rows_as(Out* out, const float* src, const int32_t* index, const float* scale, int64_t M, int64_t R,
                    int64_t C, int64_t divisor, cudaStream_t stream) {
  check_size(M, "gather_rows");
  check_size(R, "gather_rows");
  check_size(C, "gather_rows");
  OCTET_CHECK(divisor >= 1, "gather_rows: the divisor is at least 1, given {}", divisor);
  if (M * C == 0) return;
  bool out_aligned = false;
  if constexpr (std::is_same_v<Out, float>) {
    out_aligned = aligned16(out);
  } else {
    out_aligned = elementwise::pack_aligned(out);
  }
  const bool vector = C % 4 == 0 && out_aligned && aligned16(src);
  for_each(GatherRows<Out>{out, src, index, scale, R, C, divisor}, M * C, vector, stream);
  OCTET_CUDA_CHECK_LAUNCH("gather_rows");
}

}  // namespace

void gather_rows(float* out, const float* src, const int32_t* index, const float* scale, int64_t M, int64_t R,
                 int64_t C, int64_t divisor, cudaStream_t stream) {
  gather_rows_as(out, src, index, scale, M, R, C, divisor, stream);
}

void gather_rows(uint16_t* out, const float* src, const int32_t* index, const float* scale, int64_t M,
                 int64_t R, int64_t C, int64_t divisor, cudaStream_t stream) {
  gather_rows_as(out, src, index, scale, M, R, C, divisor, stream);
}

void combine_rows(float* out, const float* base, const float* src, const int32_t* positions,
                  const float* weights, int64_t R, int64_t C, int64_t k, cudaStream_t stream) {
  check_size(R, "combine_rows");
  check_size(C, "combine_rows");
  check_size(k, "combine_rows");
  if (R * C == 0) return;
  const bool vector = C % 4 == 0 && aligned16(out) && aligned16(src) && (base == nullptr || aligned16(base));
  for_each(CombineRows{out, base, src, positions, weights, C, k}, R * C, vector, stream);
  OCTET_CUDA_CHECK_LAUNCH("combine_rows");
}

void scatter_rows(float* out, const float* src, const int32_t* index, int64_t M, int64_t R, int64_t C,
                  cudaStream_t stream) {
  check_size(M, "scatter_rows");
  check_size(R, "scatter_rows");
  check_size(C, "scatter_rows");
  if (M * C == 0) return;
  const bool vector = C % 4 == 0 && aligned16(out) && aligned16(src);
  for_each(ScatterRows{out, src, index, R, C}, M * C, vector, stream);
  OCTET_CUDA_CHECK_LAUNCH("scatter_rows");
}

void row_dots(float* out, const float* a, const float* src, const int32_t* positions, int64_t R, int64_t C,
              int64_t k, cudaStream_t stream) {
  check_size(R, "row_dots");
  check_size(C, "row_dots");
  check_size(k, "row_dots");
  const int64_t outputs = R * k;
  if (outputs == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div(outputs, kDotsPerBlock));
  if (C % 4 == 0 && aligned16(a) && aligned16(src)) {
    row_dots_kernel<true><<<blocks, kThreads, 0, stream>>>(out, a, src, positions, outputs, C, k);
  } else {
    row_dots_kernel<false><<<blocks, kThreads, 0, stream>>>(out, a, src, positions, outputs, C, k);
  }
  OCTET_CUDA_CHECK_LAUNCH("row_dots_kernel");
}

}  // namespace octet::cuda
