// GPT-2 on the CPU backend: layout, initialisation, gradients against finite differences, and what each
// precision mode does to the forward.
#include <cmath>

#include <gtest/gtest.h>

#include "model_fixture.h"

namespace octet {
namespace {

using testing::mode;
using testing::tiny_config;

std::vector<int32_t> random_tokens(size_t n, uint64_t seed, int64_t V) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

TEST(Gpt2, Gpt2SmallHasTheKnownParameterCount) {
  Gpt2Config c;  // GPT-2 124M: 12 layers, 768 channels, vocabulary 50257 padded to 50304
  auto backend = make_cpu_backend();
  Gpt2 m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 1), 1, 1);
  EXPECT_EQ(c.padded_vocab(), 50304);
  EXPECT_EQ(m.parameter_count(), 124475904);  // llm.c's count for the same padded model
  EXPECT_EQ(m.parameters().size(), 2u + 12u * 12u + 2u);
  EXPECT_EQ(m.parameter("h.11.mlp.c_proj.weight").shape, (std::vector<int64_t>{768, 3072}));
  EXPECT_TRUE(m.parameter("wpe").weight_decay);
  EXPECT_FALSE(m.parameter("h.0.ln_1.weight").weight_decay);
}

TEST(Gpt2, InitialisationFollowsGpt2) {
  const Gpt2Config c = tiny_config();
  auto backend = make_cpu_backend();
  Gpt2 m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  m.init_weights(7);
  auto stddev = [&](const std::string& name) {
    const ParameterInfo& p = m.parameter(name);
    double s = 0;
    for (int64_t i = 0; i < p.count; ++i) s += double(m.params()[p.offset + i]) * m.params()[p.offset + i];
    return std::sqrt(s / double(p.count));
  };
  EXPECT_NEAR(stddev("h.0.mlp.c_fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.1.attn.c_proj.weight"), 0.02 / std::sqrt(4.0), 0.002);
  EXPECT_EQ(stddev("h.0.attn.c_attn.bias"), 0.0);
  EXPECT_EQ(m.params()[m.parameter("ln_f.weight").offset], 1.0f);
  const ParameterInfo& wte = m.parameter("wte");
  for (int64_t i = c.vocab_size * c.channels; i < wte.count; ++i) ASSERT_EQ(m.params()[wte.offset + i], 0.0f);
  // The same seed gives the same weights.
  Gpt2 again(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  again.init_weights(7);
  EXPECT_EQ(std::vector<float>(m.params(), m.params() + m.parameter_count()),
            std::vector<float>(again.params(), again.params() + again.parameter_count()));
}

TEST(Gpt2, InitialLossIsNearLogV) {
  const Gpt2Config c = tiny_config();
  auto backend = make_cpu_backend();
  Gpt2 m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  m.init_weights(1);
  const auto tokens = random_tokens(32, 1, c.vocab_size), targets = random_tokens(32, 2, c.vocab_size);
  EXPECT_NEAR(m.forward(tokens.data(), targets.data(), 2, 16), std::log(61.0), 0.05);
}

TEST(Gpt2, GradientsMatchFiniteDifferences) {
  Gpt2Config c = tiny_config();
  c.channels = 32;
  auto backend = make_cpu_backend();
  const int64_t B = 3, T = 11;
  Gpt2 m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, B * T), B, T);
  m.init_weights(1);
  for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 5.0f;  // gradients well above noise
  m.refresh_weight_copies();
  const auto tokens = random_tokens(B * T, 3, c.vocab_size), targets = random_tokens(B * T, 4, c.vocab_size);
  m.forward(tokens.data(), targets.data(), B, T);
  m.zero_grad();
  m.backward(1.0f / static_cast<float>(B * T));
  for (const ParameterInfo& p : m.parameters()) {
    for (const int64_t k : {int64_t{0}, p.count / 3, p.count / 2 + 1}) {
      float* x = m.params() + p.offset + k;
      const float original = *x;
      auto central = [&](float h) {
        *x = original + h;
        const double up = m.forward(tokens.data(), targets.data(), B, T);
        *x = original - h;
        const double down = m.forward(tokens.data(), targets.data(), B, T);
        *x = original;
        return (up - down) / (2.0 * static_cast<double>(h));
      };
      // Richardson extrapolation of two central differences cancels the h^2 term (sharp attention makes it
      // large); what remains is float32 rounding of the loss, about 1e-6 / h.
      const double numeric = (4.0 * central(2e-3f) - central(4e-3f)) / 3.0;
      const double analytic = m.grads()[p.offset + k];
      EXPECT_NEAR(analytic, numeric, 1e-3 + 0.01 * std::fabs(numeric)) << p.name << "[" << k << "]";
    }
  }
}

TEST(Gpt2, EveryModeComputesTheSameFunctionWithinItsPrecision) {
  const Gpt2Config c = tiny_config();
  auto backend = make_cpu_backend();
  const auto tokens = random_tokens(32, 5, c.vocab_size), targets = random_tokens(32, 6, c.vocab_size);
  auto loss = [&](MixedPrecision mp, GemmCounters* counters) {
    Gpt2 m(c, *backend, PrecisionPolicy(mode(mp), c, 32), 2, 16);
    m.init_weights(3);
    for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 4.0f;  // logits far from uniform
    m.refresh_weight_copies();
    const float l = m.forward(tokens.data(), targets.data(), 2, 16);
    m.zero_grad();
    m.backward(1.0f / 32);
    if (counters) *counters = m.counters();
    return l;
  };
  const float f32 = loss(MixedPrecision::fp32, nullptr);
  EXPECT_GT(std::fabs(f32 - std::log(61.0f)), 0.5f)
      << "the comparison needs a loss far from its initial value";
  // Each format's unit roundoff (BF16 2^-8, FP16 2^-11, E4M3 2^-4) bounds the relative error of one
  // rounding; a few layers' errors add up, so each mode is allowed about four of them.
  EXPECT_NEAR(loss(MixedPrecision::bf16, nullptr), f32, 4 * 0x1p-8f * f32);
  EXPECT_NEAR(loss(MixedPrecision::fp16, nullptr), f32, 4 * 0x1p-11f * f32);
  GemmCounters counters;
  const float fp8 = loss(MixedPrecision::fp8, &counters);
  EXPECT_NEAR(fp8, f32, 4 * 0x1p-4f * f32);
  EXPECT_NE(fp8, f32);
  // 8 FP8 layers x 3 GEMMs; the LM head's 3 in BF16.
  EXPECT_EQ(counters.fp8_gemms, 24);
  EXPECT_EQ(counters.other_gemms, 3);
}

TEST(Gpt2, BadTokensAndShapesAreRefused) {
  const Gpt2Config c = tiny_config();
  auto backend = make_cpu_backend();
  Gpt2 m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  std::vector<int32_t> tokens(32, 1), targets(32, 1);
  tokens[5] = 61;
  try {
    m.forward(tokens.data(), targets.data(), 2, 16);
    FAIL() << "accepted a token outside the vocabulary";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("token 61 at position 5"), std::string::npos) << e.what();
  }
  tokens[5] = 1;
  EXPECT_THROW(m.forward(tokens.data(), targets.data(), 3, 16), Error);
  EXPECT_THROW(m.forward(tokens.data(), targets.data(), 1, 17), Error);
  Gpt2Config bad = c;
  bad.channels = 30;
  EXPECT_THROW(Gpt2(bad, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16), Error);
}

}  // namespace
}  // namespace octet
