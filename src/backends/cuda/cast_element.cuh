// The device side of one FP8 cast, shared by cast.cu (cast_amax) and the kernels that cast what they produce
// (fused_common.cuh and the fused_*.cu files): the per-element step, what a thread saw (Tally) and how a
// block adds its tallies into CastResults. Keeping one copy is what makes a fused kernel's bytes, amax and
// counts those of cast_amax.
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <cstdint>

#include <cuda_fp8.h>

#include "octet/cuda/cast.h"
#include "octet/numerics/minifloat.h"
#include "octet/numerics/random.h"

namespace octet::cuda::cast_internal {

inline constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kInfBits = 0x7F800000u;
inline constexpr uint32_t kQuietNanBits = 0x7FC00000u;

// What one thread saw. amax_bits holds |x| as float bits: for non-negative floats the bit patterns order like
// the values (+0 lowest, +Inf highest), so an unsigned max is a float max. A NaN input
// contributes a quiet NaN's bits, which exceed +Inf's, so the maximum is NaN when some input was NaN
// (octet::compute_amax's rule). A cast's ordinary elements are taken with a float max, which drops a NaN
// already held; such a NaN was counted in nan_inputs, and flush_tally makes the amax NaN whenever that count
// is not zero.
// The counts are 32-bit (a 64-bit add is two instructions, on every element) and cannot wrap: a thread takes
// at most 32 elements per grid stride (a float4 group, or its share of a tile: 16, or 32 in the SwiGLU
// backward's tiles of two halves), and the launchers keep every block to kMaxBlockStrides strides (one more
// for a flat kernel's leftover elements), so a thread counts fewer than 32 x (2^24 + 1) elements. The LayerNorm kernels do not stride: a lane counts at most two rows'
// share, 2 x (C / 32 + 4) elements, which would take rows of 2^36 floats (256 GiB) to reach 2^32.
// flush_tally adds across threads in 64 bits.
// A plain aggregate (no member initialisers) so that it may live in __shared__ memory.
struct Tally {
  uint32_t amax_bits;
  uint32_t saturated;
  uint32_t underflowed;
  uint32_t nan_inputs;
  uint32_t nonzero;
};

// The most grid strides a block of a counting kernel may take: grid sizes are at least
// ceil(block strides wanted / kMaxBlockStrides), which only matters beyond 2^24 strides per block (on
// Hopper, some 10^13 elements), and keeps the 32-bit counts of Tally exact.
inline constexpr int64_t kMaxBlockStrides = int64_t{1} << 24;

__device__ __forceinline__ uint32_t float_bits(float x) {
  return __float_as_uint(x);
}

// 0x01 in each of the low W bytes.
__host__ __device__ constexpr uint32_t byte_ones(int w) {
  return w <= 0 ? 0u : (byte_ones(w - 1) << 8) | 1u;
}

// The saturating codes of W values, code k in byte k: NVIDIA's conversion, two values per cvt instruction.
// It writes exactly encode(spec, x, Overflow::saturate) for every float32 (tests/cuda, HardwareConversions).
// Compute capability 8.9 and later only.
template <Dtype Format, int W>
__device__ __forceinline__ uint32_t saturating_codes(const float (&x)[W]) {
  constexpr __nv_fp8_interpretation_t kind = Format == Dtype::e4m3 ? __NV_E4M3 : __NV_E5M2;
  uint32_t codes = 0;
#pragma unroll
  for (int k = 0; k + 1 < W; k += 2) {
    const __nv_fp8x2_storage_t pair =
        __nv_cvt_float2_to_fp8x2(make_float2(x[k], x[k + 1]), __NV_SATFINITE, kind);
    codes |= static_cast<uint32_t>(pair) << (8 * k);
  }
  if constexpr (W % 2 == 1) {
    codes |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(x[W - 1], __NV_SATFINITE, kind)) << (8 * (W - 1));
  }
  return codes;
}

