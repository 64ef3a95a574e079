// The forward asks for its parameters run by run (Model::set_parameters_needed) before it reads them, in the
// order of Model::forward_parameter_bounds: what lets a sharded optimizer's gathers overlap with the next
// forward. Shown by a model whose parameters are NaN, and whose weight copies were made from other weights,
// until the hook delivers them: its loss and gradients are the bits of a model that had them all along.
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/model/decoder.h"
#include "tiny_model.h"

namespace octet {
namespace {

using testing::random_tokens;

enum class Shape { gpt2, llama, moe };

ModelConfig config_of(Shape s) {
  switch (s) {
    case Shape::gpt2:
      return testing::tiny_config();
    case Shape::llama:
      return testing::tiny_llama_config();
    case Shape::moe:
      return testing::tiny_moe_config(true);
  }
  return testing::tiny_config();
}

PrecisionPolicy policy_of(const ModelConfig& c, MixedPrecision m) {
  PrecisionSettings p;
  p.mode = m;
  p.recipe = RecipeKind::current;  // a weight's cast depends on the weight alone, whenever it is made
  return PrecisionPolicy(p, c, 32);
}

class ParameterArrival : public ::testing::TestWithParam<std::tuple<Shape, MixedPrecision>> {};

TEST_P(ParameterArrival, TheForwardReadsEachRunOfParametersOnlyAfterAskingForIt) {
  const auto [shape, precision] = GetParam();
  const ModelConfig c = config_of(shape);
  constexpr int64_t B = 2, T = 16;
  auto backend = make_cpu_backend();
  Decoder ref(c, *backend, policy_of(c, precision), B, T);
  ref.init_weights(7);
  Decoder late(c, *backend, policy_of(c, precision), B, T);
  late.init_weights(8);  // its weight copies are made from other weights
  const int64_t n = late.parameter_count();
  for (int64_t i = 0; i < n; ++i) late.params()[i] = NAN;

  const std::vector<int64_t> bounds = late.forward_parameter_bounds();
  ASSERT_EQ(bounds, ref.forward_parameter_bounds());
  ASSERT_EQ(bounds.size(), static_cast<size_t>(c.layers) + 3) << "the embeddings, each block, the norm and head";
  EXPECT_EQ(bounds.front(), 0);
  EXPECT_EQ(bounds.back(), n);
  std::vector<int64_t> asked;
  int64_t delivered = 0;
  late.set_parameters_needed([&](int64_t end) {
    asked.push_back(end);
    if (end <= delivered) return;
    std::memcpy(late.params() + delivered, ref.params() + delivered,
                static_cast<size_t>(end - delivered) * sizeof(float));
    for (const Model::WeightCopySlot& s : late.weight_copy_slots()) {
      if (s.offset >= delivered && s.offset < end) {
        backend->prepare_weight(*s.copy, late.params() + s.offset, s.rows, s.cols, *s.exec);
      }
    }
    delivered = end;
  });

  const std::vector<int32_t> tokens = random_tokens(B * T, 1, c.vocab_size);
  const std::vector<int32_t> targets = random_tokens(B * T, 2, c.vocab_size);
  const float dloss = 1.0f / static_cast<float>(B * T);
  ref.zero_grad();
  late.zero_grad();
  const float want = ref.forward(tokens.data(), targets.data(), B, T, dloss);
  const float got = late.forward(tokens.data(), targets.data(), B, T, dloss);
  ASSERT_TRUE(std::isfinite(want));
  EXPECT_EQ(std::memcmp(&want, &got, sizeof(float)), 0) << want << " against " << got;
  EXPECT_EQ(asked, std::vector<int64_t>(bounds.begin() + 1, bounds.end())) << "each run asked for once, in order";
  ref.backward(dloss);
  late.backward(dloss);
  EXPECT_EQ(std::memcmp(ref.grads(), late.grads(), static_cast<size_t>(n) * sizeof(float)), 0)
      << "the backward read what the forward had asked for";

  // A second forward asks again (each forward does), and finds everything delivered.
  asked.clear();
  late.forward(tokens.data(), targets.data(), B, T);
  EXPECT_EQ(asked, std::vector<int64_t>(bounds.begin() + 1, bounds.end()));
  late.set_parameters_needed(nullptr);
  asked.clear();
  late.forward(tokens.data(), targets.data(), B, T);
  EXPECT_TRUE(asked.empty());
}

std::string name_of(const ::testing::TestParamInfo<std::tuple<Shape, MixedPrecision>>& p) {
  static const char* const kShapes[] = {"Gpt2", "Llama", "Moe"};
  return std::string(kShapes[static_cast<int>(std::get<0>(p.param))]) + "_" +
         std::string(mixed_precision_name(std::get<1>(p.param)));
}

INSTANTIATE_TEST_SUITE_P(Model, ParameterArrival,
                         ::testing::Combine(::testing::Values(Shape::gpt2, Shape::llama, Shape::moe),
                                            ::testing::Values(MixedPrecision::fp32, MixedPrecision::bf16,
                                                              MixedPrecision::fp8)),
                         name_of);

}  // namespace
}  // namespace octet
