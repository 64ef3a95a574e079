// train.activation_checkpointing: with "selective" and "full" a few training steps give bit-identical losses,
// gradients, FP8 scaling states, cast telemetry and GEMM counters to "none", for GPT-2 and Llama in every
// precision mode, while the planned activation buffer is smaller.
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"

namespace octet {
namespace {

using testing::mode;
using testing::pattern_stream;

constexpr int64_t kBatch = 2, kSeq = 16;

// Everything a run leaves that checkpointing must not change, as numbers compared exactly.
struct Outcome {
  std::vector<float> losses;
  std::vector<float> gradients;  // grads() after every step, one after another
  std::vector<double> fp8;       // every FP8 layer's scaling states and telemetry, then the GEMM counters
  int64_t activation_bytes = 0;
  int64_t unchecked_bytes = 0;
  std::string memory_line;
};

void append(std::vector<double>& out, const ScalingState& s) {
  out.insert(out.end(), {s.scale, s.scale_inv, s.last_amax, static_cast<double>(s.updates),
                         static_cast<double>(s.degenerate_amax)});
  out.insert(out.end(), s.amax_history.begin(), s.amax_history.end());
}

void append(std::vector<double>& out, const CastTelemetry& t) {
  out.insert(out.end(), {static_cast<double>(t.casts), static_cast<double>(t.elements),
                         static_cast<double>(t.nonzero), static_cast<double>(t.saturated),
                         static_cast<double>(t.underflowed), t.signal_energy, t.noise_energy});
}

Outcome train(const ModelConfig& c, PrecisionSettings precision, ActivationCheckpointing level,
              int steps = 4) {
  auto backend = make_cpu_backend();
  precision.activation_checkpointing = level;
  Decoder m(c, *backend, PrecisionPolicy(precision, c, kBatch * kSeq), kBatch, kSeq);
  m.init_weights(11);
  m.set_telemetry(true, true);
  TrainSettings s;
  s.batch_size = kBatch;
  s.seq_len = kSeq;
  s.schedule.max_learning_rate = 3e-3f;
  s.schedule.warmup_steps = 2;
  s.schedule.total_steps = 20;
  s.loss_scale.dynamic = precision.mode == MixedPrecision::fp16;
  Trainer t(m, s);
  const BatchSource data = pattern_stream(5, kBatch, kSeq, c.vocab_size);
  Outcome o;
  for (int i = 0; i < steps; ++i) {
    const StepResult r = t.step(data);
    EXPECT_FALSE(r.skipped) << r.skip_reason;
    o.losses.push_back(r.loss);
    const float* g = m.grads();
    o.gradients.insert(o.gradients.end(), g, g + m.parameter_count());
  }
  for (const LinearShape& layer : c.linear_layers()) {
    if (const Fp8LinearState* state = m.fp8_state(layer.name)) {
      append(o.fp8, state->activation);
      append(o.fp8, state->weight);
      append(o.fp8, state->gradient);
    }
    if (const Fp8LinearTelemetry* telemetry = m.telemetry(layer.name)) {
      append(o.fp8, telemetry->activation);
      append(o.fp8, telemetry->weight);
      append(o.fp8, telemetry->gradient);
    }
  }
  const GemmCounters& n = m.counters();
  o.fp8.insert(o.fp8.end(), {static_cast<double>(n.fp8_gemms), static_cast<double>(n.other_gemms),
                             static_cast<double>(n.saturated), static_cast<double>(n.underflowed)});
  o.activation_bytes = m.activation_bytes();
  o.unchecked_bytes = m.activation_bytes_without_checkpointing();
  o.memory_line = m.memory_line();
  return o;
}

// Bit for bit: the vectors compare their floats with ==, so a NaN anywhere fails.
void expect_same(const Outcome& none, const Outcome& checked, const char* level) {
  EXPECT_EQ(none.losses, checked.losses) << level << ": the losses";
  EXPECT_EQ(none.gradients, checked.gradients) << level << ": the gradients";
  EXPECT_EQ(none.fp8, checked.fp8) << level << ": the FP8 scaling states, telemetry and GEMM counters";
}

ModelConfig shape(bool llama) {
  return llama ? testing::tiny_llama_config() : testing::tiny_config();
}

class EveryModeAndArchitecture : public ::testing::TestWithParam<std::tuple<bool, MixedPrecision>> {};

TEST_P(EveryModeAndArchitecture, CheckpointingChangesNothingButMemory) {
  const auto [llama, mp] = GetParam();
  const ModelConfig c = shape(llama);
  const Outcome none = train(c, mode(mp), ActivationCheckpointing::none);
  const Outcome selective = train(c, mode(mp), ActivationCheckpointing::selective);
  const Outcome full = train(c, mode(mp), ActivationCheckpointing::full);
  ASSERT_EQ(none.losses.size(), 4u);
  EXPECT_NE(none.losses.front(), none.losses.back()) << "the steps must train";
  bool nonzero = false;
  for (const float g : none.gradients) nonzero |= g != 0.0f;
  EXPECT_TRUE(nonzero) << "gradients that are all zero prove nothing";
  if (mp == MixedPrecision::fp8) {
    EXPECT_GT(none.fp8.size(), 4u) << "FP8 layers with scaling state";
  }
  expect_same(none, selective, "selective");
  expect_same(none, full, "full");

  // The plan: "full" keeps one block's activations and every block's input; "selective" drops the GEMMs'
  // inputs that are kept in float or bf16 (in FP8 their casts are all the FP8 layers read, kept already).
  EXPECT_EQ(none.activation_bytes, none.unchecked_bytes);
  EXPECT_EQ(full.unchecked_bytes, none.activation_bytes);
  EXPECT_LT(full.activation_bytes, selective.activation_bytes);
  if (mp == MixedPrecision::fp8) {
    EXPECT_LE(selective.activation_bytes, none.activation_bytes);
  } else {
    EXPECT_LT(selective.activation_bytes, none.activation_bytes);
  }
  EXPECT_NE(full.memory_line.find("train.activation_checkpointing = full"), std::string::npos)
      << full.memory_line;
  EXPECT_NE(selective.memory_line.find("train.activation_checkpointing = selective"), std::string::npos)
      << selective.memory_line;
  EXPECT_EQ(none.memory_line.find("activation_checkpointing"), std::string::npos) << none.memory_line;
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, EveryModeAndArchitecture,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(MixedPrecision::fp32, MixedPrecision::bf16,
                                                              MixedPrecision::fp16, MixedPrecision::fp8)),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param) ? "llama_" : "gpt2_") +
                                  std::string(mixed_precision_name(std::get<1>(p.param)));
                         });

