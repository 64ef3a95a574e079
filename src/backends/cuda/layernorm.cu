// LayerNorm's forward and backward (layernorm.h): a warp per row, the row's statistics in float64 as the
// CPU reference takes them; the backward's weight and bias gradients are the blocks' partial sums, added
// by column_sum (column_sum.cu). The conventions that every op follows are ops_common.cuh's.
#include "layernorm.h"

#include <algorithm>
#include <type_traits>

#include "column_sum.h"
#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::Pack;
using elementwise::store_pack;
using elementwise::warp_sum;
using ops_internal::aligned16;
using ops_internal::at_offset;
using ops_internal::ceil_div;
using ops_internal::column_sum;
using ops_internal::ColumnSumPlan;
using ops_internal::device_attribute;
using ops_internal::kDefaultSharedBytes;
using ops_internal::kThreads;
using ops_internal::Layout;
using ops_internal::plan_column_sum;
using ops_internal::store_pack;

// ---------------------------------------------------------------------------------------------------------
// LayerNorm: one warp per row. The row's statistics are float64 sums, as in the reference; the row is read
// once per pass and stays in L1 between passes. The forward arithmetic is elementwise.cuh's, shared with the
// fused LayerNorm cast.

constexpr int kLayernormForwardWarps = kThreads / kWarp;
constexpr int kLayernormBackwardWarps = 4;       // per block, each with its own dweight/dbias partials
constexpr int kLayernormBackwardHeldBlocks = 4;  // the held-row kernel's blocks a multiprocessor must hold

// Out: float, or uint16_t for bf16 (the float32 value rounded once).
template <int W, typename Out>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(Out* out, float* mean, float* rstd, const float* inp, const float* weight,
                             const float* bias, int64_t N, int64_t C) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kLayernormForwardWarps + threadIdx.x / kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const elementwise::RowStatistics r = elementwise::layernorm_statistics<W>(x, C, lane);
  Out* o = out + row * C;
  for (int64_t i = lane * W; i < C; i += kWarp * W)
    store_pack<W>(o + i, elementwise::layernorm_normalise<W>(x, weight, bias, i, r));
  if (lane == 0) {
    mean[row] = r.mean;
    rstd[row] = r.rstd;
  }
}

// The steps of LayerNorm's backward shared by its streaming and held-row kernels, on W elements of a row
// (dp, xp, wp: dout, inp and weight there). The first pass adds their dnorm and dnorm * norm terms into the
// lane's float64 sums; the second updates dinp there (di) and the warp's dweight and dbias partials.
template <int W>
__device__ __forceinline__ void layernorm_backward_sums(const Pack<W>& dp, const Pack<W>& xp,
                                                        const Pack<W>& wp, float m, float s,
                                                        double& dnorm_sum, double& dnorm_norm_sum) {
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float norm = __fmul_rn(__fsub_rn(xp.v[k], m), s);
    const float dnorm = __fmul_rn(wp.v[k], dp.v[k]);
    dnorm_sum = __dadd_rn(dnorm_sum, static_cast<double>(dnorm));
    dnorm_norm_sum =
        __dadd_rn(dnorm_norm_sum, __dmul_rn(static_cast<double>(dnorm), static_cast<double>(norm)));
  }
}
template <int W>
__device__ __forceinline__ void layernorm_backward_update(const Pack<W>& dp, const Pack<W>& xp,
                                                          const Pack<W>& wp, float m, float s, float a,
                                                          float b, float* di, float* dweight_acc,
                                                          float* dbias_acc) {
  Pack<W> gp = load_pack<W>(di);
  Pack<W> bias_acc = load_pack<W>(dbias_acc);
  Pack<W> weight_acc = load_pack<W>(dweight_acc);
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float norm = __fmul_rn(__fsub_rn(xp.v[k], m), s);
    const float dnorm = __fmul_rn(wp.v[k], dp.v[k]);
    bias_acc.v[k] = __fadd_rn(bias_acc.v[k], dp.v[k]);
    weight_acc.v[k] = __fadd_rn(weight_acc.v[k], __fmul_rn(norm, dp.v[k]));
    const float centred = __fsub_rn(__fsub_rn(dnorm, a), __fmul_rn(norm, b));
    gp.v[k] = __fadd_rn(gp.v[k], __fmul_rn(centred, s));
  }
  store_pack<W>(di, gp);
  store_pack<W>(dbias_acc, bias_acc);
  store_pack<W>(dweight_acc, weight_acc);
}
// The block's partials: its warps' [2][C] partials in shared memory, added in warp order, to
// partials[blockIdx.x]. Every thread of the block must call it.
__device__ __forceinline__ void write_block_partials(float* partials, const float* warp_partials, int warps,
                                                     int64_t C) {
  __syncthreads();
  float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * 2 * C;
  for (int64_t i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float total = warp_partials[i];
    for (int w = 1; w < warps; ++w) total = __fadd_rn(total, warp_partials[w * 2 * C + i]);
    block_partials[i] = total;
  }
}

