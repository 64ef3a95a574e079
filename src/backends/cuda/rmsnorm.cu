// RMSNorm's forward and backward (rmsnorm.h), LayerNorm's kernels (layernorm.cu) without the mean and the
// bias, with the row sums in float64 as the CPU reference takes them. The forward takes a warp per row. The
// backward takes a block per row with the row in registers, so that it reads dout and x once and reads and
// writes dinp once (rows up to 8192 wide; wider rows take two passes over the row, a warp per row); its
// weight gradient is the blocks' partial sums, added by column_sum (column_sum.cu). The conventions that
// every op follows are ops_common.cuh's.
#include "rmsnorm.h"

#include <algorithm>

#include "column_sum.h"
#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::load_raw;
using elementwise::Pack;
using elementwise::Raw;
using elementwise::store_pack;
using elementwise::warp_sum;
using elementwise::widen;
using ops_internal::aligned16;
using ops_internal::at_offset;
using ops_internal::block_sum;
using ops_internal::ceil_div;
using ops_internal::column_sum;
using ops_internal::ColumnSumPlan;
using ops_internal::device_attribute;
using ops_internal::kDefaultSharedBytes;
using ops_internal::kThreads;
using ops_internal::Layout;
using ops_internal::plan_column_sum;
using ops_internal::store_pack;

constexpr int kForwardWarps = kThreads / kWarp;
// The backward takes Columns = 4, 8 or 16 columns of a row per thread: the fewest that need at most
// kBackwardThreads threads a row, else 16 columns and up to kBackwardMaxThreads threads.
constexpr int kBackwardThreads = 256;
constexpr int kBackwardMaxThreads = 512;
constexpr int kBackwardMaxColumns = 16;
constexpr int64_t kMaxRegisterWidth = int64_t{kBackwardMaxThreads} * kBackwardMaxColumns;  // 8192
constexpr int kWideWarps = 4;  // per block of the wide rows' kernel, each with its own dweight partials

// Out: float, or uint16_t for bf16 (the float32 value rounded once).
template <int W, typename Out>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_kernel(Out* out, float* rstd, const float* inp, const float* weight, int64_t N,
                           int64_t C) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardWarps + threadIdx.x / kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float s = elementwise::rmsnorm_rstd<W>(x, C, lane);
  Out* o = out + row * C;
  for (int64_t i = lane * W; i < C; i += kWarp * W)
    store_pack<W>(o + i, elementwise::rmsnorm_normalise<W>(x, weight, i, s));
  if (lane == 0) rstd[row] = s;
}

// The reference's backward of one row: b = mean((weight * dout) (x rstd)) in float64, then
// dinp += (weight * dout - norm * b) * rstd and dweight += norm * dout, norm = x * rstd.
//
// A block of T threads takes one row at a time, rows blockIdx.x, + gridDim.x, ...; thread t holds Columns of
// each row in registers, Columns / W packs of W, pack k at columns (t + k T) W (a warp reads 32 consecutive
// packs). It loads its share of dout, x and dinp at once, adds its terms of b in pack order, and block_sum
// adds the threads' sums in a fixed order; then it updates its dinp in registers and stores it, and adds its
// dweight terms into registers, weight being loaded once. At the end the block writes its dweight sums to
// partials [gridDim.x][C], which column_sum adds. So a row's dout and x are read once and its dinp read and
// written once: 4 (dout; bf16 2) + 4 + 8 bytes an element, the op's floor, plus gridDim.x rows of partials
// written and read again (some 4 MiB at N = 8192, C = 2048, against 256 MiB of rows).
template <int W, int Columns, typename Dout>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    rmsnorm_backward_kernel(float* dinp, float* partials, const Dout* dout, const float* inp,
                            const float* weight, const float* rstd, int64_t N, int64_t C) {
  constexpr int kPacks = Columns / W;
  const int first = static_cast<int>(threadIdx.x) * W, step = static_cast<int>(blockDim.x) * W;
  Pack<W> w[kPacks], dweight_acc[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = first + k * step;
    if (i < C) w[k] = load_pack<W>(weight + i);
#pragma unroll
    for (int j = 0; j < W; ++j) dweight_acc[k].v[j] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const Dout* d = dout + row * C;
    const float* x = inp + row * C;
    float* di = dinp + row * C;
    const float s = rstd[row];
    Raw<W, Dout> dr[kPacks];
    Pack<W> xp[kPacks], gp[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = first + k * step;
      if (i < C) {
        dr[k] = load_raw<W>(d + i);
        xp[k] = load_pack<W>(x + i);
        gp[k] = load_pack<W>(di + i);
      }
    }
    double dnorm_norm_sum = 0.0;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (first + k * step >= C) continue;
      const Pack<W> dp = widen(dr[k]);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const double dnorm = static_cast<double>(__fmul_rn(w[k].v[j], dp.v[j]));
        dnorm_norm_sum =
            __dadd_rn(dnorm_norm_sum, __dmul_rn(dnorm, static_cast<double>(__fmul_rn(xp[k].v[j], s))));
      }
    }
    const float b = static_cast<float>(block_sum(dnorm_norm_sum) / static_cast<double>(C));
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int i = first + k * step;
      if (i >= C) continue;
      const Pack<W> dp = widen(dr[k]);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float norm = __fmul_rn(xp[k].v[j], s);
        dweight_acc[k].v[j] = __fadd_rn(dweight_acc[k].v[j], __fmul_rn(norm, dp.v[j]));
        const float centred = __fsub_rn(__fmul_rn(w[k].v[j], dp.v[j]), __fmul_rn(norm, b));
        gp[k].v[j] = __fadd_rn(gp[k].v[j], __fmul_rn(centred, s));
      }
      store_pack<W>(di + i, gp[k]);
    }
  }
  float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * C;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int i = first + k * step;
    if (i < C) store_pack<W>(block_partials + i, dweight_acc[k]);
  }
}

