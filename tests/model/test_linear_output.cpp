// What a linear layer's GEMMs write on the CPU reference (backend.h): in every GEMM mode the forward output
// is the GEMM's float32 result plus the bias, the bias rounded first to the GEMM's 16-bit type (BF16 for FP8
// GEMMs), and the input gradient is the GEMM's float32 result; neither is rounded afterwards. The operands
// are exact in every format involved (BF16, FP16, E4M3, E5M2) and their sums exact in float32 but not in
// BF16 or FP16, so each output must be one known value, and a rounding of the output or an unrounded bias
// would show. A head whose GEMMs are all BF16 rounds its logits to BF16 in the model's lm_head_chunk
// (src/model/lm_head.h), and only there.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "lm_head.h"
#include "octet/backend/cpu_backend.h"
#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet {
namespace {

constexpr int64_t N = 2, C = 2, OC = 2;
constexpr float kSmall = 0.03125f;  // 2^-5: 64 + 2^-5 needs 12 significant bits (BF16 has 8, FP16 11)
// x [N, C], W [OC, C] and dy [N, OC]: powers of two and their sums, exact in every format the GEMMs use.
const std::vector<float> kInput = {64.0f, kSmall, kSmall, -64.0f};
const std::vector<float> kWeight = {1.0f, 1.0f, 1.0f, -1.0f};
const std::vector<float> kOutputGradient = {64.0f, kSmall, -kSmall, 64.0f};
// bias[0] = 1/2 + 2^-10 + 2^-16: exact in float32; in FP16 1/2 + 2^-10 (2^-16 is below half of its step,
// 2^-11); in BF16 1/2 (2^-10 + 2^-16 is below half of its step, 2^-8).
const float kBias0 = 0.5f + std::ldexp(1.0f, -10) + std::ldexp(1.0f, -16);
const std::vector<float> kBias = {kBias0, -0.25f};

// The bias as each mode's GEMM adds it, written out rather than computed by octet's rounding.
float rounded_bias0(GemmMode mode) {
  switch (mode) {
    case GemmMode::f32:
      return kBias0;
    case GemmMode::f16:
      return 0.5f + std::ldexp(1.0f, -10);
    case GemmMode::bf16:
    case GemmMode::fp8:
      return 0.5f;
  }
  return kBias0;
}

// The 16-bit type a mode's GEMM works in: what an output rounded as before would have been rounded to.
Dtype sixteen_bit_type(GemmMode mode) {
  return mode == GemmMode::f16 ? Dtype::f16 : Dtype::bf16;
}

// out = x W^T + bias and dinp = dy W in float64 from the exact values (every one exact in float32 too).
std::vector<float> expected_output(GemmMode mode) {
  const float bias[OC] = {rounded_bias0(mode), kBias[1]};
  std::vector<float> out(static_cast<size_t>(N * OC));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) {
      double sum = bias[o];
      for (int64_t c = 0; c < C; ++c) sum += static_cast<double>(kInput[n * C + c]) * kWeight[o * C + c];
      out[static_cast<size_t>(n * OC + o)] = static_cast<float>(sum);
      EXPECT_EQ(static_cast<double>(out[static_cast<size_t>(n * OC + o)]), sum) << "not exact in float32";
    }
  }
  return out;
}

std::vector<float> expected_input_gradient() {
  std::vector<float> dinp(static_cast<size_t>(N * C));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0.0;
      for (int64_t o = 0; o < OC; ++o)
        sum += static_cast<double>(kOutputGradient[n * OC + o]) * kWeight[o * C + c];
      dinp[static_cast<size_t>(n * C + c)] = static_cast<float>(sum);
    }
  }
  return dinp;
}

class LinearOutput : public ::testing::TestWithParam<GemmMode> {};

