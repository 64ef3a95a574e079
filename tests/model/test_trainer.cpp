// The training step: schedule, loss scaling, clipping, gradient accumulation, non-finite steps, and
// bit-identical runs from the same seed in every mode.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "compare.h"
#include "model_fixture.h"
#include "octet/numerics/quantize.h"

namespace octet {
namespace {

using testing::mode;
using testing::pattern_stream;
using testing::tiny_config;

using testing::small_settings;

TEST(LearningRateSchedule, WarmupThenCosineToTheFloor) {
  LearningRateSchedule s;
  s.max_learning_rate = 1.0f;
  s.warmup_steps = 4;
  s.total_steps = 14;
  s.final_fraction = 0.1f;
  EXPECT_FLOAT_EQ(s.at(0), 0.25f);
  EXPECT_FLOAT_EQ(s.at(3), 1.0f);
  EXPECT_FLOAT_EQ(s.at(4), 1.0f);  // decay starts at the maximum
  // Step 8 is 4 of the 9 decay intervals in.
  EXPECT_FLOAT_EQ(s.at(8),
                  0.1f + 0.9f * 0.5f * (1.0f + static_cast<float>(std::cos(3.141592653589793 * 4.0 / 9.0))));
  EXPECT_FLOAT_EQ(s.at(13), 0.1f);  // ends on the floor
  EXPECT_FLOAT_EQ(s.at(100), 0.1f);
  for (int64_t i = 5; i < 14; ++i) EXPECT_LT(s.at(i), s.at(i - 1));
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScaleSettings d;
  d.dynamic = true;
  d.initial_scale = 1024.0f;
  d.growth_interval = 3;
  LossScaler s(d);
  EXPECT_EQ(s.update(true), 512.0f);
  EXPECT_EQ(s.update(false), 512.0f);
  EXPECT_EQ(s.update(false), 512.0f);
  EXPECT_EQ(s.update(false), 1024.0f);
  EXPECT_EQ(s.update(false), 1024.0f);
  EXPECT_EQ(s.update(true), 512.0f);
  EXPECT_EQ(s.clean_steps(), 0);
  LossScaler fixed{LossScaleSettings{}};
  EXPECT_EQ(fixed.update(true), 1.0f);
}

std::vector<float> run(MixedPrecision mp, int steps, int64_t accumulation = 1, int64_t batch = 2) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  TrainSettings s = small_settings();
  s.batch_size = batch;
  s.grad_accum_steps = accumulation;
  s.loss_scale.dynamic = mp == MixedPrecision::fp16;
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(mode(mp), c, batch * 16), batch, 16);
  Model& m = *m_owner;
  m.init_weights(11);
  Trainer t(m, s);
  const BatchSource data = pattern_stream(5, batch, 16, c.vocab_size);
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    const StepResult r = t.step(data);
    EXPECT_FALSE(r.skipped) << r.skip_reason;
    losses.push_back(r.loss);
  }
  return losses;
}

class EveryMode : public ::testing::TestWithParam<MixedPrecision> {};

TEST_P(EveryMode, TrainsAndRepeatsBitForBit) {
  const std::vector<float> a = run(GetParam(), 12);
  const std::vector<float> b = run(GetParam(), 12);
  EXPECT_EQ(a, b) << "same seed and data must give bit-identical losses";
  EXPECT_LT(a.back(), a.front() - 0.5f) << "the loss should fall on a learnable stream";
}

INSTANTIATE_TEST_SUITE_P(Modes, EveryMode,
                         ::testing::Values(MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp16,
                                           MixedPrecision::fp8),
                         [](const auto& p) { return std::string(mixed_precision_name(p.param)); });

