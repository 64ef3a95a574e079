// Bit-exact conversions between float32 and the narrow floating-point formats octet uses (E4M3, E5M2, E8M0,
// BF16, FP16). One generic encoder driven by a format descriptor, written with integer arithmetic only, so
// the same function compiles for the host and for CUDA devices: the CPU backend and the GPU kernels make the
// same rounding decisions by construction, and a device test holds both to the hardware conversion.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OCTET_HOST_DEVICE __host__ __device__
#else
#define OCTET_HOST_DEVICE
#endif

namespace octet {

// The value types a tensor can hold. A runtime property of a tensor, never a template parameter.
enum class Dtype : uint8_t { f32, bf16, f16, e4m3, e5m2, e8m0 };

// What a cast does with a finite value whose rounded magnitude is beyond the format's largest finite value.
enum class Overflow : uint8_t {
  saturate,        // clamp to +-largest finite; +-Inf also becomes +-largest finite (CUDA's __NV_SATFINITE)
  non_saturating,  // become +-Inf where the format has infinities, NaN with the value's sign otherwise (E4M3)
};

// How special bit patterns are laid out in a format.
enum class SpecialEncoding : uint8_t {
  ieee,                   // exponent all ones: mantissa 0 is Inf, anything else NaN (E5M2, FP16, BF16)
  finite_only,            // no infinities; only exponent and mantissa all ones is NaN (OCP E4M3, "FN")
  unsigned_power_of_two,  // E8M0: no sign, no mantissa, no zero; 0xFF is NaN
};

struct MinifloatSpec {
  int exponent_bits;
  int mantissa_bits;
  int exponent_bias;
  SpecialEncoding specials;
};

OCTET_HOST_DEVICE constexpr MinifloatSpec minifloat_spec(Dtype dtype) {
  switch (dtype) {
    case Dtype::e4m3:
      return {4, 3, 7, SpecialEncoding::finite_only};
    case Dtype::e5m2:
      return {5, 2, 15, SpecialEncoding::ieee};
    case Dtype::e8m0:
      return {8, 0, 127, SpecialEncoding::unsigned_power_of_two};
    case Dtype::bf16:
      return {8, 7, 127, SpecialEncoding::ieee};
    case Dtype::f16:
      return {5, 10, 15, SpecialEncoding::ieee};
    case Dtype::f32:
      return {8, 23, 127, SpecialEncoding::ieee};
  }
  return {8, 23, 127, SpecialEncoding::ieee};
}

OCTET_HOST_DEVICE constexpr int storage_bits(const MinifloatSpec& s) {
  return (s.specials == SpecialEncoding::unsigned_power_of_two ? 0 : 1) + s.exponent_bits + s.mantissa_bits;
}

// The NaN a NaN input encodes to: sign clear, every other bit set (what NVIDIA's conversions write).
OCTET_HOST_DEVICE constexpr uint32_t canonical_nan(const MinifloatSpec& s) {
  return (s.specials == SpecialEncoding::unsigned_power_of_two)
             ? 0xFFu
             : (1u << (s.exponent_bits + s.mantissa_bits)) - 1u;
}

// Largest finite magnitude as a code with the sign bit clear.
OCTET_HOST_DEVICE constexpr uint32_t max_finite_code(const MinifloatSpec& s) {
  const uint32_t exponent_all_ones = (1u << s.exponent_bits) - 1u;
  const uint32_t mantissa_all_ones = (1u << s.mantissa_bits) - 1u;
  switch (s.specials) {
    case SpecialEncoding::ieee:
      return ((exponent_all_ones - 1u) << s.mantissa_bits) | mantissa_all_ones;
    case SpecialEncoding::finite_only:
      return (exponent_all_ones << s.mantissa_bits) | (mantissa_all_ones - 1u);
    case SpecialEncoding::unsigned_power_of_two:
      return 0xFEu;
  }
  return 0;
}

// The code, sign bit clear, that a value beyond the largest finite one becomes: the largest finite value when
// saturating; otherwise Inf, or NaN in formats without infinities (S.1111.111 in E4M3), as CUDA's __NV_NOSAT
// conversion and PyTorch's float8_e4m3fn cast write it.
OCTET_HOST_DEVICE constexpr uint32_t overflow_code(const MinifloatSpec& s, Overflow overflow) {
  if (overflow == Overflow::saturate) return max_finite_code(s);
  return s.specials == SpecialEncoding::ieee ? ((1u << s.exponent_bits) - 1u) << s.mantissa_bits
                                             : canonical_nan(s);
}

// The least float32 magnitude, as bits, that overflows format `s` when rounding to nearest, ties to even.
// Rounding acts as if the exponent range went on, so the edge is the midpoint between the largest finite
// value and the step beyond it: the midpoint itself overflows when the largest finite value's mantissa is odd
// (the tie goes to the even step beyond, E5M2's 61440), and only the float32 above it when that mantissa is
// even (the tie stays on the largest finite value, E4M3's 464). For the signed formats narrower than
// float32: E4M3, E5M2, BF16, FP16.
OCTET_HOST_DEVICE constexpr uint32_t nearest_overflow_threshold(const MinifloatSpec& s) {
  const uint32_t largest = max_finite_code(s);
  const uint32_t mantissa = largest & ((1u << s.mantissa_bits) - 1u);
  const int exponent = static_cast<int>(largest >> s.mantissa_bits) - s.exponent_bias;  // a normal value
  // The midpoint is 1.m1 x 2^exponent, m the largest value's mantissa: one more bit below it.
  const uint32_t midpoint =
      (static_cast<uint32_t>(exponent + 127) << 23) | (((mantissa << 1) | 1u) << (22 - s.mantissa_bits));
  return (mantissa & 1u) != 0u ? midpoint : midpoint + 1u;
}
static_assert(nearest_overflow_threshold(minifloat_spec(Dtype::e4m3)) == 0x43E80001u,
              "E4M3: 464 = 0x43E80000 rounds to 448 (ties to even); the float32 above it overflows");
static_assert(nearest_overflow_threshold(minifloat_spec(Dtype::e5m2)) == 0x47700000u,
              "E5M2: 61440 = 0x47700000 rounds past 57344 (ties to even) and overflows");

namespace detail {

OCTET_HOST_DEVICE inline uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

OCTET_HOST_DEVICE inline float bits_float(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

OCTET_HOST_DEVICE inline int floor_log2(uint32_t v) {  // v > 0
#if defined(__CUDA_ARCH__)
  return 31 - __clz(static_cast<int>(v));
#else
  return 31 - __builtin_clz(v);
#endif
}

// 2^e as a float for e in [-149, 127], built from bits so that no library call is needed on the device.
OCTET_HOST_DEVICE inline float exp2_int(int e) {
  if (e >= -126) return bits_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_float(1u << (e + 149));
}

// Result of rounding a magnitude to a format: the code with the sign bit clear, or overflow.
struct Rounded {
  uint32_t code;
  bool overflow;
};

// Rounds a finite, non-zero float32 magnitude `abs_bits` to the format. `random_bits` null means round to
// nearest, ties to even; otherwise the value rounds away from zero with probability equal to the discarded
// fraction of a quantum (to 2^-32), using the 32 random bits given.
OCTET_HOST_DEVICE inline Rounded round_magnitude(const MinifloatSpec& s, uint32_t abs_bits,
                                                 const uint32_t* random_bits) {
  // |x| = significand * 2^exponent, with an integer significand of at most 24 bits.
  const uint32_t biased = abs_bits >> 23;
  const uint32_t fraction = abs_bits & 0x7FFFFFu;
  const uint32_t significand = biased ? (fraction | 0x800000u) : fraction;
  const int exponent = biased ? static_cast<int>(biased) - 150 : -149;

  const int leading = floor_log2(significand) + exponent;  // floor(log2 |x|)
  const bool has_subnormals = s.specials != SpecialEncoding::unsigned_power_of_two;
  const int min_exponent = has_subnormals ? 1 - s.exponent_bias : -s.exponent_bias;
  // Exponent of one unit in the last place at this magnitude. E8M0 has no subnormals: below its least
  // value the quantum stays that of the least binade.
  const int quantum = (leading > min_exponent ? leading : min_exponent) - s.mantissa_bits;
  const int shift = quantum - exponent;  // bits of the significand below the quantum

  uint64_t n;  // |x| rounded, in quanta
  if (shift <= 0) {
    n = static_cast<uint64_t>(significand) << (-shift);
  } else {
    const uint64_t kept = shift >= 32 ? 0 : (significand >> shift);
    const uint64_t discarded = shift >= 32 ? significand : (significand & ((1u << shift) - 1u));
    n = kept;
    if (random_bits == nullptr) {
      // Compare the discarded bits with one half quantum; a tie goes to the even neighbour.
      if (shift <= 32) {
        const uint64_t half = uint64_t{1} << (shift - 1);
        if (discarded > half || (discarded == half && (kept & 1u))) n += 1;
      }
      // shift > 32: |x| < 2^-8 quanta, far below one half; rounds to zero.
    } else {
      // Probability discarded / 2^shift, quantised to a multiple of 2^-32.
      uint64_t threshold;
      if (shift <= 32) {
        threshold = discarded << (32 - shift);
      } else {
        threshold = (shift - 32 >= 64) ? 0 : (discarded >> (shift - 32));
      }
      if (static_cast<uint64_t>(*random_bits) < threshold) n += 1;
    }
  }

  // Underflow to zero. For E8M0, which has no zero, code 0 is its least value 2^-127: tiny positive
  // values encode there.
  if (n == 0) return {0u, false};
  int code_exponent = quantum;
  const uint64_t implicit = uint64_t{1} << s.mantissa_bits;
  if (n >= 2 * implicit) {  // rounding carried into the next binade
    n >>= 1;
    code_exponent += 1;
  }
  uint32_t exponent_field;
  uint32_t mantissa_field;
  if (n < implicit) {  // subnormal
    exponent_field = 0;
    mantissa_field = static_cast<uint32_t>(n);
  } else {
    exponent_field = static_cast<uint32_t>(code_exponent + s.mantissa_bits + s.exponent_bias);
    mantissa_field = static_cast<uint32_t>(n - implicit);
  }
  const uint32_t code = (exponent_field << s.mantissa_bits) | mantissa_field;
  const uint32_t largest = max_finite_code(s);
  // Codes of one format compare like their magnitudes; anything past the largest finite overflowed.
  return {code, code > largest};
}

}  // namespace detail

// A code and whether the value was beyond the format's range: an infinite input, or a finite one whose
// rounded magnitude exceeded the largest finite value (the saturating cast clamped it; the non-saturating
// cast produced Inf or NaN).
struct EncodeResult {
  uint32_t code;
  bool overflow;
};

// Encodes float32 `x` into format `s`, rounding to nearest with ties to even (or stochastically when
// `random_bits` is given). The code is in the low storage_bits(s) bits.
OCTET_HOST_DEVICE inline EncodeResult encode_checked(const MinifloatSpec& s, float x, Overflow overflow,
                                                     const uint32_t* random_bits = nullptr) {
  const uint32_t bits = detail::float_bits(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const bool is_unsigned = s.specials == SpecialEncoding::unsigned_power_of_two;
  const uint32_t sign = (bits >> 31) && !is_unsigned ? 1u << (s.exponent_bits + s.mantissa_bits) : 0u;
  const uint32_t nan = canonical_nan(s);
  // Overflow keeps the input's sign: without saturation that is +-Inf, or in E4M3 the NaN code S.1111.111.
  const uint32_t overflowed = sign | overflow_code(s, overflow);

  if (abs_bits > 0x7F800000u) return {nan, false};
  if (is_unsigned) {
    // E8M0 holds positive powers of two only. Zero and negative values have no code: NaN, or the least
    // value 2^-127 when saturating.
    if ((bits >> 31) || abs_bits == 0) return {overflow == Overflow::saturate ? 0u : nan, false};
  }
  if (abs_bits == 0x7F800000u) return {overflowed, true};
  if (abs_bits == 0) return {sign, false};
  const detail::Rounded r = detail::round_magnitude(s, abs_bits, random_bits);
  if (r.overflow) return {overflowed, true};
  return {sign | r.code, false};
}

OCTET_HOST_DEVICE inline uint32_t encode(const MinifloatSpec& s, float x, Overflow overflow,
                                         const uint32_t* random_bits = nullptr) {
  return encode_checked(s, x, overflow, random_bits).code;
}

// encode_checked(s, x, overflow) rounding to nearest, given the code that the saturating cast writes for x:
// overflow is one comparison with nearest_overflow_threshold (Inf overflows, NaN does not), and without
// saturation an overflowed value takes overflow_code instead; every other code is the same in both modes.
// For code paths that take the saturating code from NVIDIA's conversion instruction, which writes exactly
// encode(s, x, Overflow::saturate) for E4M3 and E5M2 (tests/cuda, every float32). Formats as
// nearest_overflow_threshold.
OCTET_HOST_DEVICE inline EncodeResult encode_from_saturated(const MinifloatSpec& s, float x,
                                                            Overflow overflow, uint32_t saturated_code) {
  const uint32_t bits = detail::float_bits(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const bool overflowed = abs_bits >= nearest_overflow_threshold(s) && abs_bits <= 0x7F800000u;
  if (overflowed && overflow == Overflow::non_saturating) {
    const uint32_t sign = (bits >> 31) << (s.exponent_bits + s.mantissa_bits);
    return {sign | overflow_code(s, Overflow::non_saturating), true};
  }
  return {saturated_code, overflowed};
}

// Decodes a code of format `s` to float32 (exact: every value of these formats is a float32).
OCTET_HOST_DEVICE inline float decode(const MinifloatSpec& s, uint32_t code) {
  const uint32_t mantissa_mask = (1u << s.mantissa_bits) - 1u;
  const uint32_t exponent_mask = (1u << s.exponent_bits) - 1u;
  const uint32_t mantissa = code & mantissa_mask;
  const uint32_t exponent = (code >> s.mantissa_bits) & exponent_mask;
  const float quiet_nan = detail::bits_float(0x7FC00000u);
  if (s.specials == SpecialEncoding::unsigned_power_of_two) {
    if (code == 0xFFu) return quiet_nan;
    return detail::exp2_int(static_cast<int>(code) - s.exponent_bias);
  }
  const bool negative = (code >> (s.exponent_bits + s.mantissa_bits)) & 1u;
  float magnitude;
  if (exponent == exponent_mask && (s.specials == SpecialEncoding::ieee || mantissa == mantissa_mask)) {
    if (s.specials == SpecialEncoding::ieee && mantissa == 0) {
      magnitude = detail::bits_float(0x7F800000u);
    } else {
      return quiet_nan;
    }
  } else if (exponent == 0) {
    // mantissa * 2^(1 - bias - mantissa_bits), exact in float32 for every format here.
    magnitude = static_cast<float>(mantissa) * detail::exp2_int(1 - s.exponent_bias - s.mantissa_bits);
  } else {
    magnitude = static_cast<float>(mantissa | (1u << s.mantissa_bits)) *
                detail::exp2_int(static_cast<int>(exponent) - s.exponent_bias - s.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Convenience forms for the formats used on hot paths.
OCTET_HOST_DEVICE inline uint8_t float_to_e4m3(float x, Overflow o = Overflow::saturate) {
  return static_cast<uint8_t>(encode(minifloat_spec(Dtype::e4m3), x, o));
}
OCTET_HOST_DEVICE inline uint8_t float_to_e5m2(float x, Overflow o = Overflow::saturate) {
  return static_cast<uint8_t>(encode(minifloat_spec(Dtype::e5m2), x, o));
}
OCTET_HOST_DEVICE inline uint16_t float_to_bf16(float x) {
  return static_cast<uint16_t>(encode(minifloat_spec(Dtype::bf16), x, Overflow::non_saturating));
}
OCTET_HOST_DEVICE inline uint16_t float_to_f16(float x) {
  return static_cast<uint16_t>(encode(minifloat_spec(Dtype::f16), x, Overflow::non_saturating));
}
// x rounded to BF16 (nearest, ties to even; overflow to +-Inf) and returned as float32: the same result as
// decode(encode(bf16, x)), by integer rounding of the bit pattern. The hot path of BF16 emulation.
OCTET_HOST_DEVICE inline float round_to_bf16(float x) {
  uint32_t u = detail::float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return detail::bits_float(0x7FFF0000u);  // canonical NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return detail::bits_float(u & 0xFFFF0000u);
}

// x rounded to FP16 (nearest, ties to even; overflow to +-Inf) and returned as float32, equal to
// decode(encode(f16, x)). Normal range: round float32's mantissa to 10 bits. Subnormal range (below 2^-14):
// adding and subtracting 0.5 rounds to a multiple of 2^-24, ties to even, in the float adder itself.
OCTET_HOST_DEVICE inline float round_to_f16(float x) {
  const uint32_t u = detail::float_bits(x);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return detail::bits_float(0x7FFFE000u);  // canonical NaN (FP16 0x7FFF)
  uint32_t r;
  if (a < 0x38800000u) {  // below 2^-14
    const float m = (detail::bits_float(a) + 0.5f) - 0.5f;
    r = detail::float_bits(m);
  } else {
    r = (a + 0xFFFu + ((a >> 13) & 1u)) & 0xFFFFE000u;
    if (r > 0x477FE000u) r = 0x7F800000u;  // beyond 65504
  }
  return detail::bits_float(sign | r);
}

OCTET_HOST_DEVICE inline float e4m3_to_float(uint8_t c) {
  return decode(minifloat_spec(Dtype::e4m3), c);
}
OCTET_HOST_DEVICE inline float e5m2_to_float(uint8_t c) {
  return decode(minifloat_spec(Dtype::e5m2), c);
}
OCTET_HOST_DEVICE inline float bf16_to_float(uint16_t c) {
  return decode(minifloat_spec(Dtype::bf16), c);
}
OCTET_HOST_DEVICE inline float f16_to_float(uint16_t c) {
  return decode(minifloat_spec(Dtype::f16), c);
}

}  // namespace octet
