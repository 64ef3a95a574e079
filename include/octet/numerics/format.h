// Facts about each dtype (name, limits, classes of codes) and the host-side conversions built on
// minifloat.h: the public face of octet's number formats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "octet/numerics/minifloat.h"

namespace octet {

enum class CodeClass : uint8_t { zero, subnormal, normal, infinity, nan };

struct DtypeInfo {
  const char* name;     // "e4m3", "e5m2", "e8m0", "bf16", "f16", "f32"
  int storage_bits;     // 8, 16 or 32
  float max_finite;     // largest finite value
  float min_normal;     // smallest positive normal
  float min_subnormal;  // smallest positive value (== min_normal where there are no subnormals)
  bool has_infinity;
  bool is_signed;
};

const DtypeInfo& dtype_info(Dtype dtype);
std::string_view dtype_name(Dtype dtype);

// Parses "e4m3", "e5m2", ... (exact spellings). Returns nullopt for anything else.
std::optional<Dtype> parse_dtype(std::string_view name);

// True for the 8-bit formats that tensors are cast to (E4M3 and E5M2; E8M0 holds scales only).
constexpr bool is_fp8(Dtype d) {
  return d == Dtype::e4m3 || d == Dtype::e5m2;
}

CodeClass classify(Dtype dtype, uint32_t code);
std::string_view code_class_name(CodeClass c);

// Host conversions for any dtype; codes live in the low storage_bits bits.
inline uint32_t encode(Dtype dtype, float x, Overflow overflow = Overflow::saturate) {
  return encode(minifloat_spec(dtype), x, overflow);
}
inline float decode(Dtype dtype, uint32_t code) {
  return decode(minifloat_spec(dtype), code);
}

// Rounds x to the nearest value of dtype (ties to even) and returns it as float32.
inline float round_to(Dtype dtype, float x, Overflow overflow = Overflow::saturate) {
  if (dtype == Dtype::f32) return x;
  return decode(dtype, encode(dtype, x, overflow));
}

}  // namespace octet
