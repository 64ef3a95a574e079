// See spec_reference.h. Deliberately plain: a sorted table of values and a binary search.
#include "spec_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace octet::testing {

SpecFormat::SpecFormat(Dtype dtype) {
  switch (dtype) {
    case Dtype::e4m3:
      exponent_bits_ = 4, mantissa_bits_ = 3, bias_ = 7, finite_only_ = true;
      break;
    case Dtype::e5m2:
      exponent_bits_ = 5, mantissa_bits_ = 2, bias_ = 15, finite_only_ = false;
      break;
    case Dtype::bf16:
      exponent_bits_ = 8, mantissa_bits_ = 7, bias_ = 127, finite_only_ = false;
      break;
    case Dtype::f16:
      exponent_bits_ = 5, mantissa_bits_ = 10, bias_ = 15, finite_only_ = false;
      break;
    default:
      throw std::invalid_argument("SpecFormat: signed formats with subnormals only");
  }
  const uint32_t positive_codes = 1u << (exponent_bits_ + mantissa_bits_);
  for (uint32_t c = 0; c < positive_codes; ++c) {
    const SpecClass k = classify(c);
    if (k == SpecClass::nan || k == SpecClass::infinity) continue;
    values_.push_back(value(c));
    codes_.push_back(c);
  }
  // Codes of one sign are ordered like their values; sort anyway rather than rely on it.
  std::vector<size_t> order(values_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values_[a] < values_[b]; });
  std::vector<double> v;
  std::vector<uint32_t> c;
  for (size_t i : order) v.push_back(values_[i]), c.push_back(codes_[i]);
  values_ = v;
  codes_ = c;
  max_finite_ = values_.back();
}

SpecClass SpecFormat::classify(uint32_t code) const {
  const uint32_t m = code & ((1u << mantissa_bits_) - 1u);
  const uint32_t e = (code >> mantissa_bits_) & ((1u << exponent_bits_) - 1u);
  const uint32_t e_max = (1u << exponent_bits_) - 1u;
  const uint32_t m_max = (1u << mantissa_bits_) - 1u;
  if (finite_only_) {
    if (e == e_max && m == m_max) return SpecClass::nan;
  } else if (e == e_max) {
    return m == 0 ? SpecClass::infinity : SpecClass::nan;
  }
  if (e == 0) return m == 0 ? SpecClass::zero : SpecClass::subnormal;
  return SpecClass::normal;
}

double SpecFormat::value(uint32_t code) const {
  const int s = static_cast<int>((code >> (exponent_bits_ + mantissa_bits_)) & 1u);
  const int e = static_cast<int>((code >> mantissa_bits_) & ((1u << exponent_bits_) - 1u));
  const double m = static_cast<double>(code & ((1u << mantissa_bits_) - 1u));
  const double sign = s ? -1.0 : 1.0;
  const double two_m = std::pow(2.0, mantissa_bits_);
  switch (classify(code)) {
    case SpecClass::nan:
      return std::numeric_limits<double>::quiet_NaN();
    case SpecClass::infinity:
      return sign * std::numeric_limits<double>::infinity();
    case SpecClass::zero:
      return sign * 0.0;
    case SpecClass::subnormal:
      return sign * std::pow(2.0, 1 - bias_) * (m / two_m);
    case SpecClass::normal:
      return sign * std::pow(2.0, e - bias_) * (1.0 + m / two_m);
  }
  return 0.0;
}

uint32_t SpecFormat::encode(double x, bool saturate, uint32_t canonical_nan) const {
  const uint32_t sign_bit = 1u << (exponent_bits_ + mantissa_bits_);
  if (std::isnan(x)) return canonical_nan;
  const uint32_t sign = std::signbit(x) ? sign_bit : 0u;
  const double a = std::fabs(x);
  const uint32_t largest = codes_.back();
  const uint32_t all_ones = (1u << (exponent_bits_ + mantissa_bits_)) - 1u;  // S.1111.111: E4M3's NaN
  const uint32_t inf_or_nan =
      sign | (finite_only_ ? all_ones : ((1u << exponent_bits_) - 1u) << mantissa_bits_);
  const uint32_t overflow = saturate ? (sign | largest) : inf_or_nan;
  if (std::isinf(a)) return overflow;

  // Beyond the largest finite value the next value of an unbounded exponent range lies one step (of the
  // top binade) further; its mantissa is the largest's plus one, so its parity is the opposite one.
  const double step = std::pow(2.0, std::floor(std::log2(max_finite_)) - mantissa_bits_);
  const double beyond = max_finite_ + step;
  if (a >= beyond) return overflow;
  if (a > max_finite_) {
    const double to_max = a - max_finite_, to_beyond = beyond - a;
    if (to_max < to_beyond) return sign | largest;
    if (to_beyond < to_max) return overflow;
    return (largest & 1u) == 0 ? (sign | largest) : overflow;  // tie: the even one wins
  }
  const auto it = std::lower_bound(values_.begin(), values_.end(), a);
  const size_t hi = static_cast<size_t>(it - values_.begin());
  if (values_[hi] == a) return sign | codes_[hi];
  const size_t lo = hi - 1;  // values_[0] == 0 < a, so hi >= 1
  const double d_lo = a - values_[lo], d_hi = values_[hi] - a;
  size_t pick;
  if (d_lo < d_hi) {
    pick = lo;
  } else if (d_hi < d_lo) {
    pick = hi;
  } else {
    pick = (codes_[lo] & 1u) == 0 ? lo : hi;
  }
  return sign | codes_[pick];
}

}  // namespace octet::testing
