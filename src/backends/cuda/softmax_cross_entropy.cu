// Softmax cross-entropy over float32 or BF16 logits (softmax_cross_entropy.h): each row's loss and, in
// place, the gradient of its logits. The conventions that every op follows are ops_common.cuh's.
#include "softmax_cross_entropy.h"

#include <cmath>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::kFullMask;
using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::Pack;
using elementwise::store_pack;
using ops_internal::block_sum;
using ops_internal::device_attribute;
using ops_internal::kDefaultSharedBytes;

// ---------------------------------------------------------------------------------------------------------
// Softmax cross-entropy: one block per row, in the CPU reference's order of work: the row's maximum, then
// the float64 sum of exp(x - maximum), then the gradient. When the row fits in shared memory (Cached), the
// first read keeps it there for the other two passes, so the logits cross DRAM once each way: rows of a
// GPT-2 vocabulary, hundreds of them in flight, do not stay in L2 between passes. Each thread reads back only
// what it stored itself, so the cache needs no barrier of its own. Rows that fit in shared memory in their
// own type, in whole 16-byte copies, take the staged kernel further down instead, which gives the same bits.
// (A running maximum with a rescaled sum would read the row once for the loss, but costs a comparison and a
// branch on every logit of a kernel bound by its instructions; docs/benchmarks.md, log entry 13.)

constexpr int kSoftmaxThreads = 1024;

// The maximum over the block (block_sum's pattern), returned to every thread. It ignores NaN (fmaxf), as the
// reference's comparison does; a NaN logit still makes the row's sum NaN.
__device__ float block_max(float m) {
  __shared__ float maxima[kWarp];
  const unsigned lane = threadIdx.x % kWarp;
  const unsigned warp = threadIdx.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  if (lane == 0) maxima[warp] = m;
  __syncthreads();
  m = lane < blockDim.x / kWarp ? maxima[lane] : -INFINITY;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  __syncthreads();  // maxima may be reused by the next call
  return m;
}

// What exponentials are taken against: the row's maximum, or 0 for a row without one (all -Inf), whose
// exponentials are then all 0 rather than exp(-Inf - -Inf), NaN.
__device__ __forceinline__ float exponent_shift(float max) {
  return max == -INFINITY ? 0.0f : max;
}

// One logit's term of the row's sum.
__device__ __forceinline__ double exp_term(float x, float shift) {
  return static_cast<double>(expf(__fsub_rn(x, shift)));
}

// Logits stored as float32 or as BF16 (the head GEMM's own output type, holding the same values): W of them
// at a time, as float32. BF16 loads are exact; BF16 stores round to nearest even.
template <int W>
__device__ __forceinline__ Pack<W> load_logits(const float* p) {
  return load_pack<W>(p);
}
template <int W>
__device__ __forceinline__ Pack<W> load_logits(const __nv_bfloat16* p) {
  if constexpr (W == 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    Pack<8> x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[k]));
      x.v[2 * k] = pair.x;
      x.v[2 * k + 1] = pair.y;
    }
    return x;
  } else if constexpr (W == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
    return {{lo.x, lo.y, hi.x, hi.y}};
  } else {
    return {{__bfloat162float(*p)}};
  }
}
template <int W>
__device__ __forceinline__ void store_logits(float* p, const Pack<W>& x) {
  store_pack<W>(p, x);
}
template <int W>
__device__ __forceinline__ void store_logits(__nv_bfloat16* p, const Pack<W>& x) {
  if constexpr (W == 8) {
    uint32_t words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(x.v[2 * k], x.v[2 * k + 1]);
      words[k] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (W == 4) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.v[0], x.v[1]);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(x.v[2], x.v[3]);
    uint2 q;
    q.x = *reinterpret_cast<const uint32_t*>(&lo);
    q.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = q;
  } else {
    *p = __float2bfloat16_rn(x.v[0]);
  }
}

// The loss of a row from its maximum, its sum and its target's logit.
__device__ __forceinline__ float row_loss(float max, double sum, float target_logit) {
  const float log_sum = static_cast<float>(log(sum));
  return __fsub_rn(log_sum, __fsub_rn(target_logit, max));
}

// dloss * (softmax - onehot(target)) of one logit x, from the row's maximum and 1 / sum.
__device__ __forceinline__ float logit_gradient(float x, float max, float inverse_sum, float dloss,
                                                bool is_target) {
  const float g = __fmul_rn(__fmul_rn(expf(__fsub_rn(x, max)), inverse_sum), dloss);
  return is_target ? __fsub_rn(g, dloss) : g;
}