TEST(Trainer, AccumulatingMicroBatchesEqualsOneLargeBatch) {
  // Two micro-batches of 2 sequences against one batch of 4 (the same sequences): the same step in float32.
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  auto gradient_of_one_step = [&](int64_t batch, int64_t accumulation) {
    TrainSettings s = small_settings();
    s.batch_size = batch;
    s.grad_accum_steps = accumulation;
    const std::unique_ptr<Model> m_owner =
        make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, batch * 16), batch, 16);
    Model& m = *m_owner;
    m.init_weights(11);
    Trainer t(m, s);
    const BatchSource data = pattern_stream(5, 2, 16, c.vocab_size);  // always pairs of sequences
    BatchSource source = data;
    if (batch == 4) {
      source = [data](int32_t* tokens, int32_t* targets) {
        data(tokens, targets);
        data(tokens + 32, targets + 32);
      };
    }
    const StepResult r = t.step(source);
    // The gradient of the step's mean loss stays in grads() after the update.
    return std::make_pair(r, std::vector<double>(m.grads(), m.grads() + m.parameter_count()));
  };
  const auto [large, large_grads] = gradient_of_one_step(4, 1);
  const auto [accumulated, accumulated_grads] = gradient_of_one_step(2, 2);
  EXPECT_NEAR(large.loss, accumulated.loss, 1e-6f);
  // Only the order of float32 additions differs: a relative difference of the order of 1e-7 (float32
  // arithmetic lands far under 1e-5), while a missing or doubled micro-batch would be of order 1.
  double diff = 0, norm = 0;
  for (size_t i = 0; i < large_grads.size(); ++i) {
    diff += (accumulated_grads[i] - large_grads[i]) * (accumulated_grads[i] - large_grads[i]);
    norm += large_grads[i] * large_grads[i];
  }
  ASSERT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff / norm), 1e-5);
  EXPECT_NEAR(large.grad_norm, accumulated.grad_norm, 1e-5f * large.grad_norm);
}

TEST(Trainer, ClippingScalesTheGradientToTheLimit) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  TrainSettings s = small_settings();
  s.grad_clip = 0.01f;
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(2);
  Trainer t(m, s);
  const StepResult r = t.step(pattern_stream(1, 2, 16, c.vocab_size));
  ASSERT_GT(r.grad_norm, 0.01f);
  // After one step the first moment is (1 - beta1) * g * clip / norm.
  const double g = std::sqrt(backend->sum_of_squares(ConstTensorView(m.grads(), {m.parameter_count()})));
  const double m1 = std::sqrt(
      backend->sum_of_squares(ConstTensorView(t.optimizer().first_moment(), {m.parameter_count()})));
  EXPECT_NEAR(g, r.grad_norm, 1e-4 * g);
  EXPECT_NEAR(m1, 0.1 * 0.01, 1e-6);
}

TEST(Trainer, NonFiniteLossSkipsTheStepAndNamesIt) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(2);
  m.params()[m.parameter("h.1.mlp.c_fc.weight").offset + 5] = NAN;
  const std::vector<float> before(m.params(), m.params() + m.parameter_count());
  TrainSettings s = small_settings();
  s.max_consecutive_skips = 2;
  Trainer t(m, s);
  const StepResult r = t.step(pattern_stream(1, 2, 16, c.vocab_size));
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.skip_reason, "non-finite loss (nan)");
  for (int64_t i = 0; i < m.parameter_count(); ++i) {
    if (!std::isnan(before[static_cast<size_t>(i)])) {
      ASSERT_EQ(m.params()[i], before[static_cast<size_t>(i)]);
    }
  }
  try {
    t.step(pattern_stream(1, 2, 16, c.vocab_size));
    FAIL() << "a second skip in a row should stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 3);
    EXPECT_NE(std::string(e.what()).find("2 consecutive steps skipped"), std::string::npos) << e.what();
  }
}

TEST(Trainer, Fp16OverflowSkipsNamesTheTensorAndBacksOff) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp16), c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(2);
  TrainSettings s = small_settings();
  s.loss_scale.dynamic = true;
  // 2^24 / (B*T) puts the logits' gradient far past FP16's 65504: the LM head's FP16 GEMMs overflow.
  s.loss_scale.initial_scale = 16777216.0f;
  Trainer t(m, s);
  const BatchSource data = pattern_stream(1, 2, 16, c.vocab_size);
  const StepResult r = t.step(data);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.skip_reason, "non-finite gradient in wte at loss scale 16777216");
  EXPECT_EQ(t.loss_scaler().scale(), 8388608.0f);
  // The scale keeps halving until the gradients fit, then training proceeds.
  int skipped = 1;
  while (skipped < 9 && t.step(data).skipped) ++skipped;
  EXPECT_LT(skipped, 9);
  EXPECT_LT(t.loss_scaler().scale(), 16777216.0f / 2);
}

