// A mixture-of-experts router's softmax and top-k choice, forward and backward (router_softmax.h): one warp
// per token, its lanes taking experts lane, lane + 32, ... A row's expert count E is small (a few to a few
// hundred), so a warp covers it in a few steps and a row's probabilities stay in L1 between the passes that
// reread them. The CPU reference's (src/backends/cpu/cpu_routing.cpp) operations, rounded as it rounds them;
// only the row sums (the softmax's, and the backward's sum of p dp) are taken in another order, a butterfly
// over the lanes fixed by E alone, so every result is bitwise repeatable. The conventions that every op
// follows are ops_common.cuh's.
#include "router_softmax.h"

#include <climits>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::kFullMask;
using ops_internal::ceil_div;
using ops_internal::kThreads;
using ops_internal::kWarp;
using ops_internal::warp_float_sum;
using ops_internal::warp_max;

constexpr int kRowsPerBlock = kThreads / kWarp;

// Whether expert a, of probability pa, is chosen before expert b, of probability pb: the larger probability
// first, the lower index among equals, as the reference's scan (a strict `>` from the lowest index) chooses.
// NaNs compare neither way and so fall back to the index: a row that holds a NaN holds only NaNs (its sum
// is NaN), and the reference then chooses experts 0, 1, ... in turn, as this order does.
__device__ __forceinline__ bool chosen_before(float pa, int a, float pb, int b) {
  return pa > pb || (!(pb > pa) && a < b);
}

// The reference's selection by repeated maximum, in the order chosen_before: round j takes the first expert
// in that order among those after round j - 1's choice, which are exactly the experts not yet chosen. Lane
// j % 32 writes choice j (its expert, and its weight once the total is known), so no lane reads another's
// writes.
__global__ void __launch_bounds__(kThreads)
    top_k_softmax_kernel(float* probs, int32_t* experts, float* weights, const float* logits, int64_t N,
                         int E, int k) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (n >= N) return;  // the whole warp: n is the warp's
  const float* z = logits + n * E;
  float* p = probs + n * E;

  float max = -INFINITY;
  for (int e = lane; e < E; e += kWarp) max = fmaxf(max, z[e]);
  max = warp_max(max);
  float sum = 0.0f;
  for (int e = lane; e < E; e += kWarp) {
    const float x = expf(__fsub_rn(z[e], max));
    p[e] = x;
    sum = __fadd_rn(sum, x);
  }
  sum = warp_float_sum(sum);
  for (int e = lane; e < E; e += kWarp) p[e] = __fdiv_rn(p[e], sum);

  int32_t* chosen = experts + n * k;
  float* w = weights + n * k;
  float total = 0.0f;  // of the chosen probabilities, in the order chosen, as the reference adds them
  float last_p = 0.0f;
  int last = -1;  // the previous round's choice; -1 before the first
  for (int j = 0; j < k; ++j) {
    float best_p = 0.0f;
    int best = -1;  // none yet
    for (int e = lane; e < E; e += kWarp) {
      const float pe = p[e];
      const bool available = last < 0 || chosen_before(last_p, last, pe, e);
      if (available && (best < 0 || chosen_before(pe, e, best_p, best))) {
        best_p = pe;
        best = e;
      }
    }
    // The first of the lanes' candidates: the order is total, so every lane ends with the same one.
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float other_p = __shfl_xor_sync(kFullMask, best_p, offset);
      const int other = __shfl_xor_sync(kFullMask, best, offset);
      if (other >= 0 && (best < 0 || chosen_before(other_p, other, best_p, best))) {
        best_p = other_p;
        best = other;
      }
    }
    total = __fadd_rn(total, best_p);
    if (lane == j % kWarp) {
      chosen[j] = best;
      w[j] = best_p;
    }
    last_p = best_p;
    last = best;
  }
  for (int j = lane; j < k; j += kWarp) w[j] = __fdiv_rn(w[j], total);
}

// The gradient of the probabilities, dp, is staged in the row of dlogits: first dprobs (or zeros), then the
// renormalization's term added at each chosen expert (by lane j % 32 for choice j; the experts of a row are
// distinct), then the softmax's backward over it in place. __syncwarp orders the lanes' writes to the row
// between the stages.
__global__ void __launch_bounds__(kThreads)
    top_k_softmax_backward_kernel(float* dlogits, const float* probs, const int32_t* experts,
                                  const float* weights, const float* dweights, const float* dprobs, int64_t N,
                                  int E, int k) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (n >= N) return;
  const float* p = probs + n * E;
  float* dz = dlogits + n * E;
  const int32_t* chosen = experts + n * k;
  const float* w = weights + n * k;
  const float* dw = dweights + n * k;

  // w_j = p_j / S, S the chosen probabilities' sum: d p_j = (dw_j - sum_i dw_i w_i) / S. Both sums in j
  // order, on every lane (the same loads, broadcast).
  float total = 0.0f, weighted = 0.0f;
  for (int j = 0; j < k; ++j) {
    total = __fadd_rn(total, p[chosen[j]]);
    weighted = __fadd_rn(weighted, __fmul_rn(dw[j], w[j]));
  }
  for (int e = lane; e < E; e += kWarp) dz[e] = dprobs != nullptr ? dprobs[e] : 0.0f;
  __syncwarp();
  for (int j = lane; j < k; j += kWarp) {
    const int e = chosen[j];
    dz[e] = __fadd_rn(dz[e], __fdiv_rn(__fsub_rn(dw[j], weighted), total));
  }
  __syncwarp();
  // The softmax: dz_e = p_e (dp_e - sum_f p_f dp_f).
  float inner = 0.0f;
  for (int e = lane; e < E; e += kWarp) inner = __fadd_rn(inner, __fmul_rn(p[e], dz[e]));
  inner = warp_float_sum(inner);
  for (int e = lane; e < E; e += kWarp) dz[e] = __fmul_rn(p[e], __fsub_rn(dz[e], inner));
}

void check_router_sizes(const char* op, int64_t N, int64_t E, int64_t k) {
  OCTET_CHECK(N >= 0 && k >= 1 && k <= E && E <= INT_MAX,
              "{}: N >= 0 tokens choosing 1 <= k <= E experts, given N = {}, k = {}, E = {}", op, N, k, E);
}

unsigned router_blocks(int64_t N) {
  return static_cast<unsigned>(ceil_div(N, kRowsPerBlock));
}

}  // namespace

void top_k_softmax(float* probs, int32_t* experts, float* weights, const float* logits, int64_t N, int64_t E,
                   int64_t k, cudaStream_t stream) {
  check_router_sizes("top_k_softmax", N, E, k);
  if (N == 0) return;
  top_k_softmax_kernel<<<router_blocks(N), kThreads, 0, stream>>>(probs, experts, weights, logits, N,
                                                                  static_cast<int>(E), static_cast<int>(k));
  OCTET_CUDA_CHECK_LAUNCH("top_k_softmax_kernel");
}

void top_k_softmax_backward(float* dlogits, const float* probs, const int32_t* experts, const float* weights,
                            const float* dweights, const float* dprobs, int64_t N, int64_t E, int64_t k,
                            cudaStream_t stream) {
  check_router_sizes("top_k_softmax_backward", N, E, k);
  if (N == 0) return;
  top_k_softmax_backward_kernel<<<router_blocks(N), kThreads, 0, stream>>>(
      dlogits, probs, experts, weights, dweights, dprobs, N, static_cast<int>(E), static_cast<int>(k));
  OCTET_CUDA_CHECK_LAUNCH("top_k_softmax_backward_kernel");
}

}  // namespace octet::cuda
