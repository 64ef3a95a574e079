// A slow reference for the narrow formats, written from the specifications' formulas and independent of
// octet's bit-level encoder: every code's value comes from (-1)^s * 2^(e - bias) * (1 + m / 2^M) (or the
// subnormal form), and encoding searches those values for the nearest, breaking ties towards the code with
// an even mantissa. Overflow follows IEEE 754 round-to-nearest: values are rounded as if the exponent range
// were unbounded, and a result beyond the largest finite value overflows.
#pragma once

#include <cstdint>
#include <vector>

#include "octet/numerics/minifloat.h"

namespace octet::testing {

enum class SpecClass { zero, subnormal, normal, infinity, nan };

class SpecFormat {
 public:
  // e4m3, e5m2, bf16 or f16 (signed formats with subnormals).
  explicit SpecFormat(Dtype dtype);

  int exponent_bits() const { return exponent_bits_; }
  int mantissa_bits() const { return mantissa_bits_; }
  uint32_t code_count() const { return 1u << (1 + exponent_bits_ + mantissa_bits_); }

  SpecClass classify(uint32_t code) const;
  // The value of a code from the formula; NaN codes give a quiet NaN.
  double value(uint32_t code) const;
  double max_finite() const { return max_finite_; }

  // Round-to-nearest-even encoding of x. saturate: beyond-range finite values and infinities become
  // +-max_finite; otherwise +-Inf (formats with infinities) or the all-ones NaN pattern with x's sign (E4M3).
  // A NaN input encodes as `canonical_nan`.
  uint32_t encode(double x, bool saturate, uint32_t canonical_nan) const;

 private:
  int exponent_bits_;
  int mantissa_bits_;
  int bias_;
  bool finite_only_;  // OCP E4M3: no infinities, only S.1111.111 is NaN
  double max_finite_;
  // Positive finite values in increasing order with their codes (sign bit clear).
  std::vector<double> values_;
  std::vector<uint32_t> codes_;
};

}  // namespace octet::testing