// Rows wider than kMaxRegisterWidth, in two passes: a warp per row, the first pass for b, the second (from L2
// at best) for the update. Each warp adds its rows' dweight terms into its own partials in shared memory
// ([warps][C]), each lane always touching the same columns; the block then adds its warps' partials in order
// and writes them to partials [gridDim.x][C].
template <int W, typename Dout>
__global__ void __launch_bounds__(kWideWarps* kWarp)
    rmsnorm_backward_wide_kernel(float* dinp, float* partials, const Dout* dout, const float* inp,
                                 const float* weight, const float* rstd, int64_t N, int64_t C) {
  extern __shared__ float warp_partials[];
  const int warps = static_cast<int>(blockDim.x / kWarp);
  const int warp = static_cast<int>(threadIdx.x / kWarp);
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t i = threadIdx.x; i < warps * C; i += blockDim.x) warp_partials[i] = 0.0f;
  __syncthreads();
  float* dweight_acc = warp_partials + warp * C;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const Dout* d = dout + row * C;
    const float* x = inp + row * C;
    float* di = dinp + row * C;
    const float s = rstd[row];
    double dnorm_norm_sum = 0.0;
#pragma unroll 4
    for (int64_t i = lane * W; i < C; i += kWarp * W) {
      asm volatile("prefetch.global.L2 [%0];" : : "l"(di + i));
      const Pack<W> dp = load_pack<W>(d + i), xp = load_pack<W>(x + i), wp = load_pack<W>(weight + i);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const double dnorm = static_cast<double>(__fmul_rn(wp.v[k], dp.v[k]));
        dnorm_norm_sum =
            __dadd_rn(dnorm_norm_sum, __dmul_rn(dnorm, static_cast<double>(__fmul_rn(xp.v[k], s))));
      }
    }
    const float b = static_cast<float>(warp_sum(dnorm_norm_sum) / static_cast<double>(C));
    for (int64_t i = lane * W; i < C; i += kWarp * W) {
      const Pack<W> dp = load_pack<W>(d + i), xp = load_pack<W>(x + i), wp = load_pack<W>(weight + i);
      Pack<W> gp = load_pack<W>(di + i);
      Pack<W> acc = load_pack<W>(dweight_acc + i);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float norm = __fmul_rn(xp.v[k], s);
        acc.v[k] = __fadd_rn(acc.v[k], __fmul_rn(norm, dp.v[k]));
        const float centred = __fsub_rn(__fmul_rn(wp.v[k], dp.v[k]), __fmul_rn(norm, b));
        gp.v[k] = __fadd_rn(gp.v[k], __fmul_rn(centred, s));
      }
      store_pack<W>(di + i, gp);
      store_pack<W>(dweight_acc + i, acc);
    }
  }
  __syncthreads();
  float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * C;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
    float total = warp_partials[i];
    for (int w = 1; w < warps; ++w) total = __fadd_rn(total, warp_partials[w * C + i]);
    block_partials[i] = total;
  }
}