// The mixture-of-experts Llama (routed only, and with a shared expert) in every mode, and in FP8 with its
// experts converted: the forward run again chooses the same experts and casts them with the forward's scales.
class MoeEveryMode : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(MoeEveryMode, CheckpointingChangesNothingButMemory) {
  const auto [shared, variant] = GetParam();
  const ModelConfig c = testing::tiny_moe_config(shared);
  static const MixedPrecision kModes[] = {MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp8,
                                          MixedPrecision::fp8};
  PrecisionSettings p = mode(kModes[variant]);
  p.experts = variant == 3;
  const Outcome none = train(c, p, ActivationCheckpointing::none);
  EXPECT_NE(none.losses.front(), none.losses.back()) << "the steps must train";
  expect_same(none, train(c, p, ActivationCheckpointing::selective), "selective");
  const Outcome full = train(c, p, ActivationCheckpointing::full);
  expect_same(none, full, "full");
  EXPECT_LT(full.activation_bytes, none.activation_bytes);
}

std::string moe_name(const ::testing::TestParamInfo<std::tuple<bool, int>>& info) {
  static const char* const kNames[] = {"fp32", "bf16", "fp8", "fp8_experts"};
  return std::string(std::get<0>(info.param) ? "shared_expert_" : "routed_") + kNames[std::get<1>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, MoeEveryMode,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2, 3)), moe_name);

// FP8 variants whose rerun casts differ: the current recipe (scales from the tensor itself), and layers
// that recompute their outputs from kept input codes (fp8.recompute_*) inside the checkpointed block, and
// a forward in FP8 whose weight gradient runs in BF16 (its float32 input kept next to its cast).
class Fp8Variants : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(Fp8Variants, CheckpointingChangesNothingButMemory) {
  const auto [llama, variant] = GetParam();
  const ModelConfig c = shape(llama);
  PrecisionSettings p = mode(MixedPrecision::fp8);
  if (variant == 0) p.recipe = RecipeKind::current;
  if (variant == 1) p.recompute_mlp = p.recompute_qkv = p.recompute_residual = true;
  if (variant == 2) p.fp8_weight_gradient = false;
  if (variant == 3) p.recipe = RecipeKind::mxfp8;
  const Outcome none = train(c, p, ActivationCheckpointing::none);
  expect_same(none, train(c, p, ActivationCheckpointing::selective), "selective");
  expect_same(none, train(c, p, ActivationCheckpointing::full), "full");
}

std::string variant_name(const ::testing::TestParamInfo<std::tuple<bool, int>>& info) {
  static const char* const kVariants[] = {"current_recipe", "recompute_outputs", "bf16_weight_gradient",
                                          "mxfp8"};
  return std::string(std::get<0>(info.param) ? "llama_" : "gpt2_") + kVariants[std::get<1>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, Fp8Variants,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1, 2, 3)), variant_name);

// A layer moved to BF16 mid-run (an FP8 alert's action) keeps its float32 input in a buffer of its own; a
// checkpointed block writes it again in its forward before its backward reads it.
TEST(ActivationCheckpointing, ALayerMovedToBf16KeepsTheSameResults) {
  const ModelConfig c = testing::tiny_llama_config();
  auto run = [&](ActivationCheckpointing level) {
    auto backend = make_cpu_backend();
    PrecisionSettings p = mode(MixedPrecision::fp8);
    p.activation_checkpointing = level;
    Decoder m(c, *backend, PrecisionPolicy(p, c, kBatch * kSeq), kBatch, kSeq);
    m.init_weights(11);
    TrainSettings s;
    s.batch_size = kBatch;
    s.seq_len = kSeq;
    Trainer t(m, s);
    const BatchSource data = pattern_stream(5, kBatch, kSeq, c.vocab_size);
    std::vector<float> out;
    out.push_back(t.step(data).loss);
    m.move_layer_to_bf16("layers.0.mlp.down_proj", "test");
    m.move_layer_to_bf16("layers.1.self_attn.qkv_proj", "test");
    for (int i = 0; i < 2; ++i) {
      out.push_back(t.step(data).loss);
      const float* g = m.grads();
      out.insert(out.end(), g, g + m.parameter_count());
    }
    return out;
  };
  const std::vector<float> none = run(ActivationCheckpointing::none);
  EXPECT_EQ(none, run(ActivationCheckpointing::selective));
  EXPECT_EQ(none, run(ActivationCheckpointing::full));
}

}  // namespace
}  // namespace octet
