// The cosine sums `octet localize` compares variants by (src/train/localization_variants.h): the cosine of
// hand-worked sums, and a variant's sums against a reference equal to those worked directly from the two
// variants' gradients, layer by layer and over all layers.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include <bit>
#include <cstring>

#include "localization_variants.h"
#include "octet/backend/cpu_backend.h"
#include "tiny_model.h"

namespace octet {
namespace {

TEST(CosineSums, CosineOfHandWorkedSums) {
  // x = (1, 2), y = (2, 4): x.y = 10, x.x = 5, y.y = 20, cosine 10 / sqrt(100) = 1.
  EXPECT_EQ((CosineSums{10.0, 5.0, 20.0, true}).cosine(), 1.0);
  EXPECT_EQ((CosineSums{-10.0, 5.0, 20.0, true}).cosine(), -1.0);
  // x = (1, 0), y = (0, 1): orthogonal.
  EXPECT_EQ((CosineSums{0.0, 1.0, 1.0, true}).cosine(), 0.0);
  EXPECT_EQ((CosineSums{0.0, 0.0, 0.0, true}).cosine(), 1.0);  // both zero
  EXPECT_EQ((CosineSums{0.0, 0.0, 3.0, true}).cosine(), 0.0);  // one zero
  EXPECT_TRUE(std::isnan((CosineSums{1.0, 1.0, 1.0, false}).cosine()));
  CosineSums a{1.0, 2.0, 3.0, true};
  a += CosineSums{4.0, 5.0, 6.0, false};
  EXPECT_EQ(a.dot, 5.0);
  EXPECT_EQ(a.xx, 7.0);
  EXPECT_EQ(a.yy, 9.0);
  EXPECT_FALSE(a.finite);
}

VariantBatches two_batches(const ModelConfig& c) {
  VariantBatches batches;
  batches.batch_size = 2;
  batches.seq_len = 16;
  batches.dloss = 1.0f / 32.0f;
  for (int b = 0; b < 2; ++b) {
    batches.tokens.emplace_back(32);
    batches.targets.emplace_back(32);
    for (int i = 0; i < 32; ++i) {
      batches.tokens.back()[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + b * 3) % c.vocab_size);
      batches.targets.back()[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + b + 1) % c.vocab_size);
    }
  }
  return batches;
}

// A fused layer's weight spans several parameters (Llama's qkv_proj: q_proj, k_proj and v_proj; gate_up_proj:
// gate_proj and up_proj): the runner's gradient of such a layer is theirs, one after another, as a model run
// the same way gives them parameter by parameter.
TEST(VariantRunner, AFusedLayersGradientIsItsParametersGradients) {
  const ModelConfig c = testing::tiny_llama_config();
  auto backend = make_cpu_backend();
  PrecisionSettings s;
  s.mode = MixedPrecision::bf16;
  const VariantBatches batches = two_batches(c);
  std::vector<float> weights;
  {
    const std::unique_ptr<Model> m = make_model(c, *backend, PrecisionPolicy(s, c, 32), 2, 16);
    m->init_weights(9);
    weights.assign(m->params(), m->params() + m->parameter_count());
  }
  VariantRunner runner(c, *backend, batches, weights);
  const VariantResult result = runner.run(PrecisionPolicy(s, c, 32), false);

  const std::unique_ptr<Model> m = make_model(c, *backend, PrecisionPolicy(s, c, 32), 2, 16);
  std::memcpy(m->params(), weights.data(), weights.size() * sizeof(float));
  m->refresh_weight_copies();
  m->zero_grad();
  for (size_t b = 0; b < batches.tokens.size(); ++b) {
    m->forward(batches.tokens[b].data(), batches.targets[b].data(), 2, 16, batches.dloss);
    m->backward(batches.dloss);
  }
  m->grads();
  auto gradient_of = [&](const std::string& name) {
    for (const ParameterInfo& p : m->parameters()) {
      if (p.name != name) continue;
      std::vector<float> g(static_cast<size_t>(p.count));
      const void* at = m->gradient(p);
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = p.grad_type == Dtype::f32
                   ? static_cast<const float*>(at)[i]
                   : std::bit_cast<float>(static_cast<uint32_t>(static_cast<const uint16_t*>(at)[i]) << 16);
      }
      return g;
    }
    ADD_FAILURE() << "no parameter " << name;
    return std::vector<float>();
  };
  int fused = 0;
  for (const GradientRange& range : runner.ranges()) {
    const std::string prefix = range.layer.substr(0, range.layer.rfind('.') + 1);
    std::vector<std::string> parts;
    if (range.layer.ends_with("qkv_proj")) parts = {"q_proj", "k_proj", "v_proj"};
    if (range.layer.ends_with("gate_up_proj")) parts = {"gate_proj", "up_proj"};
    if (parts.empty()) continue;
    ++fused;
    std::vector<float> expected;
    for (const std::string& part : parts) {
      const std::vector<float> g = gradient_of(prefix + part + ".weight");
      expected.insert(expected.end(), g.begin(), g.end());
    }
    ASSERT_EQ(range.count, expected.size()) << range.layer;
    EXPECT_EQ(std::memcmp(result.gradients.data() + range.begin, expected.data(), range.count * sizeof(float)), 0)
        << range.layer;
    // v_proj's part is not zero: the run covers the whole fused weight.
    double tail = 0.0;
    for (size_t i = range.count - range.count / 4; i < range.count; ++i) tail += std::abs(expected[i]);
    EXPECT_GT(tail, 0.0) << range.layer;
  }
  EXPECT_EQ(fused, 4);  // two blocks, qkv_proj and gate_up_proj each
}

