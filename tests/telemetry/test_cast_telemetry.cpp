// What the CPU backend measures about its FP8 casts: for each operand of a layer (activation in the forward,
// weight when the copy is made, output gradient in the backward) the counts and energies equal those computed
// here, independently, from octet::quantize on the very same tensor; evaluation casts leave them alone; and
// the model keeps one set per FP8 layer.
#include <cmath>

#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/backend/cpu_backend.h"
#include "octet/numerics/quantize.h"
#include "random.h"

namespace octet {
namespace {

// The telemetry of one cast, computed independently: quantize with a copy of the state the backend saw.
CastTelemetry expected_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Dtype format,
                            TensorRole role, const ScalingRecipe& recipe, ScalingState state) {
  const QuantizedTensor q = quantize(x, rows, cols, format, role, recipe, state);
  const std::vector<float> back = dequantize(q);
  CastTelemetry t;
  t.casts = 1;
  t.elements = rows * cols;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) continue;
    t.nonzero += x[i] != 0.0f ? 1 : 0;
    t.signal_energy += static_cast<double>(x[i]) * x[i];
    const double e = static_cast<double>(x[i]) - back[i];
    t.noise_energy += e * e;
  }
  t.saturated = q.stats.saturated;
  t.underflowed = q.stats.underflowed;
  return t;
}

void expect_same(const CastTelemetry& got, const CastTelemetry& want, const char* operand) {
  EXPECT_EQ(got.casts, want.casts) << operand;
  EXPECT_EQ(got.elements, want.elements) << operand;
  EXPECT_EQ(got.nonzero, want.nonzero) << operand;
  EXPECT_EQ(got.saturated, want.saturated) << operand;
  EXPECT_EQ(got.underflowed, want.underflowed) << operand;
  EXPECT_DOUBLE_EQ(got.signal_energy, want.signal_energy) << operand;
  EXPECT_DOUBLE_EQ(got.noise_energy, want.noise_energy) << operand;
}

// Values over many orders of magnitude with zeros, so that at scale 64 some saturate (E4M3 above 7, E5M2
// above 896) and some underflow (E4M3 below 2^-16, E5M2 below 2^-23).
std::vector<float> troubled(size_t n, uint64_t seed) {
  std::vector<float> x = testing::random_log_uniform(n, seed, -28, 11);
  for (size_t i = 0; i < n; i += 17) x[i] = 0.0f;
  return x;
}

class CastTelemetryOfALayer : public ::testing::TestWithParam<bool> {};

TEST_P(CastTelemetryOfALayer, EqualsIndependentQuantizeCountsForEveryOperand) {
  const bool sqnr = GetParam();
  const int64_t N = 32, C = 48, OC = 80;
  const StaticScaling recipe(64.0f);
  auto backend = make_cpu_backend();
  const std::vector<float> weight = troubled(static_cast<size_t>(OC * C), 1);
  const std::vector<float> input = troubled(static_cast<size_t>(N * C), 2);
  const std::vector<float> dout = troubled(static_cast<size_t>(N * OC), 3);

  Fp8LinearState state{recipe.initial_state(), recipe.initial_state(), recipe.initial_state()};
  Fp8LinearTelemetry telemetry;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
  exec.recipe = &recipe;
  exec.state = &state;
  exec.telemetry = &telemetry;
  exec.measure_sqnr = sqnr;
  const Fp8Formats f;

  std::unique_ptr<WeightCopy> copy;
  std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
  const CastTelemetry want_weight =
      expected_cast(weight, OC, C, f.weight, TensorRole::weight, recipe, state.weight);
  backend->prepare_weight(copy, weight.data(), OC, C, exec);
  std::vector<float> out(static_cast<size_t>(N * OC)), dinp(static_cast<size_t>(N * C)),
      dweight(static_cast<size_t>(OC * C));
  const CastTelemetry want_activation =
      expected_cast(input, N, C, f.activation, TensorRole::activation, recipe, state.activation);
  backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(input.data(), {N, C}),
                          ConstTensorView(weight.data(), {OC, C}), copy.get(), {}, exec, {&input_codes});
  const CastTelemetry want_gradient =
      expected_cast(dout, N, OC, f.gradient, TensorRole::gradient, recipe, state.gradient);
  backend->linear_backward(TensorView(dinp.data(), {N, C}), TensorView(dweight.data(), {OC, C}), nullptr,
                           ConstTensorView(dout.data(), {N, OC}), ConstTensorView(input.data(), {N, C}),
                           ConstTensorView(weight.data(), {OC, C}), copy.get(), exec, input_codes.get(),
                           {&gradient_codes});

  // The planted trouble is there: every operand saturates and underflows.
  for (const CastTelemetry* t : {&want_weight, &want_activation, &want_gradient}) {
    EXPECT_GT(t->saturated, 0);
    EXPECT_GT(t->underflowed, 0);
    EXPECT_LT(t->nonzero, t->elements);  // the zeros are not counted as non-zero
  }
  CastTelemetry no_energy_weight = want_weight, no_energy_activation = want_activation,
                no_energy_gradient = want_gradient;
  for (CastTelemetry* t : {&no_energy_weight, &no_energy_activation, &no_energy_gradient})
    t->signal_energy = t->noise_energy = 0.0;
  expect_same(telemetry.weight, sqnr ? want_weight : no_energy_weight, "weight");
  expect_same(telemetry.activation, sqnr ? want_activation : no_energy_activation, "activation");
  expect_same(telemetry.gradient, sqnr ? want_gradient : no_energy_gradient, "gradient");

  // Running totals: a second forward adds a second cast.
  backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(input.data(), {N, C}),
                          ConstTensorView(weight.data(), {OC, C}), copy.get(), {}, exec, {&input_codes});
  EXPECT_EQ(telemetry.activation.casts, 2);
  EXPECT_EQ(telemetry.activation.saturated, 2 * want_activation.saturated);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutSqnr, CastTelemetryOfALayer, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Sqnr" : "Counts"; });

