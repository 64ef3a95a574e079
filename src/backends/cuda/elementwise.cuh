// Device arithmetic shared by the ops of ops.h (gelu.cu, adamw.cu, layernorm.cu, ...) and the same ops fused
// with an FP8 cast (fused.h: fused_gelu.cu, fused_adamw.cu, fused_layernorm.cu): the GELU forward value and
// gradient, the AdamW step (per element and per pack, and its host-side constants) and LayerNorm's row
// statistics and normalisation, RMSNorm's, and SiLU with its gradient (SwiGLU), with the small helpers they
// need (Pack, warp_sum). Both must compute
// bit-identical values (fused.h promises the unfused op's exact results, and the GPU tests compare both with
// the CPU reference bit for bit), so this is the one copy: same rounding intrinsics, same order of
// operations, same float64 reductions as the reference.
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <cmath>
#include <cstdint>

namespace octet::cuda::elementwise {

inline constexpr int kWarp = 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

// W consecutive floats, one float4 when W is 4 (the caller guarantees 16-byte alignment). Plain loads, not
// __ldg: an op's output may alias its input.
template <int W>
struct Pack {
  float v[W];
};

template <int W>
__device__ __forceinline__ Pack<W> load_pack(const float* p) {
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    return {{q.x, q.y, q.z, q.w}};
  } else {
    return {{*p}};
  }
}

// W values of type T as loaded: float32 already as a Pack, bf16 as its bits until widen() makes them floats
// (a kernel holding loads of several rows keeps bf16 at 2 bytes a value).
template <int W, typename T>
struct Raw {
  Pack<W> v;
};
template <>
struct Raw<4, uint16_t> {
  uint2 q;
};
template <>
struct Raw<1, uint16_t> {
  uint16_t q;
};

template <int W>
__device__ __forceinline__ Raw<W, float> load_raw(const float* p) {
  return {load_pack<W>(p)};
}
// 8 bytes when W is 4 (the caller guarantees 8-byte alignment).
template <int W>
__device__ __forceinline__ Raw<W, uint16_t> load_raw(const uint16_t* p) {
  if constexpr (W == 4) {
    return {*reinterpret_cast<const uint2*>(p)};
  } else {
    return {*p};
  }
}

template <int W>
__device__ __forceinline__ Pack<W> widen(const Raw<W, float>& r) {
  return r.v;
}
// bf16 bits widened to float32, which is exact.
template <int W>
__device__ __forceinline__ Pack<W> widen(const Raw<W, uint16_t>& r) {
  Pack<W> x;
  if constexpr (W == 4) {
    x.v[0] = __uint_as_float(r.q.x << 16);
    x.v[1] = __uint_as_float(r.q.x & 0xFFFF0000u);
    x.v[2] = __uint_as_float(r.q.y << 16);
    x.v[3] = __uint_as_float(r.q.y & 0xFFFF0000u);
  } else {
    x.v[0] = __uint_as_float(static_cast<uint32_t>(r.q) << 16);
  }
  return x;
}

// W consecutive bf16 values (their bits) widened to float32; 8 bytes when W is 4 (the caller guarantees
// 8-byte alignment).
template <int W>
__device__ __forceinline__ Pack<W> load_pack(const uint16_t* p) {
  return widen(load_raw<W>(p));
}

// Whether a pointer allows load_pack<4>: 16 bytes for float, 8 for bf16.
__host__ __device__ inline bool pack_aligned(const float* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
__host__ __device__ inline bool pack_aligned(const uint16_t* p) {
  return reinterpret_cast<uintptr_t>(p) % 8 == 0;
}

template <int W>
__device__ __forceinline__ void store_pack(float* p, const Pack<W>& x) {
  if constexpr (W == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
  } else {
    *p = x.v[0];
  }
}

// Butterfly sum: every lane ends with the same bits, since each step adds the same two values on both lanes.
__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = __dadd_rn(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// GELU (tanh approximation), 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), in its logistic
// form: 0.5 (1 + tanh(u)) = s = 1 / (1 + e^(-2u)), so GELU is x s and its derivative s + 2 x u' s (1 - s).
// e^(-2u) and the reciprocal come from the special-function unit's approximations (ex2.approx, rcp.approx:
// about 2 and 1 ulp), three instructions where tanhf takes some twenty: the fused casts that run GELU are
// bound by their instructions (docs/benchmarks.md, log entry 13). The result stays within a few float32 ulps
// of the tanh form, which is how the CPU reference computes it (std::tanh) and how the GPU tests compare the
// two (tests/cuda/test_backend_ops.cpp: 8 roundings of |x| forward). Every special value keeps the
// reference's class: NaN where it has NaN (GELU(-Inf), and the derivative at +-Inf and wherever x^3
// overflows), +Inf at +Inf, and 0 where e^(-2u) overflows.

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kMinusTwoLog2e = -2.0f * 1.4426950408889634f;

// The argument of tanh: sqrt(2 / pi) * (x + 0.044715 * x^3).
__device__ __forceinline__ float gelu_argument(float x) {
  const float cubic = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  return __fmul_rn(kGeluScale, __fadd_rn(x, cubic));
}

// 1 / (1 + e^(-2u)) = 0.5 (1 + tanh(u)). Subnormal arguments and results flush to zero (e^(-2u) is 1 for
// a subnormal u), which changes no result beyond an ulp of 1.
__device__ __forceinline__ float gelu_logistic(float u) {
  float e, s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(__fmul_rn(kMinusTwoLog2e, u)));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(__fadd_rn(1.0f, e)));
  return s;
}

