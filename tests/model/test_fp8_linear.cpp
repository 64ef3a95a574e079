// FP8 emulation: every GEMM of an FP8 linear layer equals the numerics core's emulated FP8 GEMM on operands
// quantized independently here, and the layer's scaling state evolves exactly as the recipe defines.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compare.h"
#include "errors.h"
#include "octet/backend/cpu_backend.h"
#include "octet/check.h"
#include "octet/numerics/fp8_gemm.h"
#include "random.h"
#include "telemetry_compare.h"

namespace octet {
namespace {

using testing::error_of;
using testing::expect_same_telemetry;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

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
  std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
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
    backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                            ConstTensorView(weight.data(), {OC, C}), copy.get(), {.bias = bias.data()}, exec,
                            {&input_codes});
    backend->linear_backward(TensorView(dx.data(), {N, C}), TensorView(dw.data(), {OC, C}), db.data(),
                             ConstTensorView(dy.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                             ConstTensorView(weight.data(), {OC, C}), copy.get(), exec, input_codes.get(),
                             {&gradient_codes});

    const QuantizedTensor qx = quantize(x, N, C, Dtype::e4m3, TensorRole::activation, *recipe, act);
    const QuantizedTensor qdy = quantize(dy, N, OC, Dtype::e5m2, TensorRole::gradient, *recipe, grad);
    // The float32 products, the forward's plus the bias rounded to BF16; nothing rounded afterwards.
    std::vector<float> want_out = product(qx, qw);
    const std::vector<float> bias_bf16 = bf16(bias);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < OC; ++o)
        want_out[static_cast<size_t>(n * OC + o)] += bias_bf16[static_cast<size_t>(o)];
    }
    const std::vector<float> want_dx =
        product(qdy, transposed_operand(qw, weight, TensorRole::weight, *recipe));
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

