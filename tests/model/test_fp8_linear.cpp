// FP8 emulation: every GEMM of an FP8 linear layer equals the numerics core's emulated FP8 GEMM on operands
// quantized independently here, and the layer's scaling state evolves exactly as the recipe defines.
#include <gtest/gtest.h>

#include "compare.h"
#include "octet/backend/cpu_backend.h"
#include "octet/numerics/fp8_gemm.h"
#include "random.h"

namespace octet {
namespace {

QuantizedTensor transpose_codes(const QuantizedTensor& q) {
  QuantizedTensor t = q;
  t.rows = q.cols;
  t.cols = q.rows;
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c)
      t.data[static_cast<size_t>(c * q.rows + r)] = q.data[static_cast<size_t>(r * q.cols + c)];
  }
  return t;
}

std::vector<float> transpose_values(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  }
  return t;
}

// The K-major transpose of an operand: per-tensor scales carry over, so the codes transpose; block scales lie
// along the other dimension, so the transposed values are quantized afresh.
QuantizedTensor transposed_operand(const QuantizedTensor& q, const std::vector<float>& values,
                                   TensorRole role, const ScalingRecipe& recipe) {
  if (q.granularity == ScaleGranularity::per_tensor) return transpose_codes(q);
  ScalingState unused;
  return quantize(transpose_values(values, q.rows, q.cols), q.cols, q.rows, q.format, role, recipe, unused);
}

std::vector<float> product(const QuantizedTensor& a, const QuantizedTensor& b) {
  Fp8GemmArguments args;
  args.a = &a;
  args.b = &b;
  args.accumulation = blas_available() ? GemmAccumulation::blas : GemmAccumulation::reference;
  return fp8_gemm(args).values;
}

std::vector<float> bf16(std::vector<float> v) {
  for (float& x : v) x = round_to(Dtype::bf16, x);
  return v;
}

void expect_same_state(const ScalingState& got, const ScalingState& want, const char* what) {
  EXPECT_EQ(got.scale, want.scale) << what;
  EXPECT_EQ(got.scale_inv, want.scale_inv) << what;
  EXPECT_EQ(got.amax_history, want.amax_history) << what;
  EXPECT_EQ(got.updates, want.updates) << what;
}

class Fp8Linear : public ::testing::TestWithParam<RecipeKind> {};

