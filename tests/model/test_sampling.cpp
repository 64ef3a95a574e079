// Generation: greedy decoding is the argmax, top-k 1 equals greedy, the seed reproduces a sample, and a
// trained model continues a learned pattern.
#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/model/sampling.h"

namespace octet {
namespace {

TEST(Sampling, GreedyTopOneAndSeeds) {
  const ModelConfig c = testing::tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(testing::mode(MixedPrecision::fp32), c, 16), 1, 16);
  Model& m = *m_owner;
  m.init_weights(9);
  for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 20.0f;  // a peaked distribution
  const std::vector<int32_t> prompt = {3, 14, 15};
  SamplingSettings greedy;
  greedy.temperature = 0.0f;
  greedy.max_new_tokens = 20;
  const std::vector<int32_t> g = generate(m, prompt, greedy);
  ASSERT_EQ(g.size(), 20u) << "longer than the context: the window slides";
  // The first greedy token is the argmax of the prompt's last logits.
  m.forward_logits(prompt.data(), 1, 3);
  const float* last = m.logits() + 2 * c.padded_vocab();
  EXPECT_EQ(g[0], std::max_element(last, last + c.vocab_size) - last);
  SamplingSettings top1 = greedy;
  top1.temperature = 1.0f;
  top1.top_k = 1;
  EXPECT_EQ(generate(m, prompt, top1), g);
  m.init_weights(9);  // near-uniform: different seeds draw different tokens
  SamplingSettings random;
  random.max_new_tokens = 20;
  random.top_k = 0;
  random.seed = 5;
  const std::vector<int32_t> a = generate(m, prompt, random), b = generate(m, prompt, random);
  EXPECT_EQ(a, b);
  random.seed = 6;
  EXPECT_NE(generate(m, prompt, random), a);
  for (const int32_t t : a) EXPECT_TRUE(t >= 0 && t < c.vocab_size);
  EXPECT_THROW(generate(m, {}, greedy), Error);
  random.temperature = -1.0f;
  EXPECT_THROW(generate(m, prompt, random), Error);
}

TEST(Sampling, ATrainedModelContinuesItsPattern) {
  const ModelConfig c = testing::tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(testing::mode(MixedPrecision::fp32), c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(1);
  TrainSettings s;
  s.batch_size = 2;
  s.seq_len = 16;
  s.schedule = {3e-3f, 5, 150, 0.1f};
  Trainer t(m, s);
  const BatchSource data = testing::pattern_stream(2, 2, 16, c.vocab_size);  // successor x -> (7x + 3) mod V
  for (int i = 0; i < 150; ++i) t.step(data);
  SamplingSettings greedy;
  greedy.temperature = 0.0f;
  greedy.max_new_tokens = 8;
  const std::vector<int32_t> prompt = {10, 12};  // 12 = (7 * 10 + 3) mod 61
  const std::vector<int32_t> g = generate(m, prompt, greedy);
  int32_t x = 12;
  for (const int32_t token : g) {
    x = (x * 7 + 3) % 61;
    EXPECT_EQ(token, x);
  }
}

}  // namespace
}  // namespace octet
