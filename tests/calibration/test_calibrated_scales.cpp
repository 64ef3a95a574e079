// The static recipe with a calibration file: each FP8 layer's operands start with the file's scales and cast
// with them on every step (the state's scale, not the recipe's), bit for bit as a cast by hand with those
// scales; the startup line and the precision map say so.
#include <cmath>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "calibration_fixture.h"
#include "model_fixture.h"
#include "octet/backend/cpu_backend.h"
#include "octet/check.h"
#include "octet/model/model.h"
#include "octet/numerics/quantize.h"
#include "tiny_model.h"

namespace octet {
namespace {

class CalibratedScales : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() /
        ("octet-calibrated-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    file_ = dir_ / "tiny.calibration.json";
    // Layer i: activation 2^(i+1), weight 1, gradient 64 / 2^i; all exact powers of two.
    testing::write_text(
        file_, calibration_json(testing::made_up_calibration(testing::tiny_config(), {}, 32, [](size_t i) {
          return std::array<float, 3>{std::ldexp(1.0f, static_cast<int>(i) + 1), 1.0f,
                                      std::ldexp(64.0f, -static_cast<int>(i))};
        })));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  PrecisionSettings settings() const {
    PrecisionSettings s;
    s.mode = MixedPrecision::fp8;
    s.recipe = RecipeKind::static_scale;
    s.static_scale = 1.0f;
    s.calibration = file_;
    return s;
  }

  std::filesystem::path dir_, file_;
};

TEST(StaticScaling, CastsWithTheScaleItsStateHolds) {
  const StaticScaling recipe(1.0f);
  ScalingState state = recipe.initial_state();
  state.scale = 8.0f;
  state.scale_inv = 0.125f;
  const std::vector<float> x = {100.0f, 1.0f};
  const QuantizedTensor q = quantize(x, 1, 2, Dtype::e4m3, TensorRole::activation, recipe, state);
  EXPECT_EQ(q.scale_inv[0], 0.125f);
  EXPECT_EQ(q.stats.saturated, 1) << "100 x 8 = 800 saturates to 448";
  EXPECT_EQ(dequantize(q)[0], 56.0f);
  EXPECT_EQ(dequantize(q)[1], 1.0f);
  EXPECT_EQ(state.scale, 8.0f) << "the static recipe never moves a state's scale";
  EXPECT_EQ(state.last_amax, 100.0f);
}

TEST_F(CalibratedScales, EachLayerStartsWithItsScalesFromTheFile) {
  const PrecisionPolicy policy(settings(), testing::tiny_config(), 32);
  ASSERT_TRUE(policy.calibrated());
  for (size_t i = 0; i < policy.layers().size(); ++i) {
    const LinearPlan& p = policy.layers()[i];
    SCOPED_TRACE(p.name);
    if (!p.fp8()) {
      EXPECT_FALSE(policy.calibrated_scales(p.name).has_value());
      continue;
    }
    const Fp8LinearState s = policy.initial_fp8_state(p.name);
    EXPECT_EQ(s.activation.scale, std::ldexp(1.0f, static_cast<int>(i) + 1));
    EXPECT_EQ(s.activation.scale_inv, std::ldexp(1.0f, -static_cast<int>(i) - 1));
    EXPECT_EQ(s.weight.scale, 1.0f);
    EXPECT_EQ(s.gradient.scale, std::ldexp(64.0f, -static_cast<int>(i)));
  }
  const std::string line = policy.startup_line();
  EXPECT_NE(
      line.find("recipe=static (hybrid E4M3/E5M2, per-layer scales calibrated in " + file_.string() + ")"),
      std::string::npos)
      << line;
  EXPECT_NE(policy.recipe()->describe().find(file_.string()), std::string::npos);
  const std::string map = policy.map_json();
  EXPECT_NE(
      map.find("\"layer\": \"h.0.attn.c_attn\", \"in_features\": 64, \"out_features\": 192, \"forward\": "
               "\"fp8\", \"input_gradient\": \"fp8\", \"weight_gradient\": \"fp8\", \"reason\": \"FP8 by "
               "policy\", \"scales\": {\"activation\": 2.0, \"weight\": 1.0, \"gradient\": 64.0}, "
               "\"calibration\": \"" +
               file_.string() + "\""),
      std::string::npos)
      << map;
  // Without the file, one scale for all, as before.
  PrecisionSettings plain = settings();
  plain.calibration.clear();
  plain.static_scale = 4.0f;
  const PrecisionPolicy uncalibrated(plain, testing::tiny_config(), 32);
  EXPECT_FALSE(uncalibrated.calibrated());
  EXPECT_EQ(uncalibrated.initial_fp8_state("h.1.mlp.c_fc").gradient.scale, 4.0f);
  EXPECT_NE(uncalibrated.startup_line().find("scale 4)"), std::string::npos);
}

// h.0.attn.c_attn's three GEMMs on the CPU backend with the file's scales (activation 2, weight 1, gradient
// 64), on values those scales decide (a power-of-two scale changes a cast only where it saturates or
// underflows): 300 x 2 = 600 saturates to E4M3's 448, standing for 224, where the recipe's scale 1 would
// give 288; a gradient of 1000 x 64 = 64000 saturates to E5M2's 57344, standing for 896, where scale 1
// gives 1024.
TEST_F(CalibratedScales, ALayerCastsWithItsCalibratedScalesBitForBit) {
  const PrecisionPolicy policy(settings(), testing::tiny_config(), 32);
  const int64_t N = 16, C = 16, OC = 16;
  auto backend = make_cpu_backend();
  Fp8LinearState state = policy.initial_fp8_state("h.0.attn.c_attn");
  int64_t fp8_gemms = 0;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
  exec.recipe = policy.recipe();
  exec.formats = policy.formats();
  exec.state = &state;
  exec.fp8_gemms = &fp8_gemms;
  std::vector<float> x(N * C, 0.0f), w(OC * C, 0.0f), dout(N * OC, 0.0f);
  x[0] = 300.0f;
  x[1] = 1.0f;
  w[0] = 1.0f;  // out[0][0] = x[0][0] + x[0][1]
  w[1] = 1.0f;
  dout[0] = 1000.0f;  // dinp[0][c] = dout[0][0] * w[0][c]
  std::unique_ptr<WeightCopy> copy;
  std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
  backend->prepare_weight(copy, w.data(), OC, C, exec);
  std::vector<float> out(N * OC, NAN), dinp(N * C, NAN), dweight(OC * C, 0.0f);
  backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                          ConstTensorView(w.data(), {OC, C}), copy.get(), {}, exec, {&input_codes});
  backend->linear_backward(TensorView(dinp.data(), {N, C}), TensorView(dweight.data(), {OC, C}), nullptr,
                           ConstTensorView(dout.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                           ConstTensorView(w.data(), {OC, C}), copy.get(), exec, input_codes.get(),
                           {&gradient_codes});
  EXPECT_EQ(fp8_gemms, 3);
  EXPECT_EQ(out[0], 224.0f + 1.0f);
  EXPECT_EQ(dinp[0], 896.0f);
  EXPECT_EQ(dinp[1], 896.0f);
  EXPECT_EQ(dweight[0], 896.0f * 224.0f) << "dy^T x on the cast operands";
  EXPECT_EQ(state.activation.scale, 2.0f);
  EXPECT_EQ(state.gradient.scale, 64.0f);
  EXPECT_EQ(state.activation.last_amax, 300.0f);
}

TEST_F(CalibratedScales, AModelKeepsThemThroughTraining) {
  PrecisionSettings s = settings();
  auto backend = make_cpu_backend();
  const ModelConfig config = testing::tiny_config();
  const std::unique_ptr<Model> model = make_model(config, *backend, PrecisionPolicy(s, config, 32), 2, 16);
  model->init_weights(1);
  TrainSettings train;
  train.batch_size = 2;
  train.seq_len = 16;
  Trainer trainer(*model, train);
  const BatchSource data = testing::pattern_stream(5, 2, 16, config.vocab_size);
  for (int step = 0; step < 2; ++step) trainer.step(data);
  const PrecisionPolicy& policy = model->policy();
  int64_t checked = 0;
  for (const LinearPlan& p : policy.layers()) {
    Fp8LinearState* state = model->fp8_state(p.name);
    if (state == nullptr) continue;
    const std::array<float, 3> want = *policy.calibrated_scales(p.name);
    EXPECT_EQ(state->activation.scale, want[0]) << p.name;
    EXPECT_EQ(state->weight.scale, want[1]) << p.name;
    EXPECT_EQ(state->gradient.scale, want[2]) << p.name;
    EXPECT_GT(state->activation.updates, 0) << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

TEST_F(CalibratedScales, APolicyRefusesAFileForAnotherRecipeOrThatIsMissing) {
  PrecisionSettings delayed = settings();
  delayed.recipe = RecipeKind::delayed;
  try {
    PrecisionPolicy(delayed, testing::tiny_config(), 32);
    FAIL() << "a calibration for the delayed recipe";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("set fp8.recipe = \"static\""), std::string::npos) << e.what();
  }
  PrecisionSettings missing = settings();
  missing.calibration = dir_ / "none.json";
  try {
    PrecisionPolicy(missing, testing::tiny_config(), 32);
    FAIL() << "a missing calibration file";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find((dir_ / "none.json").string()), std::string::npos) << e.what();
  }
  PrecisionSettings bf16 = missing;  // not read outside fp8 mode
  bf16.mode = MixedPrecision::bf16;
  EXPECT_FALSE(PrecisionPolicy(bf16, testing::tiny_config(), 32).calibrated());
}

}  // namespace
}  // namespace octet
