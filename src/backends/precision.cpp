// Names of the training modes and GEMM modes.
#include "octet/backend/precision.h"
#include "octet/backend/backend.h"
#include "octet/check.h"

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

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::gemm_fp8:
      return "FP8 GEMMs";
    case OpKind::gemm_wide:
      return "BF16/FP16/FP32 GEMMs";
    case OpKind::attention:
      return "attention";
    case OpKind::casts:
      return "casts and conversions";
    case OpKind::norm_activation:
      return "LayerNorm and GELU (fused casts included)";
    case OpKind::loss:
      return "cross-entropy";
    case OpKind::optimizer:
      return "optimizer (fused weight casts included)";
    case OpKind::other:
      return "embeddings, residuals, biases, zeroing";
    case OpKind::count:
      break;
  }
  return "?";
}

bool input_cast_suffices(const LinearExecution& exec) {
  return exec.forward == GemmMode::fp8 && exec.weight_gradient == GemmMode::fp8 && exec.recipe != nullptr &&
         exec.recipe->granularity(TensorRole::activation) == ScaleGranularity::per_tensor;
}

bool casts_gradient(const LinearExecution& exec) {
  return exec.input_gradient == GemmMode::fp8 || exec.weight_gradient == GemmMode::fp8;
}

bool gradient_cast_suffices(const LinearExecution& exec) {
  return exec.input_gradient == GemmMode::fp8 && exec.weight_gradient == GemmMode::fp8 &&
         exec.recipe != nullptr &&
         exec.recipe->granularity(TensorRole::gradient) == ScaleGranularity::per_tensor;
}

void check_gradient_cast(const LinearExecution& exec, bool cast_by_producer, const void* dout,
                         const float* dbias) {
  OCTET_CHECK(!cast_by_producer || (casts_gradient(exec) && dbias == nullptr),
              "a producer's gradient cast for a layer with an FP8 backward GEMM, and no second bias sum");
  OCTET_CHECK(dout != nullptr || (cast_by_producer && gradient_cast_suffices(exec)),
              "the float32 output gradient");
}

}  // namespace octet