// Telemetry is optional: a layer without a telemetry pointer casts, computes and updates its scaling state
// exactly as one that collects, its saturation and underflow counters count the same, and only the
// per-operand telemetry is left out (the layer that collects has it, for the same casts).
TEST(CastTelemetry, WithoutATelemetryPointerOnlyThePerOperandTelemetryIsLeftOut) {
  const int64_t N = 16, C = 16, OC = 16;
  const StaticScaling recipe(64.0f);
  auto backend = make_cpu_backend();
  const std::vector<float> weight = troubled(static_cast<size_t>(OC * C), 4);
  const std::vector<float> input = troubled(static_cast<size_t>(N * C), 5);
  struct Run {
    Fp8LinearState state;
    std::vector<float> out;
    int64_t saturated = 0;
    int64_t underflowed = 0;
  };
  auto run = [&](Fp8LinearTelemetry* telemetry) {
    Run r{{recipe.initial_state(), recipe.initial_state(), recipe.initial_state()}, {}};
    LinearExecution exec;
    exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
    exec.recipe = &recipe;
    exec.state = &r.state;
    exec.saturated = &r.saturated;
    exec.underflowed = &r.underflowed;
    exec.telemetry = telemetry;
    std::unique_ptr<WeightCopy> copy;
    std::unique_ptr<Fp8Tensor> input_codes;
    backend->prepare_weight(copy, weight.data(), OC, C, exec);
    r.out.resize(static_cast<size_t>(N * OC));
    backend->linear_forward(TensorView(r.out.data(), {N, OC}), ConstTensorView(input.data(), {N, C}),
                            ConstTensorView(weight.data(), {OC, C}), copy.get(), {}, exec, {&input_codes});
    return r;
  };
  Fp8LinearTelemetry collected;
  const Run with = run(&collected);
  const Run without = run(nullptr);
  EXPECT_EQ(collected.weight.casts, 1);
  EXPECT_EQ(collected.activation.casts, 1);
  EXPECT_GT(collected.activation.saturated + collected.weight.saturated, 0) << "the inputs are troubled";
  EXPECT_EQ(without.out, with.out);
  EXPECT_EQ(without.saturated, with.saturated);
  EXPECT_EQ(without.underflowed, with.underflowed);
  EXPECT_EQ(without.saturated, collected.activation.saturated + collected.weight.saturated);
  for (const auto member : {&Fp8LinearState::activation, &Fp8LinearState::weight}) {
    EXPECT_EQ((without.state.*member).updates, (with.state.*member).updates);
    EXPECT_EQ((without.state.*member).last_amax, (with.state.*member).last_amax);
    EXPECT_EQ((without.state.*member).scale, (with.state.*member).scale);
  }
}