// Two variants of the tiny GPT-2 on the CPU, kept as references, and the second run again against the
// first: its sums are those of the two gradients, worked here directly.
TEST(VariantRunner, SumsAgainstAReferenceMatchTheGradients) {
  const ModelConfig c = testing::tiny_config();
  auto backend = make_cpu_backend();
  PrecisionSettings s;
  s.mode = MixedPrecision::fp8;
  s.recipe = RecipeKind::current;
  const VariantBatches batches = two_batches(c);
  std::vector<float> weights;
  {
    const std::unique_ptr<Model> m = make_model(c, *backend, PrecisionPolicy(s, c, 32), 2, 16);
    m->init_weights(5);
    weights.assign(m->params(), m->params() + m->parameter_count());
  }
  VariantRunner runner(c, *backend, batches, weights);
  PrecisionSettings bf16_settings = s;
  bf16_settings.mode = MixedPrecision::bf16;
  const VariantResult bf16 = runner.run(PrecisionPolicy(bf16_settings, c, 32), false);
  const VariantResult fp8 = runner.run(PrecisionPolicy(s, c, 32), false);
  const VariantResult against = runner.run(PrecisionPolicy(s, c, 32), false, &bf16);
  ASSERT_FALSE(runner.ranges().empty());
  ASSERT_EQ(bf16.gradients.size(), fp8.gradients.size());
  EXPECT_TRUE(against.gradients.empty());
  ASSERT_EQ(against.against.size(), runner.ranges().size());
  EXPECT_EQ(against.loss, fp8.loss);  // the same run, repeated exactly
  EXPECT_NE(fp8.loss, bf16.loss);
  double all_dot = 0.0, all_xx = 0.0, all_yy = 0.0;
  for (size_t r = 0; r < runner.ranges().size(); ++r) {
    const GradientRange& range = runner.ranges()[r];
    double dot = 0.0, xx = 0.0, yy = 0.0;
    for (size_t i = range.begin; i < range.begin + range.count; ++i) {
      const double x = fp8.gradients[i], y = bf16.gradients[i];
      dot += x * y;
      xx += x * x;
      yy += y * y;
    }
    // The runner adds chunks of 2^20 values; these layers are smaller, so the same additions in order.
    ASSERT_LT(range.count, size_t{1} << 20);
    EXPECT_EQ(against.against[r].dot, dot) << range.layer;
    EXPECT_EQ(against.against[r].xx, xx) << range.layer;
    EXPECT_EQ(against.against[r].yy, yy) << range.layer;
    EXPECT_TRUE(against.against[r].finite);
    EXPECT_GT(xx, 0.0) << range.layer;
    const double cosine = against.against[r].cosine();
    EXPECT_GT(cosine, 0.9) << range.layer;  // FP8 against BF16 on the same weights and batches
    EXPECT_LT(cosine, 1.0) << range.layer;  // but not the same gradients
    all_dot += dot;
    all_xx += xx;
    all_yy += yy;
  }
  CosineSums all;
  for (const CosineSums& sums : against.against) all += sums;
  EXPECT_EQ(all.cosine(), (CosineSums{all_dot, all_xx, all_yy, true}).cosine());
}

}  // namespace
}  // namespace octet
