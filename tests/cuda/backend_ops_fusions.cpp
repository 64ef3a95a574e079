// The CUDA backend's answers to Backend::supports, which its ops follow (producer_casts and the residual
// epilogue ask the same question): producers cast their consumer's input and output gradient in their own
// pass where the recipe knows the scale before the cast and no SQNR is measured; the forward GEMM adds the
// residual in its epilogue unless FP8 is emulated. And a GPT-2 on the GPU records those answers in its
// precision map. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend_ops_harness.h"
#include "octet/backend/cuda_backend.h"
#include "octet/model/model.h"
#include "tiny_model.h"

namespace {

using octet::Backend;
using octet::Fusion;
using octet::FusionSupport;
using octet::GemmMode;
using octet::LinearExecution;

bool mentions(const FusionSupport& s, const std::string& words) {
  return s.fallback.find(words) != std::string::npos;
}

TEST(CudaFusions, ProducersCastWhereTheScaleIsKnownBeforeTheCast) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const std::unique_ptr<Backend> backend = octet::testing::backend_ops::make_tested_backend();
  const octet::DelayedScaling delayed;
  const octet::StaticScaling fixed(4.0f);
  const octet::CurrentScaling current;
  const octet::BlockScaling block;
  const octet::MxScaling mx;
  octet::Fp8LinearTelemetry telemetry;
  for (const Fusion fusion : {Fusion::input_cast, Fusion::gradient_cast}) {
    SCOPED_TRACE(std::string(octet::fusion_name(fusion)));
    LinearExecution exec;
    exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
    for (const octet::ScalingRecipe* recipe : {static_cast<const octet::ScalingRecipe*>(&delayed),
                                               static_cast<const octet::ScalingRecipe*>(&fixed)}) {
      exec.recipe = recipe;
      exec.telemetry = nullptr;
      exec.measure_sqnr = false;
      const FusionSupport fused = backend->supports(fusion, exec);
      EXPECT_TRUE(fused.fused) << recipe->describe();
      EXPECT_TRUE(fused.fallback.empty());
      exec.telemetry = &telemetry;  // counted, but no SQNR: still fused
      EXPECT_TRUE(backend->supports(fusion, exec).fused);
      exec.measure_sqnr = true;
      const FusionSupport sqnr = backend->supports(fusion, exec);
      EXPECT_FALSE(sqnr.fused);
      EXPECT_TRUE(mentions(sqnr, "SQNR")) << sqnr.fallback;
      EXPECT_TRUE(mentions(sqnr, octet::separate_passes(fusion))) << sqnr.fallback;
    }
    exec.telemetry = nullptr;
    exec.measure_sqnr = false;
    exec.recipe = &current;
    const FusionSupport amax = backend->supports(fusion, exec);
    EXPECT_FALSE(amax.fused);
    EXPECT_TRUE(mentions(amax, "the current recipe scales by the tensor's own amax")) << amax.fallback;
    for (const octet::ScalingRecipe* recipe :
         {static_cast<const octet::ScalingRecipe*>(&block), static_cast<const octet::ScalingRecipe*>(&mx)}) {
      exec.recipe = recipe;
      const FusionSupport blocks = backend->supports(fusion, exec);
      EXPECT_FALSE(blocks.fused) << recipe->describe();
      EXPECT_TRUE(mentions(blocks, "block scales")) << blocks.fallback;
    }
  }
}

TEST(CudaFusions, TheGemmAddsTheResidualUnlessFp8IsEmulated) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const std::unique_ptr<Backend> backend = octet::testing::backend_ops::make_tested_backend();
  octet::CudaBackendOptions options;
  options.emulate_fp8 = true;
  const std::unique_ptr<Backend> emulating = octet::make_cuda_backend(options);
  const octet::DelayedScaling delayed;
  for (const GemmMode mode : {GemmMode::f32, GemmMode::bf16, GemmMode::f16, GemmMode::fp8}) {
    SCOPED_TRACE(std::string(octet::gemm_mode_name(mode)));
    LinearExecution exec;
    exec.forward = exec.input_gradient = exec.weight_gradient = mode;
    if (mode == GemmMode::fp8) exec.recipe = &delayed;
    EXPECT_TRUE(backend->supports(Fusion::residual_add, exec).fused);
    const FusionSupport emulated = emulating->supports(Fusion::residual_add, exec);
    EXPECT_EQ(emulated.fused, mode != GemmMode::fp8);
    if (mode == GemmMode::fp8) {
      EXPECT_TRUE(mentions(emulated, "emulated")) << emulated.fallback;
      EXPECT_TRUE(mentions(emulated, octet::separate_passes(Fusion::residual_add))) << emulated.fallback;
    }
  }
}

TEST(CudaFusions, Gpt2RecordsThemInItsPrecisionMap) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const std::unique_ptr<Backend> backend = octet::testing::backend_ops::make_tested_backend();
  const octet::ModelConfig c = octet::testing::tiny_config();
  octet::PrecisionSettings precision;
  precision.mode = octet::MixedPrecision::fp8;
  for (const octet::RecipeKind kind : {octet::RecipeKind::delayed, octet::RecipeKind::current}) {
    precision.recipe = kind;
    const auto model = octet::make_model(c, *backend, octet::PrecisionPolicy(precision, c, 32), 2, 16);
    size_t casts = 0, residuals = 0;
    for (const octet::FusionRecord& r : model->fusions()) {
      SCOPED_TRACE(r.layer + " " + std::string(octet::fusion_name(r.fusion)));
      if (r.fusion == Fusion::residual_add) {
        ++residuals;
        EXPECT_TRUE(r.support.fused);
        continue;
      }
      ++casts;
      EXPECT_EQ(r.support.fused, kind == octet::RecipeKind::delayed);
      // Under the delayed recipe only the steps that measure SQNR cast apart.
      EXPECT_EQ(r.on_sqnr_steps.has_value(), kind == octet::RecipeKind::delayed);
    }
    EXPECT_EQ(casts, static_cast<size_t>(4 * c.layers));
    EXPECT_EQ(residuals, static_cast<size_t>(2 * c.layers));
    const std::string json = octet::precision_map_json(*model);
    EXPECT_NE(json.find(R"("residual_add": "h.1.mlp.c_proj, fused"})"), std::string::npos) << json;
  }
}

}  // namespace