TEST(ModelTelemetry, OneSetPerFp8LayerCountingTrainingCastsOnly) {
  const ModelConfig config = testing::tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model_owner =
      make_model(config, *backend, PrecisionPolicy(testing::mode(MixedPrecision::fp8), config, 32), 2, 16);
  Model& model = *model_owner;
  model.init_weights(7);
  TrainSettings settings;
  settings.batch_size = 2;
  settings.seq_len = 16;
  Trainer trainer(model, settings);
  trainer.step(testing::pattern_stream(1, 2, 16, config.vocab_size));
  const int64_t N = 32, C = config.channels;
  const Fp8LinearTelemetry* fc = model.telemetry("h.0.mlp.c_fc");
  ASSERT_NE(fc, nullptr);
  EXPECT_EQ(fc->activation.casts, 1);
  EXPECT_EQ(fc->activation.elements, N * C);
  EXPECT_EQ(fc->weight.casts, 2);  // at init_weights and after the update
  EXPECT_EQ(fc->weight.elements, 2 * 4 * C * C);
  EXPECT_EQ(fc->gradient.casts, 1);
  EXPECT_EQ(fc->gradient.elements, N * 4 * C);
  EXPECT_EQ(fc->activation.signal_energy, 0.0);    // SQNR is off by default
  EXPECT_EQ(model.telemetry("lm_head"), nullptr);  // not in FP8

  trainer.evaluate(testing::pattern_stream(2, 2, 16, config.vocab_size), 2);
  EXPECT_EQ(model.telemetry("h.0.mlp.c_fc")->activation.casts, 1) << "evaluation casts are not counted";

  model.set_telemetry(true, true);
  trainer.step(testing::pattern_stream(3, 2, 16, config.vocab_size));
  EXPECT_GT(model.telemetry("h.0.mlp.c_fc")->activation.signal_energy, 0.0);
  model.reset_telemetry();
  EXPECT_EQ(model.telemetry("h.0.mlp.c_fc")->activation.casts, 0);
  model.set_telemetry(false, false);
  trainer.step(testing::pattern_stream(4, 2, 16, config.vocab_size));
  EXPECT_EQ(model.telemetry("h.0.mlp.c_fc")->activation.casts, 0) << "collection switched off";
}

TEST(ModelTelemetry, MovingALayerToBf16RunsItsThreeGemmsInBf16) {
  const ModelConfig config = testing::tiny_config();
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model_owner =
      make_model(config, *backend, PrecisionPolicy(testing::mode(MixedPrecision::fp8), config, 32), 2, 16);
  Model& model = *model_owner;
  model.init_weights(7);
  TrainSettings settings;
  settings.batch_size = 2;
  settings.seq_len = 16;
  Trainer trainer(model, settings);
  const StepResult before = trainer.step(testing::pattern_stream(1, 2, 16, config.vocab_size));
  EXPECT_EQ(before.fp8_gemms, 8 * 3);
  model.move_layer_to_bf16("h.1.mlp.c_fc", "BF16 by test");
  const LinearPlan& plan = model.policy().layer("h.1.mlp.c_fc");
  EXPECT_EQ(plan.forward, GemmMode::bf16);
  EXPECT_EQ(plan.input_gradient, GemmMode::bf16);
  EXPECT_EQ(plan.weight_gradient, GemmMode::bf16);
  EXPECT_EQ(plan.reason, "BF16 by test");
  EXPECT_NE(
      model.policy().map_json().find("\"layer\": \"h.1.mlp.c_fc\", \"in_features\": 64, \"out_features\": "
                                     "256, \"forward\": \"bf16\""),
      std::string::npos);
  EXPECT_EQ(model.fp8_state("h.1.mlp.c_fc"), nullptr);
  EXPECT_EQ(model.telemetry("h.1.mlp.c_fc"), nullptr);
  const StepResult after = trainer.step(testing::pattern_stream(2, 2, 16, config.vocab_size));
  EXPECT_EQ(after.fp8_gemms, 7 * 3);
  EXPECT_EQ(after.other_gemms, before.other_gemms + 3);
  EXPECT_TRUE(std::isfinite(after.loss));
}

}  // namespace
}  // namespace octet