// A warp's place in a LayerNorm backward block: the block's warps, this warp and lane, and this warp's own
// partials in shared memory (dweight's [C], then dbias's [C]), which this zeroes for the whole block: every
// thread of the block must call it.
struct LayernormBackwardWarp {
  int warps;
  int warp;
  int lane;
  float* dweight_acc;
  float* dbias_acc;
};
__device__ __forceinline__ LayernormBackwardWarp layernorm_backward_warp(float* warp_partials, int64_t C) {
  const int warps = static_cast<int>(blockDim.x / kWarp);
  const int warp = static_cast<int>(threadIdx.x / kWarp);
  for (int64_t i = threadIdx.x; i < warps * 2 * C; i += blockDim.x) warp_partials[i] = 0.0f;
  __syncthreads();
  float* dweight_acc = warp_partials + warp * 2 * C;
  return {warps, warp, static_cast<int>(threadIdx.x % kWarp), dweight_acc, dweight_acc + C};
}

// Accumulates dinp row by row; each warp adds its rows' dweight and dbias terms into its own partials in
// shared memory ([warps][2][C]: dweight, then dbias), each lane always touching the same columns. The block
// then adds its warps' partials in order and writes them to partials [gridDim.x][2][C].
template <int W, typename Dout>
__global__ void __launch_bounds__(kLayernormBackwardWarps* kWarp)
    layernorm_backward_kernel(float* dinp, float* partials, const Dout* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int64_t N,
                              int64_t C) {
  extern __shared__ float warp_partials[];
  const auto [warps, warp, lane, dweight_acc, dbias_acc] = layernorm_backward_warp(warp_partials, C);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const Dout* d = dout + row * C;
    const float* x = inp + row * C;
    const float m = mean[row];
    const float s = rstd[row];
    double dnorm_sum = 0.0;
    double dnorm_norm_sum = 0.0;
    float* di = dinp + row * C;
    // Four iterations' loads in flight (no store in this loop to order them after); the second loop's dinp,
    // which nothing has read yet, fetched into L2 meanwhile.
#pragma unroll 4
    for (int64_t i = lane * W; i < C; i += kWarp * W) {
      asm volatile("prefetch.global.L2 [%0];" : : "l"(di + i));
      layernorm_backward_sums<W>(load_pack<W>(d + i), load_pack<W>(x + i), load_pack<W>(weight + i), m, s,
                                 dnorm_sum, dnorm_norm_sum);
    }
    const float a = static_cast<float>(warp_sum(dnorm_sum) / static_cast<double>(C));
    const float b = static_cast<float>(warp_sum(dnorm_norm_sum) / static_cast<double>(C));
    for (int64_t i = lane * W; i < C; i += kWarp * W) {
      layernorm_backward_update<W>(load_pack<W>(d + i), load_pack<W>(x + i), load_pack<W>(weight + i), m, s,
                                   a, b, di + i, dweight_acc + i, dbias_acc + i);
    }
  }
  write_block_partials(partials, warp_partials, warps, C);
}