TEST_P(Fp8Linear, EveryGemmEqualsTheEmulatedFp8Gemm) {
  const int64_t N = 32, C = 48, OC = 64;
  std::unique_ptr<ScalingRecipe> recipe;
  if (GetParam() == RecipeKind::delayed) recipe = std::make_unique<DelayedScaling>(4);
  if (GetParam() == RecipeKind::current) recipe = std::make_unique<CurrentScaling>();
  if (GetParam() == RecipeKind::static_scale) recipe = std::make_unique<StaticScaling>(64.0f);
  if (GetParam() == RecipeKind::block) recipe = std::make_unique<BlockScaling>();
  auto backend = make_cpu_backend();
  const std::vector<float> weight = testing::random_normal(OC * C, 1, 0.05f);
  const std::vector<float> bias = testing::random_normal(OC, 2, 0.1f);

  Fp8LinearState state{recipe->initial_state(), recipe->initial_state(), recipe->initial_state()};
  int64_t fp8_gemms = 0;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
  exec.recipe = recipe.get();
  exec.state = &state;
  exec.fp8_gemms = &fp8_gemms;
  std::unique_ptr<WeightCopy> copy;
  backend->prepare_weight(copy, weight.data(), OC, C, exec);

  // The test's own scaling state, driven through the same sequence of casts.
  ScalingState act = recipe->initial_state(), wgt = recipe->initial_state(), grad = recipe->initial_state();
  const QuantizedTensor qw = quantize(weight, OC, C, Dtype::e4m3, TensorRole::weight, *recipe, wgt);

  for (int step = 0; step < 3; ++step) {
    // Magnitudes change from step to step so that the amax history and the scales move.
    const std::vector<float> x =
        testing::random_normal(N * C, 10 + step, 1.0f + 3.0f * static_cast<float>(step));
    const std::vector<float> dy =
        testing::random_normal(N * OC, 20 + step, 1e-3f / static_cast<float>(1 + step));
    std::vector<float> out(N * OC), dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
    backend->linear_forward(out.data(), x.data(), weight.data(), copy.get(), bias.data(), N, C, OC, exec);
    backend->linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), weight.data(), copy.get(),
                             N, C, OC, exec);

    const QuantizedTensor qx = quantize(x, N, C, Dtype::e4m3, TensorRole::activation, *recipe, act);
    const QuantizedTensor qdy = quantize(dy, N, OC, Dtype::e5m2, TensorRole::gradient, *recipe, grad);
    std::vector<float> want_out = product(qx, qw);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < OC; ++o)
        want_out[static_cast<size_t>(n * OC + o)] += bias[static_cast<size_t>(o)];
    }
    want_out = bf16(want_out);
    const std::vector<float> want_dx =
        bf16(product(qdy, transposed_operand(qw, weight, TensorRole::weight, *recipe)));
    const std::vector<float> want_dw = product(transposed_operand(qdy, dy, TensorRole::gradient, *recipe),
                                               transposed_operand(qx, x, TensorRole::activation, *recipe));
    ASSERT_TRUE(testing::has_nonzero(want_out));
    ASSERT_TRUE(testing::has_nonzero(want_dx));
    ASSERT_TRUE(testing::has_nonzero(want_dw));
    EXPECT_EQ(out, want_out) << "forward, step " << step;
    EXPECT_EQ(dx, want_dx) << "input gradient, step " << step;
    EXPECT_EQ(dw, want_dw) << "weight gradient, step " << step;

    expect_same_state(state.activation, act, "activation");
    expect_same_state(state.weight, wgt, "weight");
    expect_same_state(state.gradient, grad, "gradient");
  }
  EXPECT_EQ(fp8_gemms, 9);
  if (GetParam() == RecipeKind::delayed) {
    // History of the activation amaxes, most recent first, and the scale from its maximum.
    EXPECT_EQ(state.activation.updates, 3);
    const float newest = state.activation.amax_history[0];
    EXPECT_GT(newest, state.activation.amax_history[1]);
    EXPECT_EQ(state.activation.scale, 448.0f / newest);
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8Linear,
                         ::testing::Values(RecipeKind::delayed, RecipeKind::current, RecipeKind::static_scale,
                                           RecipeKind::block),
                         [](const auto& p) { return std::string(recipe_name(p.param)); });

TEST(Fp8Linear, FrozenScalingLeavesTheStateAlone) {
  const int64_t N = 16, C = 16, OC = 16;
  DelayedScaling recipe(4);
  auto backend = make_cpu_backend();
  const std::vector<float> weight = testing::random_normal(OC * C, 3, 0.05f);
  const std::vector<float> x = testing::random_normal(N * C, 4);
  Fp8LinearState state{recipe.initial_state(), recipe.initial_state(), recipe.initial_state()};
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
  exec.recipe = &recipe;
  exec.state = &state;
  std::unique_ptr<WeightCopy> copy;
  backend->prepare_weight(copy, weight.data(), OC, C, exec);
  std::vector<float> out(N * OC);
  exec.update_scaling = false;
  backend->linear_forward(out.data(), x.data(), weight.data(), copy.get(), nullptr, N, C, OC, exec);
  EXPECT_EQ(state.activation.updates, 0);
  exec.update_scaling = true;
  backend->linear_forward(out.data(), x.data(), weight.data(), copy.get(), nullptr, N, C, OC, exec);
  EXPECT_EQ(state.activation.updates, 1);
}

}  // namespace
}  // namespace octet
