// Names of the training modes and GEMM modes.
#include "octet/backend/precision.h"

namespace octet {

std::string_view mixed_precision_name(MixedPrecision m) {
  switch (m) {
    case MixedPrecision::fp32:
      return "fp32";
    case MixedPrecision::bf16:
      return "bf16";
    case MixedPrecision::fp16:
      return "fp16";
    case MixedPrecision::fp8:
      return "fp8";
  }
  return "?";
}

std::optional<MixedPrecision> parse_mixed_precision(std::string_view s) {
  for (const MixedPrecision m :
       {MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp16, MixedPrecision::fp8}) {
    if (s == mixed_precision_name(m)) return m;
  }
  return std::nullopt;
}

std::string_view gemm_mode_name(GemmMode m) {
  switch (m) {
    case GemmMode::f32:
      return "f32";
    case GemmMode::bf16:
      return "bf16";
    case GemmMode::f16:
      return "f16";
    case GemmMode::fp8:
      return "fp8";
  }
  return "?";
}

}  // namespace octet