// cast_one of src/numerics/quantize.cpp for W consecutive elements (element k has index `index + k`): scale
// in float32, encode, count. Returns the codes, code k in byte k (little endian: one 32-bit store writes them
// in order). Format and rounding are template parameters so that the generic encoder folds to this format's
// constants. Rounding to nearest on a GPU with FP8 conversions, the codes come from the cvt instruction and
// the overflow flag from one comparison (encode_from_saturated), a few instructions instead of the generic
// encoder's dozens; the results are the same bits.
template <Dtype Format, bool Stochastic, int W>
__device__ __forceinline__ uint32_t cast_elements(const float (&x)[W], float scale, Overflow overflow,
                                                  uint64_t seed, uint64_t index, Tally& tally) {
  static_assert(W >= 1 && W <= 4, "the codes of at most four elements fit a 32-bit word");
  constexpr MinifloatSpec spec = minifloat_spec(Format);
  constexpr uint32_t sign_bit = 1u << (spec.exponent_bits + spec.mantissa_bits);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr bool kHardwareConversion = !Stochastic && (Format == Dtype::e4m3 || Format == Dtype::e5m2);
#else
  constexpr bool kHardwareConversion = false;
#endif
  if constexpr (!Stochastic) {
    (void)seed;
    (void)index;
  }
  float scaled[W];
#pragma unroll
  for (int k = 0; k < W; ++k) {
    // __fmul_rn: round-to-nearest and never contracted into an FMA, as the host's x * scale.
    scaled[k] = __fmul_rn(x[k], scale);
  }
  EncodeResult r[W];
  if constexpr (kHardwareConversion) {
    const uint32_t saturated = saturating_codes<Format, W>(scaled);
    if (overflow == Overflow::saturate) {
      // The codes are the conversion's as they are, and the counts come from the inputs, the scaled values
      // and the codes with fewer operations than the general path below (the same results: a zero code
      // needs a finite input, as an infinite one saturates, and an overflow compares the scaled value with
      // the format's threshold exactly as encode_from_saturated does). This is most of a fused cast's
      // integer work, which bounds those kernels (docs/benchmarks.md, log entry 11).
      // Ordinary elements first. When no code's magnitude reaches the largest finite one, no input was NaN
      // (its code is NaN's, 0x7F), infinite or overflowed (those saturate to the largest), so the tally gains
      // W finite values, of which those with a zero code are the exact zeros and the underflows. The tests
      // are byte-wise on the codes, without carries across bytes as magnitudes are at most 0x7F:
      // m + (0x80 - largest) sets a byte's top bit exactly where m >= largest, and m + 0x7F exactly where
      // m >= 1.
      constexpr uint32_t ones = byte_ones(W);
      constexpr uint32_t tops = ones * sign_bit;
      constexpr uint32_t largest = max_finite_code(spec);
      static_assert(sign_bit == 0x80u && largest < sign_bit, "one sign bit over seven bits of magnitude");
      const uint32_t magnitudes = saturated & (ones * (sign_bit - 1u));
      if (((magnitudes + ones * (sign_bit - largest)) & tops) == 0u) {
        // Finite values: a float max (one instruction, |x| included) is the unsigned max of their bits.
        float m = fabsf(x[0]);
#pragma unroll
        for (int k = 1; k < W; ++k) m = fmaxf(m, fabsf(x[k]));
        tally.amax_bits = float_bits(fmaxf(__uint_as_float(tally.amax_bits), m));
        const uint32_t zero_codes = ~(magnitudes + ones * (sign_bit - 1u)) & tops;
        if (zero_codes == 0u) {
          tally.nonzero += W;
        } else {
          // A zero input has a zero code: the other zero codes are underflows.
          uint32_t zeros = 0;
#pragma unroll
          for (int k = 0; k < W; ++k) zeros += x[k] == 0.0f ? 1u : 0u;
          tally.nonzero += W - zeros;
          tally.underflowed += static_cast<uint32_t>(__popc(zero_codes)) - zeros;
        }
        return saturated;
      }
      constexpr uint32_t threshold = nearest_overflow_threshold(spec);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const uint32_t abs_bits = float_bits(x[k]) & kAbsMask;
        const uint32_t scaled_bits = float_bits(scaled[k]) & kAbsMask;
        const bool nan = abs_bits > kInfBits;
        const bool finite_nonzero = abs_bits - 1u < kInfBits - 1u;  // 0 < |x| < Inf
        // threshold <= |scaled| <= Inf, in one unsigned comparison.
        const bool overflowed = scaled_bits - threshold <= kInfBits - threshold;
        const bool zero_code = ((saturated >> (8 * k)) & (sign_bit - 1u)) == 0u;
        tally.nan_inputs += nan ? 1u : 0u;
        tally.nonzero += finite_nonzero ? 1u : 0u;
        tally.saturated += overflowed ? 1u : 0u;
        tally.underflowed += finite_nonzero && zero_code ? 1u : 0u;
        const uint32_t amax_candidate = nan ? kQuietNanBits : abs_bits;
        tally.amax_bits = amax_candidate > tally.amax_bits ? amax_candidate : tally.amax_bits;
      }
      return saturated;
    }
#pragma unroll
    for (int k = 0; k < W; ++k) {
      r[k] = encode_from_saturated(spec, scaled[k], overflow, (saturated >> (8 * k)) & 0xFFu);
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      uint32_t random_bits = 0;
      const uint32_t* random = nullptr;
      if constexpr (Stochastic) {
        random_bits = CounterRng(seed).bits(index + static_cast<uint64_t>(k));
        random = &random_bits;
      }
      r[k] = encode_checked(spec, scaled[k], overflow, random);
    }
  }
  uint32_t codes = 0;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const uint32_t abs_bits = float_bits(x[k]) & kAbsMask;
    const bool nan = abs_bits > kInfBits;
    tally.nan_inputs += nan ? 1u : 0u;
    tally.nonzero += (abs_bits != 0u && abs_bits < kInfBits) ? 1u : 0u;
    tally.saturated += r[k].overflow ? 1u : 0u;
    tally.underflowed += (abs_bits != 0u && !nan && (r[k].code & ~sign_bit) == 0u) ? 1u : 0u;
    const uint32_t amax_candidate = nan ? kQuietNanBits : abs_bits;
    tally.amax_bits = amax_candidate > tally.amax_bits ? amax_candidate : tally.amax_bits;
    codes |= r[k].code << (8 * k);
  }
  return codes;
}