std::unique_ptr<ScalingRecipe> make_recipe(RecipeKind kind) {
  switch (kind) {
    case RecipeKind::delayed:
      return std::make_unique<DelayedScaling>(4);
    case RecipeKind::current:
      return std::make_unique<CurrentScaling>();
    case RecipeKind::static_scale:
      return std::make_unique<StaticScaling>(64.0f);
    default:
      return std::make_unique<BlockScaling>();
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// GELU's backward fused with the gradient cast and bias gradient of the layer it feeds (activation_backward
// with cast_for, then linear_backward taking the cast, with a null dbias and, where the cast is all it reads,
// a dout without data) gives the very bits of the unfused ops (activation_backward without cast_for, then
// linear_backward casting and summing itself):
// gradients, bias gradient, scaling states, counts and telemetry.
TEST_P(Fp8Linear, GeluBackwardCastEqualsTheUnfusedOps) {
  const int64_t N = 32, C = 48, OC = 64;
  const std::unique_ptr<ScalingRecipe> recipe = make_recipe(GetParam());
  auto backend = make_cpu_backend();
  const std::vector<float> weight = testing::random_normal(OC * C, 1, 0.05f);
  const std::vector<float> bias = testing::random_normal(OC, 2, 0.1f);
  // All three GEMMs in FP8, and the float32 gradient read by a BF16 GEMM too.
  for (const GemmMode weight_gradient : {GemmMode::fp8, GemmMode::bf16}) {
    SCOPED_TRACE(std::string("weight gradient ") + std::string(gemm_mode_name(weight_gradient)));
    struct Side {
      Fp8LinearState state;
      Fp8LinearTelemetry telemetry;
      LinearExecution exec;
      std::unique_ptr<WeightCopy> copy;
      std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
      int64_t fp8_gemms = 0, other_gemms = 0, saturated = 0, underflowed = 0;
      std::vector<float> dx, dw, db, dpre;
    };
    Side unfused, fused;
    for (Side* side : {&unfused, &fused}) {
      side->state = {recipe->initial_state(), recipe->initial_state(), recipe->initial_state()};
      LinearExecution& e = side->exec;
      e.forward = e.input_gradient = GemmMode::fp8;
      e.weight_gradient = weight_gradient;
      e.recipe = recipe.get();
      e.state = &side->state;
      e.telemetry = &side->telemetry;
      e.measure_sqnr = true;
      e.fp8_gemms = &side->fp8_gemms;
      e.other_gemms = &side->other_gemms;
      e.saturated = &side->saturated;
      e.underflowed = &side->underflowed;
      side->dw.assign(static_cast<size_t>(OC * C), 0.0f);
      side->db.assign(static_cast<size_t>(OC), 0.0f);
      backend->prepare_weight(side->copy, weight.data(), OC, C, e);
    }
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> x = testing::random_normal(N * C, 10 + step, 1.0f);
      const std::vector<float> pre = testing::random_normal(N * OC, 30 + step, 3.0f);
      std::vector<float> dy = testing::random_normal(N * OC, 20 + step, 1e-3f / static_cast<float>(1 + step));
      for (size_t i = 5; i < dy.size(); i += 13) dy[i] *= 1e-9f;  // underflows
      std::vector<float> out(N * OC);
      for (Side* side : {&unfused, &fused}) {
        side->dx.assign(static_cast<size_t>(N * C), 0.0f);
        side->dpre.assign(static_cast<size_t>(N * OC), -1.0f);
        backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                                ConstTensorView(weight.data(), {OC, C}), side->copy.get(),
                                {.bias = bias.data()}, side->exec, {&side->input_codes});
      }
      backend->activation_backward(Activation::gelu, TensorView(unfused.dpre.data(), {N * OC}),
                                   ConstTensorView(pre.data(), {N * OC}),
                                   ConstTensorView(dy.data(), {N * OC}), nullptr, {});
      backend->linear_backward(TensorView(unfused.dx.data(), {N, C}), TensorView(unfused.dw.data(), {OC, C}),
                               unfused.db.data(), ConstTensorView(unfused.dpre.data(), {N, OC}),
                               ConstTensorView(x.data(), {N, C}), ConstTensorView(weight.data(), {OC, C}),
                               unfused.copy.get(), unfused.exec, unfused.input_codes.get(),
                               {&unfused.gradient_codes});
      const bool suffices = gradient_cast_suffices(fused.exec);
      EXPECT_EQ(suffices, weight_gradient == GemmMode::fp8 && GetParam() != RecipeKind::block);
      float* kept = suffices ? nullptr : fused.dpre.data();
      backend->activation_backward(Activation::gelu, TensorView(kept, {N, OC}),
                                   ConstTensorView(pre.data(), {N, OC}), ConstTensorView(dy.data(), {N, OC}),
                                   fused.db.data(), {&fused.exec, &fused.gradient_codes});
      ASSERT_NE(fused.gradient_codes, nullptr);
      const Fp8TensorView cast = fused.gradient_codes->view();
      EXPECT_EQ(cast.shape, Shape({N, OC}));
      EXPECT_EQ(cast.role, TensorRole::gradient);
      EXPECT_EQ(cast.state, &fused.state.gradient);
      EXPECT_EQ(cast.format, Dtype::e5m2);
      backend->linear_backward(TensorView(fused.dx.data(), {N, C}), TensorView(fused.dw.data(), {OC, C}),
                               nullptr, ConstTensorView(kept, {N, OC}), ConstTensorView(x.data(), {N, C}),
                               ConstTensorView(weight.data(), {OC, C}), fused.copy.get(), fused.exec,
                               fused.input_codes.get(), {&fused.gradient_codes, true});

      ASSERT_TRUE(testing::has_nonzero(unfused.dx));
      ASSERT_TRUE(testing::has_nonzero(unfused.db));
      EXPECT_TRUE(same_bits(fused.dx, unfused.dx)) << "input gradient, step " << step;
      EXPECT_TRUE(same_bits(fused.dw, unfused.dw)) << "weight gradient, step " << step;
      EXPECT_TRUE(same_bits(fused.db, unfused.db)) << "bias gradient, step " << step;
      if (suffices) {
        EXPECT_EQ(fused.dpre, std::vector<float>(static_cast<size_t>(N * OC), -1.0f)) << "dpre not written";
      } else {
        EXPECT_TRUE(same_bits(fused.dpre, unfused.dpre)) << "dpre, step " << step;
      }
      expect_same_state(fused.state.activation, unfused.state.activation, "activation");
      expect_same_state(fused.state.weight, unfused.state.weight, "weight");
      expect_same_state(fused.state.gradient, unfused.state.gradient, "gradient");
      EXPECT_EQ(fused.state.gradient.degenerate_amax, unfused.state.gradient.degenerate_amax);
      EXPECT_EQ(fused.state.gradient.last_amax, unfused.state.gradient.last_amax);
      expect_same_telemetry(fused.telemetry.gradient, unfused.telemetry.gradient, "gradient telemetry");
      expect_same_telemetry(fused.telemetry.activation, unfused.telemetry.activation, "activation telemetry");
      EXPECT_EQ(fused.fp8_gemms, unfused.fp8_gemms);
      EXPECT_EQ(fused.other_gemms, unfused.other_gemms);
      EXPECT_EQ(fused.saturated, unfused.saturated);
      EXPECT_EQ(fused.underflowed, unfused.underflowed);
    }
    EXPECT_EQ(fused.telemetry.gradient.casts, 3);
    EXPECT_GT(fused.telemetry.gradient.underflowed, 0);
    EXPECT_GT(fused.telemetry.gradient.noise_energy, 0.0);
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
  std::unique_ptr<Fp8Tensor> input_codes;
  backend->prepare_weight(copy, weight.data(), OC, C, exec);
  std::vector<float> out(N * OC);
  exec.update_scaling = false;
  backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                          ConstTensorView(weight.data(), {OC, C}), copy.get(), {}, exec, {&input_codes});
  EXPECT_EQ(state.activation.updates, 0);
  exec.update_scaling = true;
  backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                          ConstTensorView(weight.data(), {OC, C}), copy.get(), {}, exec, {&input_codes});
  EXPECT_EQ(state.activation.updates, 1);
}