TEST_P(LinearOutput, IsTheFloat32ProductPlusTheRoundedBias) {
  const GemmMode mode = GetParam();
  auto backend = make_cpu_backend();
  // FP8: a static scale of 1, so that the casts keep the values and the dequantizing scales are exact.
  const StaticScaling recipe(1.0f);
  Fp8LinearState state{recipe.initial_state(), recipe.initial_state(), recipe.initial_state()};
  int64_t fp8_gemms = 0;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = mode;
  exec.fp8_gemms = &fp8_gemms;
  if (mode == GemmMode::fp8) {
    exec.recipe = &recipe;
    exec.state = &state;
  }
  std::unique_ptr<WeightCopy> copy;
  std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
  if (mode != GemmMode::f32) backend->prepare_weight(copy, kWeight.data(), OC, C, exec);

  std::vector<float> out(static_cast<size_t>(N * OC), NAN);
  backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(kInput.data(), {N, C}),
                          ConstTensorView(kWeight.data(), {OC, C}), copy.get(), {.bias = kBias.data()}, exec,
                          {&input_codes});
  std::vector<float> dinp(static_cast<size_t>(N * C), NAN), dweight(static_cast<size_t>(OC * C), 0.0f);
  backend->linear_backward(TensorView(dinp.data(), {N, C}), TensorView(dweight.data(), {OC, C}), nullptr,
                           ConstTensorView(kOutputGradient.data(), {N, OC}),
                           ConstTensorView(kInput.data(), {N, C}), ConstTensorView(kWeight.data(), {OC, C}),
                           copy.get(), exec, input_codes.get(), {&gradient_codes});
  EXPECT_EQ(fp8_gemms, mode == GemmMode::fp8 ? 3 : 0);

  const std::vector<float> want_out = expected_output(mode);
  const std::vector<float> want_dinp = expected_input_gradient();
  ASSERT_TRUE(testing::has_nonzero(want_out));
  EXPECT_EQ(out, want_out) << "forward in " << gemm_mode_name(mode);
  EXPECT_EQ(dinp, want_dinp) << "input gradient in " << gemm_mode_name(mode);

  // What makes the comparisons above prove something: the values are not those of a rounded output or an
  // unrounded bias.
  const Dtype narrow = sixteen_bit_type(mode);
  EXPECT_NE(round_to(narrow, want_out[0]), want_out[0])
      << "out[0] is representable in " << dtype_name(narrow);
  EXPECT_NE(round_to(narrow, want_dinp[0]), want_dinp[0])
      << "dinp[0] is representable in " << dtype_name(narrow);
  if (mode != GemmMode::f32) {
    EXPECT_NE(rounded_bias0(mode), kBias0) << "the bias is representable in " << dtype_name(narrow);
    EXPECT_EQ(round_to(narrow, kBias0), rounded_bias0(mode)) << "the written-out rounding of the bias";
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, LinearOutput,
                         ::testing::Values(GemmMode::f32, GemmMode::bf16, GemmMode::f16, GemmMode::fp8),
                         [](const auto& test_info) { return std::string(gemm_mode_name(test_info.param)); });

