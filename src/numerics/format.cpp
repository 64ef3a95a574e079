// Per-dtype facts, derived from the format descriptors in minifloat.h rather than typed in.
#include "octet/numerics/format.h"

#include <array>

namespace octet {
namespace {

DtypeInfo make_info(Dtype d, const char* name) {
  const MinifloatSpec s = minifloat_spec(d);
  DtypeInfo info{};
  info.name = name;
  info.is_signed = s.specials != SpecialEncoding::unsigned_power_of_two;
  info.storage_bits = d == Dtype::f32 ? 32 : storage_bits(s);
  info.has_infinity = s.specials == SpecialEncoding::ieee;
  info.max_finite = decode(s, max_finite_code(s));
  if (s.specials == SpecialEncoding::unsigned_power_of_two) {
    info.min_normal = decode(s, 0);
    info.min_subnormal = info.min_normal;
  } else {
    info.min_normal = decode(s, 1u << s.mantissa_bits);
    info.min_subnormal = decode(s, 1u);
  }
  return info;
}

const std::array<DtypeInfo, 6>& table() {
  static const std::array<DtypeInfo, 6> t = {
      make_info(Dtype::f32, "f32"),   make_info(Dtype::bf16, "bf16"), make_info(Dtype::f16, "f16"),
      make_info(Dtype::e4m3, "e4m3"), make_info(Dtype::e5m2, "e5m2"), make_info(Dtype::e8m0, "e8m0"),
  };
  return t;
}

}  // namespace

const DtypeInfo& dtype_info(Dtype dtype) {
  return table()[static_cast<size_t>(dtype)];
}

std::string_view dtype_name(Dtype dtype) {
  return dtype_info(dtype).name;
}

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (size_t i = 0; i < table().size(); ++i) {
    if (name == table()[i].name) return static_cast<Dtype>(i);
  }
  return std::nullopt;
}

CodeClass classify(Dtype dtype, uint32_t code) {
  const MinifloatSpec s = minifloat_spec(dtype);
  if (s.specials == SpecialEncoding::unsigned_power_of_two) {
    return code == 0xFFu ? CodeClass::nan : CodeClass::normal;
  }
  const uint32_t mantissa_mask = (1u << s.mantissa_bits) - 1u;
  const uint32_t exponent_mask = (1u << s.exponent_bits) - 1u;
  const uint32_t mantissa = code & mantissa_mask;
  const uint32_t exponent = (code >> s.mantissa_bits) & exponent_mask;
  if (exponent == exponent_mask) {
    if (s.specials == SpecialEncoding::ieee) return mantissa == 0 ? CodeClass::infinity : CodeClass::nan;
    if (mantissa == mantissa_mask) return CodeClass::nan;
  }
  if (exponent == 0) return mantissa == 0 ? CodeClass::zero : CodeClass::subnormal;
  return CodeClass::normal;
}

std::string_view code_class_name(CodeClass c) {
  switch (c) {
    case CodeClass::zero:
      return "zero";
    case CodeClass::subnormal:
      return "subnormal";
    case CodeClass::normal:
      return "normal";
    case CodeClass::infinity:
      return "inf";
    case CodeClass::nan:
      return "nan";
  }
  return "?";
}

}  // namespace octet