// One block per row. The reductions and the arithmetic do not depend on the logits' storage type, so a BF16
// row gives the same loss, and the same gradient rounded to BF16, as the float32 row of the same values.
template <typename Logit, int W, bool Cached>
__global__ void __launch_bounds__(kSoftmaxThreads)
    softmax_cross_entropy_kernel(float* losses, Logit* logits, const int32_t* targets, int64_t V, int64_t Vp,
                                 float dloss) {
  extern __shared__ float cached_row[];  // [V] when Cached
  const int64_t n = blockIdx.x;
  Logit* row = logits + n * Vp;
  const int64_t target = targets[n];
  // Read before the block reduction's barriers, so before any thread overwrites the row.
  const float target_logit = threadIdx.x == 0 ? load_logits<1>(row + target).v[0] : 0.0f;
  const int64_t groups = V / W;
  float m = -INFINITY;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = load_logits<W>(row + g * W);
    if constexpr (Cached) store_pack<W>(cached_row + g * W, p);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, p.v[k]);
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    const float x = load_logits<1>(row + v).v[0];
    if constexpr (Cached) cached_row[v] = x;
    m = fmaxf(m, x);
  }
  const float max = block_max(m);
  const float shift = exponent_shift(max);
  double s = 0.0;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = Cached ? load_pack<W>(cached_row + g * W) : load_logits<W>(row + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) s = __dadd_rn(s, exp_term(p.v[k], shift));
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    s = __dadd_rn(s, exp_term(Cached ? cached_row[v] : load_logits<1>(row + v).v[0], shift));
  }
  const double sum = block_sum(s);
  if (threadIdx.x == 0) losses[n] = row_loss(max, sum, target_logit);
  if (dloss == 0.0f) return;
  const float inverse_sum = static_cast<float>(1.0 / sum);
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    Pack<W> p = Cached ? load_pack<W>(cached_row + g * W) : load_logits<W>(row + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) p.v[k] = logit_gradient(p.v[k], max, inverse_sum, dloss, g * W + k == target);
    store_logits<W>(row + g * W, p);
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    const float x = Cached ? cached_row[v] : load_logits<1>(row + v).v[0];
    store_logits<1>(row + v, Pack<1>{{logit_gradient(x, max, inverse_sum, dloss, v == target)}});
  }
  for (int64_t v = V + threadIdx.x; v < Vp; v += kSoftmaxThreads) store_logits<1>(row + v, Pack<1>{{0.0f}});
}

// The same row staged whole in shared memory in its own type, for rows of a multiple of 16 bytes starting
// 16-byte aligned: a BF16 row of GPT-2's padded vocabulary takes 98 KiB, so two blocks share a multiprocessor
// and one block's arithmetic hides the other's memory traffic. The row arrives by 16-byte cp.async copies,
// all of them in flight at once (the kernel above loads as it reduces, a few loads per thread at a time);
// the gradient leaves in 16-byte stores, padded columns included. The reduction takes the same elements in
// the same order on the same threads as softmax_cross_entropy_kernel<Logit, 4, ...> (which the launcher would
// pick for these rows), and the arithmetic is the same, so the losses and gradients are its bits exactly.
constexpr int kCopyBytes = 16;

__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(shared))),
               "l"(global));
}

template <typename Logit>
__global__ void __launch_bounds__(kSoftmaxThreads, 2)
    softmax_cross_entropy_staged_kernel(float* losses, Logit* logits, const int32_t* targets, int64_t V,
                                        int64_t Vp, float dloss) {
  constexpr int kPerCopy = kCopyBytes / static_cast<int>(sizeof(Logit));  // 4 float32, 8 BF16
  constexpr int W = 4;                                                    // the reduction's groups
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  Logit* staged = reinterpret_cast<Logit*>(staged_bytes);  // [Vp]
  const int64_t n = blockIdx.x;
  Logit* row = logits + n * Vp;
  const int64_t copies = Vp / kPerCopy;
  for (int64_t j = threadIdx.x; j < copies; j += kSoftmaxThreads) {
    copy_async_16(staged + j * kPerCopy, row + j * kPerCopy);
  }
  asm volatile("cp.async.commit_group;\n" ::);
  const int64_t target = targets[n];
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  // Every read of the row from here on is from shared memory, so the gradient may overwrite it in place.
  const int64_t groups = V / W;
  float m = -INFINITY;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = load_logits<W>(staged + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, p.v[k]);
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    m = fmaxf(m, load_logits<1>(staged + v).v[0]);
  }
  const float max = block_max(m);
  const float shift = exponent_shift(max);
  double s = 0.0;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = load_logits<W>(staged + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) s = __dadd_rn(s, exp_term(p.v[k], shift));
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    s = __dadd_rn(s, exp_term(load_logits<1>(staged + v).v[0], shift));
  }
  const double sum = block_sum(s);
  if (threadIdx.x == 0) losses[n] = row_loss(max, sum, load_logits<1>(staged + target).v[0]);
  if (dloss == 0.0f) return;
  const float inverse_sum = static_cast<float>(1.0 / sum);
  // 32-bit positions (a row is far shorter than 2^31 logits); only the copy holding the target, and the last
  // copies where the padding starts, take the per-logit checks.
  const auto columns = static_cast<int>(V);
  const auto target_column = static_cast<int>(target);
  for (int j = static_cast<int>(threadIdx.x); j < static_cast<int>(copies); j += kSoftmaxThreads) {
    const int v0 = j * kPerCopy;
    Pack<kPerCopy> p = load_logits<kPerCopy>(staged + v0);
    if (v0 + kPerCopy <= columns && static_cast<unsigned>(target_column - v0) >= kPerCopy) {
#pragma unroll
      for (int k = 0; k < kPerCopy; ++k) p.v[k] = logit_gradient(p.v[k], max, inverse_sum, dloss, false);
    } else {
#pragma unroll
      for (int k = 0; k < kPerCopy; ++k) {
        p.v[k] = v0 + k < columns ? logit_gradient(p.v[k], max, inverse_sum, dloss, v0 + k == target_column)
                                  : 0.0f;
      }
    }
    store_logits<kPerCopy>(row + v0, p);
  }
}

