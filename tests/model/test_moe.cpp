// The mixture-of-experts Llama on the CPU backend: its parameters and precision policy (router and experts
// excluded from FP8 by default, converted one scaling state per expert with fp8.experts), its gradients,
// the load-balancing loss's included, against finite differences of the loss it trains on, and training in
// every precision mode.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/model/decoder.h"
#include "tiny_model.h"

namespace octet {
namespace {

using testing::mode;
using testing::random_tokens;
using testing::tiny_moe_config;

TEST(Moe, ParametersFollowMixtralsLayoutWithOneWeightPerExpert) {
  const ModelConfig c = tiny_moe_config(true);
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  // Per block: 2 norms (64), q/o 64 x 64, k/v 32 x 64, the router 4 x 64, 5 SwiGLU MLPs (4 experts and the
  // shared one) of 3 x 32 x 64; the embedding, the untied head and the final norm.
  const int64_t block = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 4 * 64 + 5 * 3 * 32 * 64;
  EXPECT_EQ(m.parameter_count(), 2 * 64 * 64 + 2 * block + 64);
  EXPECT_EQ(m.parameter("layers.1.mlp.gate.weight").shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(m.parameter("layers.0.mlp.experts.3.down_proj.weight").shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(m.parameter("layers.0.mlp.shared_expert.up_proj.weight").shape, (std::vector<int64_t>{32, 64}));
  // A token runs 2 of the 4 experts: half the experts' weights do no work for it.
  EXPECT_EQ(m.flop_parameter_count(), m.parameter_count() - 64 * 64 - 2 * 2 * 3 * 32 * 64);
  EXPECT_EQ(m.policy().layers().size(), 2u * (2 + 1 + 8 + 2) + 1);
  EXPECT_NE(m.describe().find("4 experts, 2 per token, a shared expert"), std::string::npos) << m.describe();
}

TEST(Moe, PolicyExcludesTheRouterAndByDefaultTheExperts) {
  const ModelConfig c = tiny_moe_config(true);
  PrecisionSettings s = mode(MixedPrecision::fp8);
  const PrecisionPolicy by_default(s, c, 32);
  EXPECT_EQ(by_default.layer("layers.0.mlp.gate").reason, "router: excluded by default");
  EXPECT_EQ(by_default.layer("layers.0.mlp.gate").forward, GemmMode::bf16);
  EXPECT_EQ(by_default.layer("layers.1.mlp.experts.2.gate_up_proj").reason, "experts: excluded by default");
  EXPECT_TRUE(by_default.layer("layers.1.mlp.shared_expert.down_proj").fp8());
  EXPECT_TRUE(by_default.layer("layers.1.self_attn.qkv_proj").fp8());
  EXPECT_EQ(by_default.fp8_layer_count(), 2 * 4);
  const std::string line = by_default.startup_line();
  EXPECT_NE(line.find("8 of 27 linear layers in FP8; lm_head: excluded by config; router: excluded by default; "
                      "experts: excluded by default"),
            std::string::npos)
      << line;
  s.experts = true;
  const PrecisionPolicy converted(s, c, 32);
  EXPECT_TRUE(converted.layer("layers.1.mlp.experts.2.gate_up_proj").fp8());
  EXPECT_EQ(converted.layer("layers.0.mlp.gate").reason, "router: excluded by default");
  EXPECT_EQ(converted.fp8_layer_count(), 2 * 12);
  EXPECT_NE(converted.startup_line().find("router: excluded by default; experts: FP8"), std::string::npos)
      << converted.startup_line();
}

TEST(Moe, ConfigRefusesExpertsItCannotBuild) {
  ModelConfig c = tiny_moe_config();
  c.experts_per_token = 5;
  EXPECT_THROW(c.validate(), Error);
  c = tiny_moe_config();
  c.experts = 1;
  EXPECT_THROW(c.validate(), Error);
  c = testing::tiny_config();
  c.experts = 4;
  EXPECT_THROW(c.validate(), Error);
}

// The loss training descends: the mean loss plus the balance loss of every layer.
double training_loss(Model& m, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t B,
                     int64_t T) {
  const double loss = m.forward(tokens.data(), targets.data(), B, T);
  const ModelConfig& c = dynamic_cast<Decoder&>(m).config();
  return loss + static_cast<double>(c.router_aux_loss_coef) * static_cast<double>(c.layers) * *m.router_balance();
}

class MoeGradients : public ::testing::TestWithParam<bool> {};

TEST_P(MoeGradients, MatchFiniteDifferencesOfTheLossWithItsBalanceTerm) {
  ModelConfig c = tiny_moe_config(GetParam());
  c.channels = 32;
  c.ffn_hidden = 16;
  c.router_aux_loss_coef = 1.0f;  // the balance term's gradient as large as the mean loss's
  auto backend = make_cpu_backend();
  const int64_t B = 3, T = 11;
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, B * T), B, T);
  m.init_weights(1);
  for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 5.0f;  // gradients well above noise
  m.refresh_weight_copies();
  const auto tokens = random_tokens(B * T, 3, c.vocab_size), targets = random_tokens(B * T, 4, c.vocab_size);
  training_loss(m, tokens, targets, B, T);
  const double balance = *m.router_balance();
  EXPECT_GT(balance, 1.0) << "a random router is not balanced";
  EXPECT_LE(balance, 4.0);
  // Steps half the dense model's: a step that flips a token's choice of experts makes the loss jump.
  int64_t routers = 0;
  testing::expect_gradients_match_finite_differences(
      m, tokens, targets, B, T, training_loss, 1e-3f, 2e-3, [&](const ParameterInfo& p, int64_t, double numeric) {
        if (p.name.find("mlp.gate.") != std::string::npos && std::fabs(numeric) > 1e-2) ++routers;
      });
  EXPECT_GE(routers, 4) << "the routers' gradients must be checked where they are large";
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeGradients, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "shared_expert" : "routed_only"; });

TEST(Moe, EveryModeComputesTheSameFunctionWithinItsPrecision) {
  const ModelConfig c = tiny_moe_config(true);
  auto backend = make_cpu_backend();
  const auto tokens = random_tokens(32, 5, c.vocab_size), targets = random_tokens(32, 6, c.vocab_size);
  auto loss = [&](MixedPrecision mp, bool fp8_experts, GemmCounters* counters) {
    PrecisionSettings s = mode(mp);
    s.experts = fp8_experts;
    Decoder m(c, *backend, PrecisionPolicy(s, c, 32), 2, 16);
    m.init_weights(3);
    for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 3.0f;  // logits far from uniform
    m.refresh_weight_copies();
    const float l = m.forward(tokens.data(), targets.data(), 2, 16);
    m.zero_grad();
    m.backward(1.0f / 32);
    EXPECT_TRUE(std::isfinite(m.gradient_sum_of_squares()));
    EXPECT_GT(m.gradient_sum_of_squares(), 0.0);
    if (counters) *counters = m.counters();
    return l;
  };
  const float f32 = loss(MixedPrecision::fp32, false, nullptr);
  EXPECT_GT(std::fabs(f32 - std::log(61.0f)), 0.3f) << "the comparison needs a loss far from its initial value";
  EXPECT_NEAR(loss(MixedPrecision::bf16, false, nullptr), f32, 4 * 0x1p-8f * f32);
  GemmCounters dense, all;
  const float fp8 = loss(MixedPrecision::fp8, false, &dense);
  EXPECT_NEAR(fp8, f32, 4 * 0x1p-4f * f32);
  EXPECT_NE(fp8, f32);
  // 8 FP8 layers (q/k/v, o and the shared expert's two in each block) x 3 GEMMs.
  EXPECT_EQ(dense.fp8_gemms, 24);
  const float fp8_experts = loss(MixedPrecision::fp8, true, &all);
  EXPECT_NEAR(fp8_experts, f32, 4 * 0x1p-4f * f32);
  EXPECT_NE(fp8_experts, fp8);
  // Every expert with tokens adds 2 FP8 layers' 3 GEMMs; the experts' BF16 GEMMs become FP8 ones.
  EXPECT_GT(all.fp8_gemms, dense.fp8_gemms);
  EXPECT_EQ(all.fp8_gemms + all.other_gemms, dense.fp8_gemms + dense.other_gemms);
}

TEST(Moe, EachConvertedExpertKeepsItsOwnScalingState) {
  const ModelConfig c = tiny_moe_config();
  auto backend = make_cpu_backend();
  PrecisionSettings s = mode(MixedPrecision::fp8);
  s.experts = true;
  Decoder m(c, *backend, PrecisionPolicy(s, c, 32), 2, 16);
  m.init_weights(4);
  for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 3.0f;
  m.refresh_weight_copies();
  const auto tokens = random_tokens(32, 7, c.vocab_size), targets = random_tokens(32, 8, c.vocab_size);
  m.forward(tokens.data(), targets.data(), 2, 16);
  m.zero_grad();
  m.backward(1.0f / 32);
  std::vector<double> amaxes;
  for (int64_t e = 0; e < c.experts; ++e) {
    const Fp8LinearState* state = m.fp8_state(fmt::format("layers.0.mlp.experts.{}.gate_up_proj", e));
    ASSERT_NE(state, nullptr);
    amaxes.push_back(state->weight.last_amax);
  }
  std::sort(amaxes.begin(), amaxes.end());
  EXPECT_LT(amaxes.front(), amaxes.back()) << "each expert's weight has its own amax";
  EXPECT_EQ(m.fp8_state("layers.0.mlp.gate"), nullptr);
}

}  // namespace
}  // namespace octet