// One element: its code.
template <Dtype Format, bool Stochastic>
__device__ __forceinline__ uint32_t cast_element(float x, float scale, Overflow overflow, uint64_t seed,
                                                 uint64_t index, Tally& tally) {
  const float one[1] = {x};
  return cast_elements<Format, Stochastic, 1>(one, scale, overflow, seed, index, tally);
}

// A block's or a warp's sum of Tally: 64-bit counts.
struct TallyTotals {
  uint32_t amax_bits;
  unsigned long long saturated;
  unsigned long long underflowed;
  unsigned long long nan_inputs;
  unsigned long long nonzero;
};

__device__ __forceinline__ void warp_reduce(TallyTotals& t) {
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
__device__ inline void flush_tally(const Tally& thread_tally, CastResults* results) {
  __shared__ TallyTotals warp_totals[32];
  const unsigned thread = threadIdx.y * blockDim.x + threadIdx.x;
  const unsigned lane = thread % 32u;
  const unsigned warp = thread / 32u;
  const unsigned warps = (blockDim.x * blockDim.y) / 32u;
  TallyTotals t{thread_tally.nan_inputs != 0u ? kQuietNanBits : thread_tally.amax_bits, thread_tally.saturated,
                thread_tally.underflowed, thread_tally.nan_inputs, thread_tally.nonzero};
  warp_reduce(t);
  if (lane == 0) warp_totals[warp] = t;
  __syncthreads();
  if (warp != 0) return;
  TallyTotals w = lane < warps ? warp_totals[lane] : TallyTotals{0u, 0ull, 0ull, 0ull, 0ull};
  warp_reduce(w);
  if (lane != 0) return;
  if (w.amax_bits != 0u) atomicMax(reinterpret_cast<unsigned int*>(&results->amax), w.amax_bits);
  if (w.saturated != 0u) atomicAdd(&results->saturated, w.saturated);
  if (w.underflowed != 0u) atomicAdd(&results->underflowed, w.underflowed);
  if (w.nan_inputs != 0u) atomicAdd(&results->nan_inputs, w.nan_inputs);
  if (w.nonzero != 0u) atomicAdd(&results->nonzero, w.nonzero);
}

// 1 / scale to scale_inv (where not null), by thread 0 of the block that `writes`.
__device__ __forceinline__ void write_scale_inv(float* scale_inv, float scale, bool writes) {
  // __fdiv_rn: the correctly rounded 1 / scale of the host, whatever the division flags.
  if (scale_inv != nullptr && writes && threadIdx.x == 0 && threadIdx.y == 0) {
    *scale_inv = __fdiv_rn(1.0f, scale);
  }
}
// By block 0.
__device__ __forceinline__ void write_scale_inv(float* scale_inv, float scale) {
  write_scale_inv(scale_inv, scale, blockIdx.x == 0);
}

}  // namespace octet::cuda::cast_internal