template <typename Logit>
void launch_softmax_cross_entropy(float* losses, Logit* logits, const int32_t* targets, int64_t N, int64_t V,
                                  int64_t Vp, float dloss, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && V > 0 && Vp >= V, "softmax_cross_entropy: N >= 0, 0 < V <= Vp, got N={} V={} Vp={}",
              N, V, Vp);
  if (N == 0) return;
  OCTET_CHECK(N <= INT32_MAX, "softmax_cross_entropy: at most 2^31 - 1 rows, got {}", N);
  const auto blocks = static_cast<unsigned>(N);
  const size_t shared_limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  // Rows of whole 16-byte copies that fit in shared memory (every row of a GPT-2 vocabulary padded to a
  // multiple of 64) are staged there in their own type.
  const size_t row_bytes = static_cast<size_t>(Vp) * sizeof(Logit);
  if (row_bytes % kCopyBytes == 0 && reinterpret_cast<uintptr_t>(logits) % kCopyBytes == 0) {
    const auto kernel = softmax_cross_entropy_staged_kernel<Logit>;
    cudaFuncAttributes attributes{};
    OCTET_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (row_bytes + attributes.sharedSizeBytes <= shared_limit) {
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(row_bytes)));
      // As much shared memory as the multiprocessor has: a second block of BF16 rows needs it.
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
      kernel<<<blocks, kSoftmaxThreads, row_bytes, stream>>>(losses, logits, targets, V, Vp, dloss);
      OCTET_CUDA_CHECK_LAUNCH("softmax_cross_entropy_staged_kernel");
      return;
    }
  }
  // The row cache is only worth its shared memory when the gradient pass reads the row again.
  const size_t cache_bytes = static_cast<size_t>(V) * sizeof(float);
  const bool cached =
      dloss != 0.0f && cache_bytes + 1024 <= shared_limit;  // 1 KiB for the reduction's arrays
  auto launch = [&](auto kernel, size_t shared_bytes) {
    if (shared_bytes > kDefaultSharedBytes) {
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
    }
    kernel<<<blocks, kSoftmaxThreads, shared_bytes, stream>>>(losses, logits, targets, V, Vp, dloss);
  };
  // Four logits per load: 16 bytes of float32 or 8 of BF16.
  const bool vectorize = Vp % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % (4 * sizeof(Logit)) == 0;
  if (cached) {
    if (vectorize) {
      launch(softmax_cross_entropy_kernel<Logit, 4, true>, cache_bytes);
    } else {
      launch(softmax_cross_entropy_kernel<Logit, 1, true>, cache_bytes);
    }
  } else {
    if (vectorize) {
      launch(softmax_cross_entropy_kernel<Logit, 4, false>, 0);
    } else {
      launch(softmax_cross_entropy_kernel<Logit, 1, false>, 0);
    }
  }
  OCTET_CUDA_CHECK_LAUNCH("softmax_cross_entropy_kernel");
}

}  // namespace

void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream) {
  launch_softmax_cross_entropy(losses, logits, targets, N, V, Vp, dloss, stream);
}

void softmax_cross_entropy(float* losses, __nv_bfloat16* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream) {
  launch_softmax_cross_entropy(losses, logits, targets, N, V, Vp, dloss, stream);
}

}  // namespace octet::cuda
