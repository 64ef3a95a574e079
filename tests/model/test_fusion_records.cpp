// The fusions GPT-2's ops rely on, as Model::fusions records them and precision_map.json shows them: every
// fusion the block and the head take, with the backend's answer (Backend::supports) as the layers run now,
// and the answer on the steps that measure SQNR where it differs. The CPU reference fuses nothing and says
// so; a backend that fuses is recorded as fusing.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "forwarding_backend.h"
#include "model_fixture.h"
#include "octet/model/model.h"

namespace octet {
namespace {

using testing::mode;
using testing::tiny_config;

// The CPU backend, claiming to fuse the input cast of FP8 layers except on steps that measure SQNR, as a GPU
// backend does under the delayed recipe.
class FusingInputCasts final : public testing::ForwardingBackend {
 public:
  explicit FusingInputCasts(Backend& inner) : ForwardingBackend(inner) {}
  std::string_view name() const override { return "cpu, fusing input casts"; }
  FusionSupport supports(Fusion fusion, const LinearExecution& layer) const override {
    if (fusion != Fusion::input_cast) return ForwardingBackend::supports(fusion, layer);
    if (layer.telemetry != nullptr && layer.measure_sqnr) return {false, "test fallback on SQNR steps"};
    return {true, {}};
  }
};

std::vector<std::string> described(const std::vector<FusionRecord>& records) {
  std::vector<std::string> out;
  for (const FusionRecord& r : records) {
    out.push_back(r.layer + " " + std::string(fusion_name(r.fusion)) + " " + r.producer);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FusionRecords, NameEveryFusionOfTheBlockWithTheCpuFallback) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  Decoder model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp8), c, 32), 2, 16);
  const std::vector<FusionRecord> records = model.fusions();
  std::vector<std::string> expected;
  for (int l = 0; l < c.layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    expected.push_back(h + "attn.c_attn input_cast " + h + "ln_1");
    expected.push_back(h + "attn.c_proj residual_add " + h + "attn.c_proj");
    expected.push_back(h + "mlp.c_fc input_cast " + h + "ln_2");
    expected.push_back(h + "mlp.c_fc gradient_cast " + h + "mlp.gelu");
    expected.push_back(h + "mlp.c_proj input_cast " + h + "mlp.gelu");
    expected.push_back(h + "mlp.c_proj residual_add " + h + "mlp.c_proj");
  }
  std::sort(expected.begin(), expected.end());
  // The head stays BF16 by default: nothing casts its input.
  EXPECT_EQ(described(records), expected);
  for (const FusionRecord& r : records) {
    EXPECT_FALSE(r.support.fused) << r.layer;
    EXPECT_EQ(r.support.fallback.rfind("the cpu backend runs each op in passes of its own: ", 0), 0u)
        << r.support.fallback;
    EXPECT_FALSE(r.on_sqnr_steps.has_value()) << "the CPU answers the same on every step";
  }
  const std::string json = precision_map_json(model);
  EXPECT_NE(
      json.find(R"("reason": "FP8 by policy", "input_cast": "h.0.ln_1, not fused: the cpu backend runs )"
                R"(each op in passes of its own: the producer writes its output, then the FP8 cast )"
                R"(reads it in a pass of its own"})"),
      std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("residual_add": "h.1.mlp.c_proj, not fused: the cpu backend runs)"),
            std::string::npos)
      << json;
  // The head takes no fusion: its object ends at its reason.
  EXPECT_NE(
      json.find(R"({"layer": "lm_head", "in_features": 64, "out_features": 64, "forward": "bf16", )"
                R"("input_gradient": "bf16", "weight_gradient": "bf16", "reason": "excluded by config"})"),
      std::string::npos)
      << json;
}

TEST(FusionRecords, FollowTheLayersModes) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  // Without FP8 no cast is fused, but both c_proj layers still add the residual in their GEMM.
  Decoder wide(c, *backend, PrecisionPolicy(mode(MixedPrecision::bf16), c, 32), 2, 16);
  for (const FusionRecord& r : wide.fusions()) EXPECT_EQ(r.fusion, Fusion::residual_add) << r.layer;
  EXPECT_EQ(wide.fusions().size(), static_cast<size_t>(2 * c.layers));

  // An FP8 head's input cast comes from ln_f; a layer moved to BF16 takes no cast from its producer.
  PrecisionSettings precision = mode(MixedPrecision::fp8);
  precision.lm_head = true;
  Decoder model(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16);
  const std::vector<std::string> before = described(model.fusions());
  EXPECT_NE(std::find(before.begin(), before.end(), "lm_head input_cast ln_f"), before.end());
  model.move_layer_to_bf16("h.1.mlp.c_fc", "BF16 by test");
  const std::vector<std::string> after = described(model.fusions());
  EXPECT_EQ(after.size(), before.size() - 2);
  EXPECT_EQ(std::find(after.begin(), after.end(), "h.1.mlp.c_fc input_cast h.1.ln_2"), after.end());
  EXPECT_EQ(std::find(after.begin(), after.end(), "h.1.mlp.c_fc gradient_cast h.1.mlp.gelu"), after.end());
}

TEST(FusionRecords, SayWhatABackendFusesAndWhereItFallsBack) {
  const ModelConfig c = tiny_config();
  auto cpu = make_cpu_backend();
  FusingInputCasts backend(*cpu);
  Decoder model(c, backend, PrecisionPolicy(mode(MixedPrecision::fp8), c, 32), 2, 16);
  size_t input_casts = 0;
  for (const FusionRecord& r : model.fusions()) {
    if (r.fusion != Fusion::input_cast) {
      EXPECT_FALSE(r.support.fused);
      EXPECT_FALSE(r.on_sqnr_steps.has_value());
      continue;
    }
    ++input_casts;
    EXPECT_TRUE(r.support.fused) << r.layer;
    EXPECT_TRUE(r.support.fallback.empty());
    ASSERT_TRUE(r.on_sqnr_steps.has_value()) << r.layer;
    EXPECT_FALSE(r.on_sqnr_steps->fused);
    EXPECT_EQ(r.on_sqnr_steps->fallback, "test fallback on SQNR steps");
  }
  EXPECT_EQ(input_casts, static_cast<size_t>(3 * c.layers));
  const std::string json = precision_map_json(model);
  EXPECT_NE(json.find(R"("input_cast": "h.1.mlp.gelu, fused; on steps that measure SQNR not fused: test )"
                      R"(fallback on SQNR steps", "residual_add": "h.1.mlp.c_proj, not fused: )"),
            std::string::npos)
      << json;
}

}  // namespace
}  // namespace octet