__device__ __forceinline__ float gelu(float x) {
  return __fmul_rn(x, gelu_logistic(gelu_argument(x)));
}

// 3 * 0.044715, folded in float, as the host compiler folds it.
inline constexpr float kGeluCubicSlope = 3.0f * kGeluCubic;

// The GELU backward: gelu'(x) * dout, with gelu'(x) = s + 2 x u'(x) s (1 - s) and
// u'(x) = sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
__device__ __forceinline__ float gelu_gradient(float x, float dout) {
  const float s = gelu_logistic(gelu_argument(x));
  const float slope = __fmul_rn(kGeluScale, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kGeluCubicSlope, x), x)));
  const float spread = __fmul_rn(s, __fsub_rn(1.0f, s));
  const float rest = __fmul_rn(__fmul_rn(__fmul_rn(2.0f, x), slope), spread);
  return __fmul_rn(__fadd_rn(s, rest), dout);
}

// ---------------------------------------------------------------------------------------------------------
// AdamW: the reference's step, one rounding per operation in its order; the loop-invariant factors are
// computed on the host exactly as the reference computes them.

struct AdamWConstants {
  float grad_scale;
  float decay;  // 1 - learning_rate * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias2_sqrt;
  float step_size;  // learning_rate / bias1
  float eps;
};

// The reference's host expressions, so that every constant has the same bits.
inline AdamWConstants adamw_constants(float learning_rate, float beta1, float beta2, float eps,
                                      float weight_decay, int64_t step, float grad_scale) {
  const float bias1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bias2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  AdamWConstants c{};
  c.grad_scale = grad_scale;
  c.decay = 1.0f - learning_rate * weight_decay;
  c.beta1 = beta1;
  c.one_minus_beta1 = 1.0f - beta1;
  c.beta2 = beta2;
  c.one_minus_beta2 = 1.0f - beta2;
  c.bias2_sqrt = std::sqrt(bias2);
  c.step_size = learning_rate / bias1;
  c.eps = eps;
  return c;
}

// One element: updates param, m and v in place from the unscaled gradient.
__device__ __forceinline__ void adamw_step(const AdamWConstants& c, float& param, float& m, float& v,
                                           float grad) {
  const float g = __fmul_rn(grad, c.grad_scale);
  const float decayed = __fmul_rn(param, c.decay);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bias2_sqrt), c.eps);
  param = __fsub_rn(decayed, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

// A gradient that AdamW reads: float32, or bf16 bits (a weight gradient stored so), read as their float32
// values. Exactly one is set.
struct Gradient {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  template <int W>
  __device__ __forceinline__ Pack<W> load(int64_t i) const {
    return bf16 != nullptr ? load_pack<W>(bf16 + i) : load_pack<W>(f32 + i);
  }
};

// Elements i .. i+W-1 of the four tensors: adamw_step on each, the new params, m and v stored in place. The
// new params are returned too, for the fused cast of the updated weights.
template <int W>
__device__ __forceinline__ Pack<W> adamw_pack(const AdamWConstants& c, float* params, float* m, float* v,
                                              const Gradient& grads, int64_t i) {
  Pack<W> p = load_pack<W>(params + i);
  Pack<W> mp = load_pack<W>(m + i);
  Pack<W> vp = load_pack<W>(v + i);
  const Pack<W> gp = grads.load<W>(i);
#pragma unroll
  for (int k = 0; k < W; ++k) adamw_step(c, p.v[k], mp.v[k], vp.v[k], gp.v[k]);
  store_pack<W>(params + i, p);
  store_pack<W>(m + i, mp);
  store_pack<W>(v + i, vp);
  return p;
}

// The multi-tensor kernels' block-to-tensor map: the index of the last of `count` entries (sorted by
// first_block, the first at 0) whose first_block is at most `block`.
template <typename Entry>
__device__ __forceinline__ int entry_of_block(const Entry* entries, int count, int64_t block) {
  int low = 0, high = count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (entries[middle].first_block <= block) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

// ---------------------------------------------------------------------------------------------------------
// LayerNorm forward, one warp per row of C values. Lane `lane` reads elements lane*W, lane*W + 32*W, ...
// (W = 4: float4 loads), so W fixes the order of the float64 additions: callers that must agree must pick
// the same W for the same pointers.

inline constexpr float kLayernormEps = 1e-5f;

struct RowStatistics {
  float mean;
  float rstd;
};

// The row's mean and 1 / sqrt(variance + eps), float64 sums as the reference; the same bits on every lane.
// Every lane of the warp must call it.
template <int W>
__device__ __forceinline__ RowStatistics layernorm_statistics(const float* x, int64_t C, int lane) {
  double sum = 0.0;
  // Unrolled so that four loads are in flight (the sums still add in i's order); the second pass reads from
  // L1.
#pragma unroll 4
  for (int64_t i = lane * W; i < C; i += kWarp * W) {
    const Pack<W> p = load_pack<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) sum = __dadd_rn(sum, static_cast<double>(p.v[k]));
  }
  const float m = static_cast<float>(warp_sum(sum) / static_cast<double>(C));
  double var = 0.0;
#pragma unroll 4
  for (int64_t i = lane * W; i < C; i += kWarp * W) {
    const Pack<W> p = load_pack<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double d = static_cast<double>(__fsub_rn(p.v[k], m));
      var = __dadd_rn(var, __dmul_rn(d, d));
    }
  }
  const double variance = warp_sum(var) / static_cast<double>(C);
  const float s = static_cast<float>(1.0 / sqrt(variance + static_cast<double>(kLayernormEps)));
  return {m, s};
}

