// The device side of one FP8 cast, shared by cast.cu (cast_amax) and the kernels that cast what they produce
// (fused.cu): the per-element step, what a thread saw (Tally) and how a block adds its tallies into
// CastResults. Keeping one copy is what makes a fused kernel's bytes, amax and counts those of cast_amax.
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <cstdint>

#include "octet/cuda/cast.h"
#include "octet/numerics/minifloat.h"
#include "octet/numerics/random.h"

namespace octet::cuda::cast_internal {

inline constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kInfBits = 0x7F800000u;
inline constexpr uint32_t kQuietNanBits = 0x7FC00000u;

// What one thread saw. amax_bits holds |x| as float bits: for non-negative floats the bit patterns order like
// the values (+0 lowest, +Inf highest), so an unsigned max is a float max. A NaN input
// contributes a quiet NaN's bits, which exceed +Inf's, so the maximum is NaN exactly when some input was NaN
// (octet::compute_amax's rule) and no separate flag is needed: nan_inputs counts them anyway.
// A plain aggregate (no member initialisers) so that it may live in __shared__ memory.
struct Tally {
  uint32_t amax_bits;
  unsigned long long saturated;
  unsigned long long underflowed;
  unsigned long long nan_inputs;
  unsigned long long nonzero;
};

__device__ __forceinline__ uint32_t float_bits(float x) {
  return __float_as_uint(x);
}

// cast_one of src/numerics/quantize.cpp: scale in float32, encode, count. Format and rounding are template
// parameters so that the generic encoder folds to this format's constants.
template <Dtype Format, bool Stochastic>
__device__ __forceinline__ uint32_t cast_element(float x, float scale, Overflow overflow, uint64_t seed,
                                                 uint64_t index, Tally& tally) {
  constexpr MinifloatSpec spec = minifloat_spec(Format);
  constexpr uint32_t sign_bit = 1u << (spec.exponent_bits + spec.mantissa_bits);
  // __fmul_rn: round-to-nearest and never contracted into an FMA, as the host's x * scale.
  const float scaled = __fmul_rn(x, scale);
  uint32_t random_bits = 0;
  const uint32_t* random = nullptr;
  if constexpr (Stochastic) {
    random_bits = CounterRng(seed).bits(index);
    random = &random_bits;
  } else {
    (void)seed;
    (void)index;
  }
  const EncodeResult r = encode_checked(spec, scaled, overflow, random);
  const uint32_t abs_bits = float_bits(x) & kAbsMask;
  const bool nan = abs_bits > kInfBits;
  tally.nan_inputs += nan ? 1u : 0u;
  tally.nonzero += (abs_bits != 0u && abs_bits < kInfBits) ? 1u : 0u;
  tally.saturated += r.overflow ? 1u : 0u;
  tally.underflowed += (abs_bits != 0u && !nan && (r.code & ~sign_bit) == 0u) ? 1u : 0u;
  const uint32_t amax_candidate = nan ? kQuietNanBits : abs_bits;
  tally.amax_bits = amax_candidate > tally.amax_bits ? amax_candidate : tally.amax_bits;
  return r.code;
}

__device__ __forceinline__ void warp_reduce(Tally& t) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint32_t other_amax = __shfl_xor_sync(0xFFFFFFFFu, t.amax_bits, offset);
    t.amax_bits = other_amax > t.amax_bits ? other_amax : t.amax_bits;
    t.saturated += __shfl_xor_sync(0xFFFFFFFFu, t.saturated, offset);
    t.underflowed += __shfl_xor_sync(0xFFFFFFFFu, t.underflowed, offset);
    t.nan_inputs += __shfl_xor_sync(0xFFFFFFFFu, t.nan_inputs, offset);
    t.nonzero += __shfl_xor_sync(0xFFFFFFFFu, t.nonzero, offset);
  }
}

// Block reduction, then one atomic per quantity and block. Every thread of the block must call it; the block
// size is a multiple of 32 and at most 1024. The atomics are an unsigned max and integer additions, so the
// totals do not depend on the order in which blocks arrive.
__device__ inline void flush_tally(Tally t, CastResults* results) {
  __shared__ Tally warp_tallies[32];
  const unsigned thread = threadIdx.y * blockDim.x + threadIdx.x;
  const unsigned lane = thread % 32u;
  const unsigned warp = thread / 32u;
  const unsigned warps = (blockDim.x * blockDim.y) / 32u;
  warp_reduce(t);
  if (lane == 0) warp_tallies[warp] = t;
  __syncthreads();
  if (warp != 0) return;
  Tally w = lane < warps ? warp_tallies[lane] : Tally{0u, 0ull, 0ull, 0ull, 0ull};
  warp_reduce(w);
  if (lane != 0) return;
  if (w.amax_bits != 0u) atomicMax(reinterpret_cast<unsigned int*>(&results->amax), w.amax_bits);
  if (w.saturated != 0u) atomicAdd(&results->saturated, w.saturated);
  if (w.underflowed != 0u) atomicAdd(&results->underflowed, w.underflowed);
  if (w.nan_inputs != 0u) atomicAdd(&results->nan_inputs, w.nan_inputs);
  if (w.nonzero != 0u) atomicAdd(&results->nonzero, w.nonzero);
}

// 1 / scale into *scale_inv (when given), by the first thread of the first block only.
__device__ __forceinline__ void write_scale_inv(float* scale_inv, float scale) {
  // __fdiv_rn: the correctly rounded 1 / scale of the host, whatever the division flags.
  if (scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
    *scale_inv = __fdiv_rn(1.0f, scale);
  }
}

}  // namespace octet::cuda::cast_internal
