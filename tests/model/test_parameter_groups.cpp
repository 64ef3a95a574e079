// AdamW's parameter groups (optimizer.groups): a group's learning-rate multiplier and weight decay reach its
// parameters and no others, multipliers of 1 change nothing bit for bit, and a glob that holds nothing, or a
// group that splits the parameters one pass updates together, is refused naming it.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"

namespace octet {
namespace {

using testing::mode;
using testing::pattern_stream;
using testing::tiny_config;
using testing::tiny_llama_config;

TrainSettings group_settings(std::vector<ParameterGroup> groups) {
  TrainSettings s = testing::small_settings();
  s.adamw.groups = std::move(groups);
  return s;
}

struct Trained {
  std::vector<float> initial;
  std::vector<float> params;
  std::vector<float> losses;
  std::vector<ParameterInfo> parameters;
};

Trained train(MixedPrecision mp, std::vector<ParameterGroup> groups, int steps,
              const ModelConfig& c = tiny_config()) {
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m = make_model(c, *backend, PrecisionPolicy(mode(mp), c, 32), 2, 16);
  m->init_weights(11);
  Trained out;
  out.parameters = m->parameters();
  out.initial.assign(m->params(), m->params() + m->parameter_count());
  Trainer t(*m, group_settings(std::move(groups)));
  const BatchSource data = pattern_stream(5, 2, 16, c.vocab_size);
  for (int i = 0; i < steps; ++i) {
    const StepResult r = t.step(data);
    EXPECT_FALSE(r.skipped) << r.skip_reason;
    out.losses.push_back(r.loss);
  }
  out.params.assign(m->params(), m->params() + m->parameter_count());
  return out;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

class ParameterGroupsInMode : public ::testing::TestWithParam<MixedPrecision> {};

TEST_P(ParameterGroupsInMode, AZeroScaleHoldsItsParametersWhileTheOthersMove) {
  const Trained r = train(GetParam(), {{"h.*.attn.*", 0.0f, std::nullopt}}, 4);
  int held = 0, moved = 0;
  for (const ParameterInfo& p : r.parameters) {
    const bool attention = p.name.find(".attn.") != std::string::npos;
    const bool same = same_bits(r.initial.data() + p.offset, r.params.data() + p.offset, p.count);
    if (attention) {
      EXPECT_TRUE(same) << p.name << " is in the group of learning-rate multiplier 0";
      ++held;
    } else {
      EXPECT_FALSE(same) << p.name << " trains as before";
      ++moved;
    }
  }
  EXPECT_EQ(held, 8);  // c_attn and c_proj, weight and bias, of both blocks
  EXPECT_GT(moved, 0);
}

TEST_P(ParameterGroupsInMode, ScalesOfOneAreBitIdenticalToNoGroups) {
  const Trained plain = train(GetParam(), {}, 5);
  const Trained ones =
      train(GetParam(),
            {{"h.*.mlp.*", 1.0f, std::nullopt}, {"wte", 1.0f, std::nullopt}, {"*", 1.0f, std::nullopt}}, 5);
  EXPECT_EQ(plain.losses, ones.losses);
  EXPECT_TRUE(same_bits(plain.params.data(), ones.params.data(), static_cast<int64_t>(plain.params.size())));
}

INSTANTIATE_TEST_SUITE_P(Modes, ParameterGroupsInMode,
                         ::testing::Values(MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp8),
                         [](const auto& p) { return std::string(mixed_precision_name(p.param)); });

TEST(ParameterGroups, AGroupScalesOnlyItsOwnUpdate) {
  // One step with a multiplier of 2 on the MLP: the first update of AdamW is lr * m / (sqrt(v) + eps) per
  // element, about lr in size, so the MLP's weights move about twice as far as without the group, the rest
  // exactly as far.
  const Trained plain = train(MixedPrecision::fp32, {}, 1);
  const Trained doubled = train(MixedPrecision::fp32, {{"h.0.mlp.c_fc.weight", 2.0f, std::nullopt}}, 1);
  for (const ParameterInfo& p : plain.parameters) {
    double step_plain = 0.0, step_doubled = 0.0;
    for (int64_t i = p.offset; i < p.offset + p.count; ++i) {
      step_plain += std::abs(plain.params[i] - plain.initial[i]);
      step_doubled += std::abs(doubled.params[i] - doubled.initial[i]);
    }
    if (p.name == "h.0.mlp.c_fc.weight") {
      EXPECT_NEAR(step_doubled / step_plain, 2.0, 0.05) << p.name;
    } else {
      EXPECT_TRUE(same_bits(plain.params.data() + p.offset, doubled.params.data() + p.offset, p.count))
          << p.name;
    }
  }
}

TEST(ParameterGroups, AGroupsWeightDecayReplacesTheOptimizers) {
  // With a multiplier of 1 and weight decay 0, the group's matrices equal a run without decay, the others a
  // run with it.
  auto decayed = [](float decay, std::vector<ParameterGroup> groups) {
    auto backend = make_cpu_backend();
    const ModelConfig c = tiny_config();
    const std::unique_ptr<Model> m =
        make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
    m->init_weights(11);
    TrainSettings s = group_settings(std::move(groups));
    s.adamw.weight_decay = decay;
    Trainer t(*m, s);
    const BatchSource data = pattern_stream(5, 2, 16, c.vocab_size);
    t.step(data);
    return std::vector<float>(m->params(), m->params() + m->parameter_count());
  };
  const std::vector<float> with = decayed(0.5f, {});
  const std::vector<float> without = decayed(0.0f, {});
  const std::vector<float> grouped = decayed(0.5f, {{"wte", 1.0f, 0.0f}});
  auto backend = make_cpu_backend();
  const ModelConfig c = tiny_config();
  const std::unique_ptr<Model> m =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  for (const ParameterInfo& p : m->parameters()) {
    const std::vector<float>& expected = p.name == "wte" ? without : with;
    EXPECT_TRUE(same_bits(grouped.data() + p.offset, expected.data() + p.offset, p.count)) << p.name;
  }
}

std::string construction_error(std::vector<ParameterGroup> groups, const ModelConfig& c = tiny_config()) {
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::bf16), c, 32), 2, 16);
  try {
    Trainer t(*m, group_settings(std::move(groups)));
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return {};
}

TEST(ParameterGroups, AGlobThatHoldsNothingIsRefusedNamingIt) {
  EXPECT_NE(
      construction_error({{"h.*.attn.*", 0.5f, std::nullopt}, {"layers.*.self_attn.*", 0.5f, std::nullopt}})
          .find("optimizer.groups: entry 2 (match = \"layers.*.self_attn.*\") matches no parameter"),
      std::string::npos);
  EXPECT_EQ(
      construction_error({{"h.*", 0.5f, std::nullopt}, {"h.0.attn.*", 0.1f, std::nullopt}}),
      "optimizer.groups: entry 2 (match = \"h.0.attn.*\") holds no parameter: the 4 it matches are held by "
      "earlier groups (the first group that matches a parameter holds it)");
  EXPECT_EQ(construction_error({{"*", 0.5f, std::nullopt}}), "");
}

TEST(ParameterGroups, AFusedLayersParametersCannotBeSplit) {
  // Llama's q, k and v projections are one layer whose copy one AdamW pass remakes.
  const std::string error =
      construction_error({{"layers.0.self_attn.q_proj.weight", 0.5f, std::nullopt}}, tiny_llama_config());
  EXPECT_NE(
      error.find("optimizer.groups: layers.0.self_attn.q_proj.weight and layers.0.self_attn.k_proj.weight "
                 "are updated together"),
      std::string::npos)
      << error;
  EXPECT_EQ(construction_error({{"layers.*.self_attn.*", 0.5f, std::nullopt}}, tiny_llama_config()), "");
}

TEST(ParameterGroups, TheStartupLineCountsEachGroupsParameters) {
  auto backend = make_cpu_backend();
  const ModelConfig c = tiny_config();
  const std::unique_ptr<Model> m =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::bf16), c, 32), 2, 16);
  Trainer t(*m, group_settings({{"h.*.attn.*", 0.5f, std::nullopt}, {"wte", 0.0f, 0.0f}}));
  const std::string line = t.optimizer().groups_line();
  EXPECT_EQ(
      line,
      "optimizer groups: \"h.*.attn.*\" (lr x 0.5): 8 parameters (33280 values); \"wte\" (lr x 0, weight "
      "decay 0): 1 parameter (4096 values); no group: 19 parameters (67840 values)");
  Trainer none(*m, group_settings({}));
  EXPECT_EQ(none.optimizer().groups_line(), "");
}

}  // namespace
}  // namespace octet
