// Which of the Fusion kinds the CUDA backend runs inside a neighbouring op's pass (Backend::supports). The
// ops decide by the same answers: producer_casts (operand_casts.cu; LayerNorm, GELU, and RMSNorm and SwiGLU
// in norm_activation.cu, which all fuse on the same terms, so the answer depends on the consumer layer alone)
// and the forward GEMM's residual epilogue (linear.cu).
#include <fmt/format.h>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {

namespace {

// Why a recipe's cast cannot be written by its producer, or empty where it can: the producer must know
// the scale before it writes the codes.
std::string_view recipe_cannot_fuse(RecipeKind kind) {
  switch (kind) {
    case RecipeKind::delayed:
    case RecipeKind::static_scale:
      return {};
    case RecipeKind::current:
      return "the current recipe scales by the tensor's own amax, which a pass must find before the cast";
    case RecipeKind::block:
    case RecipeKind::mxfp8:
      return "block scales are taken from each block's amax, which a pass must find before the cast";
  }
  return "the recipe's scale is not known before the cast";
}

}  // namespace

FusionSupport CudaBackend::supports(Fusion fusion, const LinearExecution& layer) const {
  switch (fusion) {
    case Fusion::input_cast:
    case Fusion::gradient_cast: {
      if (layer.recipe == nullptr) return Backend::supports(fusion, layer);
      const std::string_view why = recipe_cannot_fuse(layer.recipe->kind());
      if (!why.empty()) return {false, fmt::format("{}: {}", why, separate_passes(fusion))};
      if (layer.telemetry != nullptr && layer.measure_sqnr) {
        return {false, fmt::format("this step measures the cast's SQNR, which reads the float values: {}",
                                   separate_passes(fusion))};
      }
      return {true, {}};
    }
    case Fusion::residual_add:
      if (layer.forward == GemmMode::fp8 && emulate_fp8_) {
        return {false, fmt::format("FP8 GEMMs are emulated through BF16 ones here (no FP8 tensor cores, or "
                                   "emulation asked for), and the emulation's output is not the GEMM's: {}",
                                   separate_passes(fusion))};
      }
      return {true, {}};
  }
  return Backend::supports(fusion, layer);
}

}  // namespace octet::cuda::backend_internal