// The hand-over between the ops of FP8 layers is explicit and checked: a linear op reads an FP8 tensor only
// where it holds the cast of that layer's own operand, of the right shape; it needs a slot for every cast
// it reads; it takes a producer's gradient cast without a second bias sum, and its own cast needs the float
// values.
TEST(Fp8Linear, TheFp8TensorsHandedOverAreCheckedAgainstTheLayer) {
  const int64_t N = 16, C = 16, OC = 32;
  DelayedScaling recipe(4);
  auto backend = make_cpu_backend();
  const std::vector<float> weight = testing::random_normal(OC * C, 3, 0.05f);
  const std::vector<float> x = testing::random_normal(N * C, 4);
  const std::vector<float> pre = testing::random_normal(N * OC, 5);
  const std::vector<float> dy = testing::random_normal(N * OC, 6, 1e-2f);
  Fp8LinearState state_a{recipe.initial_state(), recipe.initial_state(), recipe.initial_state()};
  Fp8LinearState state_b = state_a;
  LinearExecution a, b;
  for (auto [exec, state] : {std::pair{&a, &state_a}, std::pair{&b, &state_b}}) {
    exec->forward = exec->input_gradient = exec->weight_gradient = GemmMode::fp8;
    exec->recipe = &recipe;
    exec->state = state;
  }
  std::unique_ptr<WeightCopy> copy_a, copy_b;
  std::unique_ptr<Fp8Tensor> input_a, input_b, gradient_a, gradient_b, none;
  std::vector<float> out(N * OC), dpre(N * OC), dx(N * C), dw(OC * C, 0.0f), db(OC, 0.0f);
  const ConstTensorView w(weight.data(), {OC, C});
  for (auto [exec, copy, input] : {std::tuple{&a, &copy_a, &input_a}, std::tuple{&b, &copy_b, &input_b}}) {
    backend->prepare_weight(*copy, weight.data(), OC, C, *exec);
    backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}), w,
                            copy->get(), {}, *exec, {input});
  }
  // Each forward kept its own input's cast, described by its view.
  const Fp8TensorView kept = input_a->view();
  EXPECT_EQ(kept.shape, Shape({N, C}));
  EXPECT_EQ(kept.role, TensorRole::activation);
  EXPECT_EQ(kept.state, &state_a.activation);
  EXPECT_NE(kept.codes, nullptr);
  EXPECT_NE(kept.scale_inv, nullptr);
  auto backward = [&](LinearExecution& exec, const WeightCopy* copy, const Fp8Tensor* input, float* dbias,
                      const float* dout, Fp8Operand gradient) {
    backend->linear_backward(TensorView(dx.data(), {N, C}), TensorView(dw.data(), {OC, C}), dbias,
                             ConstTensorView(dout, {N, OC}), ConstTensorView(x.data(), {N, C}), w, copy, exec,
                             input, gradient);
  };
  // An FP8 forward and backward need a slot for each cast.
  EXPECT_TRUE(contains(error_of([&] {
                         backend->linear_forward(TensorView(out.data(), {N, OC}),
                                                 ConstTensorView(x.data(), {N, C}), w, copy_a.get(), {}, a);
                       }),
                       "a slot for the FP8 input's cast"));
  EXPECT_TRUE(contains(error_of([&] { backward(a, copy_a.get(), input_a.get(), nullptr, dy.data(), {}); }),
                       "a slot for the FP8 output gradient's cast"));
  // The weight gradient reads this layer's input cast, not another layer's, and not none.
  EXPECT_TRUE(contains(
      error_of([&] { backward(a, copy_a.get(), input_b.get(), nullptr, dy.data(), {&gradient_a}); }),
      "linear_backward: the FP8 cast of this layer's input [16, 16]"));
  EXPECT_TRUE(contains(error_of([&] { backward(a, copy_a.get(), nullptr, nullptr, dy.data(), {&gradient_a}); }),
                       "linear_backward: the FP8 cast of this layer's input [16, 16]"));
  // A producer's gradient cast made for b does not serve a.
  backend->activation_backward(Activation::gelu, TensorView(nullptr, {N, OC}), ConstTensorView(pre.data(), {N, OC}),
                               ConstTensorView(dy.data(), {N, OC}), db.data(), {&b, &gradient_b});
  EXPECT_TRUE(contains(
      error_of([&] { backward(a, copy_a.get(), input_a.get(), nullptr, nullptr, {&gradient_b, true}); }),
      "linear_backward: the FP8 cast of this layer's output gradient [16, 32]"));
  backward(b, copy_b.get(), input_b.get(), nullptr, nullptr, {&gradient_b, true});
  // Without a producer's cast, the float32 gradient is needed; with one, a second bias sum is refused.
  EXPECT_TRUE(contains(
      error_of([&] { backward(a, copy_a.get(), input_a.get(), nullptr, nullptr, {&gradient_a}); }),
      "the float32 output gradient"));
  backend->activation_backward(Activation::gelu, TensorView(dpre.data(), {N, OC}),
                               ConstTensorView(pre.data(), {N, OC}), ConstTensorView(dy.data(), {N, OC}),
                               nullptr, {&a, &gradient_a});
  EXPECT_TRUE(contains(
      error_of([&] { backward(a, copy_a.get(), input_a.get(), db.data(), dpre.data(), {&gradient_a, true}); }),
      "no second bias sum"));
  backward(a, copy_a.get(), input_a.get(), nullptr, dpre.data(), {&gradient_a, true});
  // Recomputing a forward needs the codes of x, which only a layer that keeps them has.
  EXPECT_TRUE(contains(error_of([&] {
                         backend->linear_recompute(TensorView(out.data(), {N, OC}), w, copy_a.get(), {}, a,
                                                   *input_a);
                       }),
                       "whose input codes were kept"));
  // A consumer whose backward GEMMs are not FP8 casts nothing: there is nothing to fuse.
  LinearExecution wide;
  wide.forward = wide.input_gradient = wide.weight_gradient = GemmMode::bf16;
  EXPECT_FALSE(casts_gradient(wide));
  EXPECT_FALSE(gradient_cast_suffices(wide));
  EXPECT_THROW(backend->activation_backward(Activation::gelu, TensorView(dpre.data(), {N, OC}),
                                            ConstTensorView(pre.data(), {N, OC}),
                                            ConstTensorView(dy.data(), {N, OC}), nullptr, {&wide, &none}),
               Error);
}

}  // namespace
}  // namespace octet
