// Llama on the CPU backend: its parameter layout and Hugging Face map, its gradients against finite
// differences (RMSNorm, the rotary embedding, grouped-query attention and SwiGLU, all through the block),
// what each precision mode does to the forward, and a fused layer's gradient where its weight gradients are
// bf16.
#include <cmath>
#include <random>
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
using testing::tiny_llama_config;

TEST(Llama, Llama3OneBBlocksHaveTheKnownParameterCount) {
  // Two of Llama 3.2 1B's blocks (2048 wide, 32 heads, 8 kv heads, MLP 8192) on a 256-token vocabulary, to
  // keep the test small: a block holds 2 x 2048 norm weights, q and o 2048^2 each, k and v 512 x 2048 each
  // and gate, up and down 2048 x 8192 each, 60,821,504 in all. Sixteen of them with the 128,256-token
  // embedding and the final norm make Hugging Face's 1,235,814,400 for the 1B model (head tied).
  ModelConfig c;
  c.arch = ModelArchitecture::llama;
  c.vocab_size = 256;
  c.layers = 2;
  c.channels = 2048;
  c.heads = 32;
  c.kv_heads = 8;
  c.ffn_hidden = 8192;
  c.tie_embeddings = true;
  c.max_seq_len = 2048;
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 1), 1, 1);
  EXPECT_EQ(m.parameter_count(), 256 * 2048 + 2 * 60821504 + 2048);
  EXPECT_EQ(int64_t{128256} * 2048 + 16 * 60821504 + 2048, 1235814400);
  EXPECT_EQ(m.flop_parameter_count(), m.parameter_count());
  EXPECT_EQ(m.parameters().size(), 1u + 2u * 9u + 1u);
  EXPECT_EQ(m.parameter("layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{512, 2048}));
  EXPECT_EQ(m.policy().layer("layers.0.self_attn.qkv_proj").out_features, 2048 + 2 * 512);
  EXPECT_EQ(m.policy().layer("layers.0.mlp.gate_up_proj").out_features, 2 * 8192);
}

TEST(Llama, HuggingFaceMapNamesShapesAndConvertsBothWays) {
  const ModelConfig c = tiny_llama_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> built =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 16), 1, 16);
  const Model& m = *built;
  EXPECT_EQ(m.architecture(), "llama");
  EXPECT_EQ(m.hf_name(m.parameter("embed_tokens.weight")), "model.embed_tokens.weight");
  EXPECT_EQ(m.hf_name(m.parameter("layers.1.self_attn.v_proj.weight")),
            "model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(m.hf_name(m.parameter("norm.weight")), "model.norm.weight");
  EXPECT_EQ(m.hf_name(m.parameter("lm_head.weight")), "lm_head.weight");
  EXPECT_EQ(m.hf_shape(m.parameter("lm_head.weight")), (std::vector<int64_t>{61, 64}));
  EXPECT_EQ(m.hf_shape(m.parameter("layers.0.mlp.gate_proj.weight")), (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(m.flop_parameter_count(), m.parameter_count() - 64 * 64);  // the untied embedding
  EXPECT_EQ(
      m.model_json(),
      R"({"hidden_size":64,"intermediate_size":96,"max_position_embeddings":16,"num_attention_heads":4,)"
      R"("num_hidden_layers":2,"num_key_value_heads":2,"padded_vocab_size":64,"rms_norm_eps":1e-05,)"
      R"("rope_theta":10000.0,"tie_word_embeddings":false,"vocab_size":61})");
  std::vector<float> params(static_cast<size_t>(m.parameter_count()));
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 4093) + 1.0f;
  for (const char* name : {"embed_tokens.weight", "lm_head.weight"}) {
    const ParameterInfo& p = m.parameter(name);
    std::fill(params.begin() + p.offset + 61 * 64, params.begin() + p.offset + p.count, 0.0f);
  }
  std::vector<float> back(params.size(), -1.0f);
  for (const ParameterInfo& p : m.parameters()) m.from_hf(p, m.to_hf(p, params), back);
  EXPECT_EQ(back, params);
}

TEST(Llama, GradientsMatchFiniteDifferences) {
  ModelConfig c = tiny_llama_config();
  c.channels = 32;
  c.ffn_hidden = 48;
  auto backend = make_cpu_backend();
  const int64_t B = 3, T = 11;
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, B * T), B, T);
  m.init_weights(1);
  for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 5.0f;  // gradients well above noise
  m.refresh_weight_copies();
  const auto tokens = random_tokens(B * T, 3, c.vocab_size), targets = random_tokens(B * T, 4, c.vocab_size);
  testing::expect_gradients_match_finite_differences(m, tokens, targets, B, T);
}