// Output elements i .. i+W-1 of the row x: (x - mean) * rstd * weight + bias.
template <int W>
__device__ __forceinline__ Pack<W> layernorm_normalise(const float* x, const float* weight, const float* bias,
                                                       int64_t i, RowStatistics r) {
  Pack<W> p = load_pack<W>(x + i);
  const Pack<W> w = load_pack<W>(weight + i);
  const Pack<W> b = load_pack<W>(bias + i);
#pragma unroll
  for (int k = 0; k < W; ++k)
    p.v[k] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(p.v[k], r.mean), r.rstd), w.v[k]), b.v[k]);
  return p;
}

// ---------------------------------------------------------------------------------------------------------
// RMSNorm forward, one warp per row of C values, in the lane order of LayerNorm's statistics (W fixes the
// order of the float64 additions, so callers that must agree pick the same W for the same pointers).

// 1 / sqrt(mean(x^2) + eps): the reference's float64 sum of squares, the same bits on every lane. Every lane
// of the warp must call it.
template <int W>
__device__ __forceinline__ float rmsnorm_rstd(const float* x, int64_t C, int lane) {
  double squares = 0.0;
#pragma unroll 4
  for (int64_t i = lane * W; i < C; i += kWarp * W) {
    const Pack<W> p = load_pack<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double d = static_cast<double>(p.v[k]);
      squares = __dadd_rn(squares, __dmul_rn(d, d));
    }
  }
  const double mean_square = warp_sum(squares) / static_cast<double>(C);
  return static_cast<float>(1.0 / sqrt(mean_square + static_cast<double>(kLayernormEps)));
}

// Output elements i .. i+W-1 of the row x: x * rstd * weight, in the reference's order.
template <int W>
__device__ __forceinline__ Pack<W> rmsnorm_normalise(const float* x, const float* weight, int64_t i,
                                                     float rstd) {
  Pack<W> p = load_pack<W>(x + i);
  const Pack<W> w = load_pack<W>(weight + i);
#pragma unroll
  for (int k = 0; k < W; ++k) p.v[k] = __fmul_rn(__fmul_rn(p.v[k], rstd), w.v[k]);
  return p;
}

// ---------------------------------------------------------------------------------------------------------
// SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + e^-g), the reference's expressions in its order. expf is
// CUDA's full-precision exponential (2 ulps at most), which the GPU tests allow for against std::exp.

__device__ __forceinline__ float swiglu(float gate, float up) {
  return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate))), up);
}

// The two gradients of one (gate, up) pair for dout: d gate = dout * up * (s (1 + g (1 - s))), d up =
// dout * g s, with the sigmoid s = 1 / (1 + e^-g).
struct SwigluGradient {
  float gate;
  float up;
};
__device__ __forceinline__ SwigluGradient swiglu_gradient(float gate, float up, float dout) {
  const float sigmoid = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gate)));
  const float silu = __fmul_rn(gate, sigmoid);
  const float slope = __fmul_rn(sigmoid, __fadd_rn(1.0f, __fmul_rn(gate, __fsub_rn(1.0f, sigmoid))));
  return {__fmul_rn(__fmul_rn(dout, up), slope), __fmul_rn(dout, silu)};
}

}  // namespace octet::cuda::elementwise