template <typename Out>
void rmsnorm_forward_of(Out* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                        cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && C > 0, "rmsnorm_forward: N >= 0 and C > 0, got N={} C={}", N, C);
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(ceil_div(N, kForwardWarps));
  if (C % 4 == 0 && elementwise::pack_aligned(out) && aligned16(inp) && aligned16(weight)) {
    rmsnorm_forward_kernel<4><<<blocks, kThreads, 0, stream>>>(out, rstd, inp, weight, N, C);
  } else {
    rmsnorm_forward_kernel<1><<<blocks, kThreads, 0, stream>>>(out, rstd, inp, weight, N, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

// The backward kernel holding Columns columns of a row per thread.
template <int W, typename Dout>
auto backward_kernel(int columns) {
  return columns == 4   ? rmsnorm_backward_kernel<W, 4, Dout>
         : columns == 8 ? rmsnorm_backward_kernel<W, 8, Dout>
                        : rmsnorm_backward_kernel<W, 16, Dout>;
}

template <typename Dout>
void rmsnorm_backward_of(float* dinp, float* dweight, const Dout* dout, const float* inp, const float* weight,
                         const float* rstd, int64_t N, int64_t C, Workspace& workspace, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && C > 0, "rmsnorm_backward: N >= 0 and C > 0, got N={} C={}", N, C);
  if (N == 0) return;
  const bool vectorize =
      C % 4 == 0 && aligned16(dinp) && elementwise::pack_aligned(dout) && aligned16(inp) && aligned16(weight);
  using Kernel =
      void (*)(float*, float*, const Dout*, const float*, const float*, const float*, int64_t, int64_t);
  Kernel kernel = nullptr;
  int threads = 0;
  int rows_at_once = 1;  // rows a block works on at the same time: one, or a row per warp
  size_t shared_bytes = 0;
  if (C <= kMaxRegisterWidth) {
    int columns = 4;
    while (columns < kBackwardMaxColumns && ceil_div(C, columns) > kBackwardThreads) columns *= 2;
    threads = static_cast<int>(ceil_div(ceil_div(C, columns), kWarp) * kWarp);
    kernel = vectorize ? backward_kernel<4, Dout>(columns) : backward_kernel<1, Dout>(columns);
  } else {
    const size_t warp_bytes = static_cast<size_t>(C) * sizeof(float);
    const size_t shared_limit =
        static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
    const int warps = static_cast<int>(std::min<size_t>(kWideWarps, shared_limit / warp_bytes));
    OCTET_REQUIRE(warps >= 1,
                  "rmsnorm_backward: C={} needs {} bytes of shared memory per warp, the device has {}", C,
                  warp_bytes, shared_limit);
    shared_bytes = static_cast<size_t>(warps) * warp_bytes;
    kernel = vectorize ? rmsnorm_backward_wide_kernel<4, Dout> : rmsnorm_backward_wide_kernel<1, Dout>;
    if (shared_bytes > kDefaultSharedBytes) {
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
    }
    threads = warps * kWarp;
    rows_at_once = warps;
  }
  // One wave of equal blocks, as layernorm_backward sizes its grid: the rows of a block, and so the order of
  // the dweight partial sums, depend on the shape and the GPU's size.
  int resident_per_multiprocessor = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident_per_multiprocessor, kernel,
                                                                 threads, shared_bytes));
  const int64_t resident = static_cast<int64_t>(device_attribute(cudaDevAttrMultiProcessorCount)) *
                           std::max(resident_per_multiprocessor, 1);
  const int64_t rows_each = std::max<int64_t>(ceil_div(N, resident * rows_at_once), 1);
  const int64_t blocks = ceil_div(N, rows_at_once * rows_each);

  const ColumnSumPlan plan = plan_column_sum(blocks, C);
  Layout layout;
  const size_t partials_at = layout.reserve(static_cast<size_t>(blocks * C) * sizeof(float));
  const size_t scratch_at = layout.reserve(plan.scratch_floats(C) * sizeof(float));
  void* base = workspace.get(layout.bytes, stream);
  float* partials = at_offset<float>(base, partials_at);
  float* scratch = at_offset<float>(base, scratch_at);
  kernel<<<static_cast<unsigned>(blocks), threads, shared_bytes, stream>>>(dinp, partials, dout, inp, weight,
                                                                           rstd, N, C);
  OCTET_CUDA_CHECK_LAUNCH("rmsnorm_backward_kernel");
  column_sum(partials, C, blocks, C, dweight, plan, scratch, stream);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     cudaStream_t stream) {
  rmsnorm_forward_of(out, rstd, inp, weight, N, C, stream);
}

void rmsnorm_forward(uint16_t* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     cudaStream_t stream) {
  rmsnorm_forward_of(out, rstd, inp, weight, N, C, stream);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C, Workspace& workspace, cudaStream_t stream) {
  rmsnorm_backward_of(dinp, dweight, dout, inp, weight, rstd, N, C, workspace, stream);
}

void rmsnorm_backward(float* dinp, float* dweight, const uint16_t* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C, Workspace& workspace,
                      cudaStream_t stream) {
  rmsnorm_backward_of(dinp, dweight, dout, inp, weight, rstd, N, C, workspace, stream);
}

}  // namespace octet::cuda