TEST(Llama, EveryModeComputesTheSameFunctionWithinItsPrecision) {
  const ModelConfig c = tiny_llama_config();
  auto backend = make_cpu_backend();
  const auto tokens = random_tokens(32, 5, c.vocab_size), targets = random_tokens(32, 6, c.vocab_size);
  auto loss = [&](MixedPrecision mp, GemmCounters* counters) {
    Decoder m(c, *backend, PrecisionPolicy(mode(mp), c, 32), 2, 16);
    m.init_weights(3);
    for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 6.0f;  // logits far from uniform
    m.refresh_weight_copies();
    const float l = m.forward(tokens.data(), targets.data(), 2, 16);
    m.zero_grad();
    m.backward(1.0f / 32);
    EXPECT_TRUE(std::isfinite(m.gradient_sum_of_squares()));
    if (counters) *counters = m.counters();
    return l;
  };
  const float f32 = loss(MixedPrecision::fp32, nullptr);
  EXPECT_GT(std::fabs(f32 - std::log(61.0f)), 0.5f)
      << "the comparison needs a loss far from its initial value";
  EXPECT_NEAR(loss(MixedPrecision::bf16, nullptr), f32, 4 * 0x1p-8f * f32);
  EXPECT_NEAR(loss(MixedPrecision::fp16, nullptr), f32, 4 * 0x1p-11f * f32);
  GemmCounters counters;
  const float fp8 = loss(MixedPrecision::fp8, &counters);
  EXPECT_NEAR(fp8, f32, 4 * 0x1p-4f * f32);
  EXPECT_NE(fp8, f32);
  // 8 FP8 layers (q/k/v, o, gate/up, down in each of 2 blocks) x 3 GEMMs; the head's in BF16.
  EXPECT_EQ(counters.fp8_gemms, 24);
  EXPECT_EQ(counters.other_gemms, 4);
}

// Grouped-query attention with as many kv heads as heads is multi-head attention, and the untied head
// tied to the embedding reads the embedding: both shapes train (a forward, a backward, finite gradients).
TEST(Llama, MultiHeadAndTiedVariantsTrain) {
  for (const auto& [kv, tied] : {std::pair{int64_t{0}, true}, std::pair{int64_t{1}, false}}) {
    ModelConfig c = tiny_llama_config();
    c.kv_heads = kv;
    c.tie_embeddings = tied;
    auto backend = make_cpu_backend();
    Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
    m.init_weights(9);
    const auto tokens = random_tokens(32, 7, c.vocab_size), targets = random_tokens(32, 8, c.vocab_size);
    const float l = m.forward(tokens.data(), targets.data(), 2, 16);
    EXPECT_NEAR(l, std::log(61.0f), 0.1f);
    m.zero_grad();
    m.backward(1.0f / 32);
    EXPECT_TRUE(std::isfinite(m.gradient_sum_of_squares()));
    EXPECT_GT(m.gradient_sum_of_squares(), 0.0);
    EXPECT_EQ(m.parameters().back().name, tied ? "norm.weight" : "lm_head.weight");
  }
}

}  // namespace
}  // namespace octet