// Where layernorm_backward_held_kernel's lane holds pack k of a row: elements 4 lane + 128 k .. + 3.
__device__ __forceinline__ int64_t held_at(int lane, int k) {
  return 4 * lane + 4 * kWarp * k;
}

// layernorm_backward_kernel with each row held in registers (W = 4, C <= 128 x Packs): a lane issues all its
// loads of dout and inp for a row at once, and the second pass reads them from registers rather than from
// L1/L2 (at GPT-2 1.5B's C = 1600 the streaming kernel ran at 2.0 TB/s, waiting on DRAM). The same values in
// the same order, so the same bits.
template <int Packs, typename Dout>
__global__ void __launch_bounds__(kLayernormBackwardWarps* kWarp, kLayernormBackwardHeldBlocks)
    layernorm_backward_held_kernel(float* dinp, float* partials, const Dout* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd, int64_t N,
                                   int64_t C) {
  extern __shared__ float warp_partials[];
  const auto [warps, warp, lane, dweight_acc, dbias_acc] = layernorm_backward_warp(warp_partials, C);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const Dout* d = dout + row * C;
    const float* x = inp + row * C;
    float* di = dinp + row * C;
    // Lane l holds the packs at elements 4l + 128k, k < Packs, of those below C.
    elementwise::Raw<4, Dout> held_dout[Packs];
    Pack<4> held_inp[Packs];
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i < C) {
        asm volatile("prefetch.global.L2 [%0];" : : "l"(di + i));
        held_dout[k] = elementwise::load_raw<4>(d + i);
      }
    }
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i < C) held_inp[k] = load_pack<4>(x + i);
    }
    const float m = mean[row];
    const float s = rstd[row];
    double dnorm_sum = 0.0;
    double dnorm_norm_sum = 0.0;
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i >= C) continue;
      layernorm_backward_sums<4>(elementwise::widen(held_dout[k]), held_inp[k], load_pack<4>(weight + i), m,
                                 s, dnorm_sum, dnorm_norm_sum);
    }
    const float a = static_cast<float>(warp_sum(dnorm_sum) / static_cast<double>(C));
    const float b = static_cast<float>(warp_sum(dnorm_norm_sum) / static_cast<double>(C));
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i >= C) continue;
      layernorm_backward_update<4>(elementwise::widen(held_dout[k]), held_inp[k], load_pack<4>(weight + i), m,
                                   s, a, b, di + i, dweight_acc + i, dbias_acc + i);
    }
  }
  write_block_partials(partials, warp_partials, warps, C);
}

template <typename Out>
void layernorm_forward_of(Out* out, float* mean, float* rstd, const float* inp, const float* weight,
                          const float* bias, int64_t N, int64_t C, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && C > 0, "layernorm_forward: N >= 0 and C > 0, got N={} C={}", N, C);
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(ceil_div(N, kLayernormForwardWarps));
  if (C % 4 == 0 && elementwise::pack_aligned(out) && aligned16(inp) && aligned16(weight) &&
      aligned16(bias)) {
    layernorm_forward_kernel<4><<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  } else {
    layernorm_forward_kernel<1><<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream) {
  layernorm_forward_of(out, mean, rstd, inp, weight, bias, N, C, stream);
}

void layernorm_forward(uint16_t* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream) {
  layernorm_forward_of(out, mean, rstd, inp, weight, bias, N, C, stream);
}