// The LM head's chunk with BF16 GEMMs: the logits are rounded to BF16 before the loss (the GPU's head writes
// them in BF16), and the losses and gradients are what the ops give from the rounded logits; not what they
// give from linear_forward's float32 logits.
TEST(LmHeadChunk, Bf16HeadRoundsItsLogitsToBf16) {
  const int64_t n = 2, Vp = 4, V = 3;
  auto backend = make_cpu_backend();
  // Logits 4 + 2^-7, 4 - 2^-7, 2 + 2^-8 and 0 in row 0: BF16 keeps 4, 4 and 2.
  const std::vector<float> inp = {4.0f, std::ldexp(1.0f, -7), 1.0f, 0.5f};
  const std::vector<float> weight = {1.0f, 1.0f, 1.0f, -1.0f, 0.5f, 0.5f, 0.0f, 0.0f};
  const std::vector<int32_t> targets = {0, 2};
  const float dloss = 0.5f;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::bf16;
  ASSERT_TRUE(logits_in_bf16(exec));
  std::unique_ptr<WeightCopy> copy;
  backend->prepare_weight(copy, weight.data(), Vp, C, exec);

  std::vector<float> losses(n, NAN), logits(static_cast<size_t>(n * Vp), NAN),
      dinp(static_cast<size_t>(n * C));
  std::vector<float> dweight(static_cast<size_t>(Vp * C), 0.0f);
  EXPECT_EQ(lm_head_logits_type(*backend, exec), Dtype::f32) << "the CPU keeps its logits in float32";
  lm_head_chunk(*backend,
                {.losses = losses.data(),
                 .logits = logits.data(),
                 .targets = targets.data(),
                 .dinp = TensorView(dinp.data(), {n, C}),
                 .dweight = TensorView(dweight.data(), {Vp, C}),
                 .inp = ConstTensorView(inp.data(), {n, C}),
                 .weight = ConstTensorView(weight.data(), {Vp, C}),
                 .copy = copy.get(),
                 .input = {},
                 .gradient = {},
                 .V = V,
                 .dloss = dloss},
                exec);

  // The same ops by hand, from the float32 logits with and without the rounding.
  struct Outputs {
    std::vector<float> losses, dinp, dweight;
  };
  const auto by_hand = [&](bool round) {
    Outputs o{std::vector<float>(n), std::vector<float>(static_cast<size_t>(n * C)),
              std::vector<float>(static_cast<size_t>(Vp * C), 0.0f)};
    std::vector<float> z(static_cast<size_t>(n * Vp));
    backend->linear_forward(TensorView(z.data(), {n, Vp}), ConstTensorView(inp.data(), {n, C}),
                            ConstTensorView(weight.data(), {Vp, C}), copy.get(), {}, exec);
    EXPECT_NE(z[0], round_to(Dtype::bf16, z[0])) << "a logit exact in BF16 shows no rounding";
    if (round) backend->round_in_place(z.data(), n * Vp, Dtype::bf16);
    backend->softmax_cross_entropy(o.losses.data(), TensorView(z.data(), {n, Vp}), targets.data(), V, dloss);
    backend->linear_backward(TensorView(o.dinp.data(), {n, C}), TensorView(o.dweight.data(), {Vp, C}),
                             nullptr, ConstTensorView(z.data(), {n, Vp}), ConstTensorView(inp.data(), {n, C}),
                             ConstTensorView(weight.data(), {Vp, C}), copy.get(), exec);
    return o;
  };
  const Outputs rounded = by_hand(true);
  const Outputs unrounded = by_hand(false);
  EXPECT_EQ(losses, rounded.losses);
  EXPECT_EQ(dinp, rounded.dinp);
  EXPECT_EQ(dweight, rounded.dweight);
  EXPECT_NE(losses, unrounded.losses) << "the logits' rounding changed no loss: the test proves nothing";
  ASSERT_TRUE(testing::has_nonzero(losses));
}

// Every other head (here FP16 GEMMs, and a BF16 head whose weight gradient is float32) keeps float32 logits.
TEST(LmHeadChunk, OtherHeadsKeepFloat32Logits) {
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::f16;
  EXPECT_FALSE(logits_in_bf16(exec));
  exec.forward = exec.input_gradient = GemmMode::bf16;
  exec.weight_gradient = GemmMode::f32;
  EXPECT_FALSE(logits_in_bf16(exec));
}

TEST(RoundInPlace, RoundsToNearestEvenAndRefusesOtherTypes) {
  auto backend = make_cpu_backend();
  // 1 + 2^-8 is a BF16 tie (to even: 1), 1 + 3 * 2^-8 one too (to 1 + 2^-6); FP16 keeps both.
  std::vector<float> x = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3.0f * std::ldexp(1.0f, -8), -0.0f, NAN};
  std::vector<float> y = x;
  backend->round_in_place(x.data(), static_cast<int64_t>(x.size()), Dtype::bf16);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::signbit(x[2]) && x[2] == 0.0f);
  EXPECT_TRUE(std::isnan(x[3]));
  backend->round_in_place(y.data(), 2, Dtype::f16);
  EXPECT_EQ(y[0], 1.0f + std::ldexp(1.0f, -8));
  EXPECT_EQ(y[1], 1.0f + 3.0f * std::ldexp(1.0f, -8));
  EXPECT_THROW(backend->round_in_place(y.data(), 2, Dtype::e4m3), Error);
}

}  // namespace
}  // namespace octet