TEST(Trainer, EvaluationLeavesTheFp8StateAlone) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp8), c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(2);
  Trainer t(m, small_settings());
  const BatchSource data = pattern_stream(1, 2, 16, c.vocab_size);
  t.step(data);
  const Fp8LinearState before = *m.fp8_state("h.0.mlp.c_fc");
  t.evaluate(data, 2);
  const Fp8LinearState& after = *m.fp8_state("h.0.mlp.c_fc");
  EXPECT_EQ(after.activation.amax_history, before.activation.amax_history);
  EXPECT_EQ(after.activation.scale, before.activation.scale);
}

TEST(Trainer, WeightAmaxHistoryRecordsEachStepsWeights) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m_owner =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp8), c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(2);
  Trainer t(m, small_settings());
  const BatchSource data = pattern_stream(1, 2, 16, c.vocab_size);
  const ParameterInfo& w = m.parameter("h.1.attn.c_proj.weight");
  for (int step = 0; step < 3; ++step) {
    const StepResult r = t.step(data);
    EXPECT_EQ(r.fp8_gemms, 24);
    const Fp8LinearState& s = *m.fp8_state("h.1.attn.c_proj");
    // The weight is cast once at initialisation and once after each optimizer step.
    EXPECT_EQ(s.weight.updates, step + 2);
    EXPECT_EQ(s.weight.amax_history[0], compute_amax({m.params() + w.offset, static_cast<size_t>(w.count)}));
    float window = 0;
    for (const float a : s.weight.amax_history) window = std::max(window, a);
    EXPECT_EQ(s.weight.scale, 448.0f / window);
    EXPECT_EQ(s.activation.updates, step + 1);
    EXPECT_EQ(s.gradient.updates, step + 1);
  }
}

}  // namespace
}  // namespace octet

namespace octet {
namespace {

TEST(Trainer, Fp8RunsPrintTheStartupLineAndWriteTheMap) {
  const ModelConfig c = testing::tiny_config();
  auto backend = make_cpu_backend();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("octet-run-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
       std::to_string(reinterpret_cast<uintptr_t>(&c)));
  for (const MixedPrecision mp : {MixedPrecision::fp8, MixedPrecision::bf16}) {
    std::filesystem::remove_all(dir);
    const std::unique_ptr<Model> m_owner =
        make_model(c, *backend, PrecisionPolicy(testing::mode(mp), c, 32), 2, 16);
    Model& m = *m_owner;
    TrainSettings s;
    s.batch_size = 2;
    s.seq_len = 16;
    s.run_directory = dir;
    std::vector<std::string> lines;
    s.log = [&](std::string_view line) { lines.emplace_back(line); };
    Trainer t(m, s);
    if (mp == MixedPrecision::fp8) {
      ASSERT_EQ(lines.size(), 1u);
      EXPECT_EQ(lines[0],
                "FP8 training enabled: recipe=delayed (hybrid E4M3/E5M2, history 16, margin 0); 8 of 9 "
                "linear layers "
                "in FP8; lm_head: excluded by config");
    } else {
      EXPECT_TRUE(lines.empty()) << "no FP8 line outside fp8 mode";
    }
    std::ifstream map(dir / "precision_map.json");
    const std::string text((std::istreambuf_iterator<char>(map)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, precision_map_json(m));
    size_t files = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
    EXPECT_EQ(files, 1u) << "only precision_map.json, no temporary left behind";
  }
  std::filesystem::remove_all(dir);
}

TEST(Trainer, PerGemmChoicesRunAndAreCounted) {
  const ModelConfig c = testing::tiny_config();
  auto backend = make_cpu_backend();
  PrecisionSettings p = testing::mode(MixedPrecision::fp8);
  p.fp8_weight_gradient = false;
  const std::unique_ptr<Model> m_owner = make_model(c, *backend, PrecisionPolicy(p, c, 32), 2, 16);
  Model& m = *m_owner;
  m.init_weights(4);
  TrainSettings s;
  s.batch_size = 2;
  s.seq_len = 16;
  Trainer t(m, s);
  const StepResult r = t.step(testing::pattern_stream(3, 2, 16, c.vocab_size));
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.fp8_gemms, 8 * 2);    // forward and input gradient of 8 layers
  EXPECT_EQ(r.other_gemms, 8 + 3);  // their weight gradients, and the LM head's three GEMMs
}

}  // namespace
}  // namespace octet