namespace {

// The backward kernel for a shape: rows held in registers for BF16 gradients (whose held values take half
// the registers) of 1028 to 1664 channels (GPT-2 1.5B's 1600: 9 to 13 packs a lane), where it measured
// faster; else streamed, which keeps twice the warps resident.
template <typename Dout>
auto layernorm_backward_choice(bool vectorize, int64_t C) {
  const int64_t packs = (C + 4 * kWarp - 1) / (4 * kWarp);
  if constexpr (std::is_same_v<Dout, uint16_t>) {
    if (vectorize && packs > 8 && packs <= 13) return layernorm_backward_held_kernel<13, Dout>;
  }
  return vectorize ? layernorm_backward_kernel<4, Dout> : layernorm_backward_kernel<1, Dout>;
}

template <typename Dout>
void layernorm_backward_of(float* dinp, float* dweight, float* dbias, const Dout* dout, const float* inp,
                           const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                           Workspace& workspace, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && C > 0, "layernorm_backward: N >= 0 and C > 0, got N={} C={}", N, C);
  if (N == 0) return;
  const size_t warp_bytes = static_cast<size_t>(2 * C) * sizeof(float);
  const size_t shared_limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  const int warps = static_cast<int>(std::min<size_t>(kLayernormBackwardWarps, shared_limit / warp_bytes));
  OCTET_REQUIRE(warps >= 1,
                "layernorm_backward: C={} needs {} bytes of shared memory per warp, the device has {}", C,
                warp_bytes, shared_limit);
  const size_t shared_bytes = static_cast<size_t>(warps) * warp_bytes;
  const bool vectorize =
      C % 4 == 0 && aligned16(dinp) && elementwise::pack_aligned(dout) && aligned16(inp) && aligned16(weight);
  const auto kernel = layernorm_backward_choice<Dout>(vectorize, C);
  if (shared_bytes > kDefaultSharedBytes) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
  }
  // One wave of equal blocks: the most the GPU holds at once, each warp given the same number of rows, so
  // that no block starts after the others have finished (a second wave of a few blocks, or warps with one
  // row more than the rest, would leave the GPU idling). The rows of a warp, and so the order of the
  // dweight and dbias partial sums, depend on the shape and the GPU's size.
  int resident_per_multiprocessor = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident_per_multiprocessor, kernel,
                                                                 warps * kWarp, shared_bytes));
  const int64_t resident = static_cast<int64_t>(device_attribute(cudaDevAttrMultiProcessorCount)) *
                           std::max(resident_per_multiprocessor, 1);
  const int64_t rows_per_warp = std::max<int64_t>(ceil_div(N, resident * warps), 1);
  const int64_t blocks = ceil_div(N, warps * rows_per_warp);

  const bool joint = dbias == dweight + C;  // one column sum for both (below)
  const int64_t sum_columns = joint ? 2 * C : C;
  const ColumnSumPlan plan = plan_column_sum(blocks, sum_columns);
  Layout layout;
  const size_t partials_at = layout.reserve(static_cast<size_t>(blocks) * warp_bytes);
  const size_t scratch_at = layout.reserve(plan.scratch_floats(sum_columns) * sizeof(float));
  void* base = workspace.get(layout.bytes, stream);
  float* partials = at_offset<float>(base, partials_at);
  float* scratch = at_offset<float>(base, scratch_at);

  kernel<<<static_cast<unsigned>(blocks), warps * kWarp, shared_bytes, stream>>>(dinp, partials, dout, inp,
                                                                                 weight, mean, rstd, N, C);
  OCTET_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  // Rows of partials hold dweight then dbias: one sum over 2C columns where the gradients lie so too (a
  // LayerNorm's weight and bias in the model's parameters), else one each; stage two of each may reuse the
  // scratch, being ordered on the stream.
  if (joint) {
    column_sum(partials, 2 * C, blocks, 2 * C, dweight, plan, scratch, stream);
  } else {
    column_sum(partials, 2 * C, blocks, C, dweight, plan, scratch, stream);
    column_sum(partials + C, 2 * C, blocks, C, dbias, plan, scratch, stream);
  }
}

}  // namespace

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream) {
  layernorm_backward_of(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, workspace, stream);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const uint16_t* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream) {
  layernorm_backward_of(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, workspace, stream);
}

}  // namespace octet::cuda
