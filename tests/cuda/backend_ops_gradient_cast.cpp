// Backend::activation_backward with a cast target on the CUDA backend, as the model drives it: a layer's
// prepare_weight and linear_forward, then GELU's backward fused with the layer's gradient cast and bias
// gradient, then the layer's linear_backward taking that cast (with a null dbias, and a dout without data
// where the cast is all it reads). Held against the unfused ops on a second layer with the same start:
// activation_backward without one, then a
// linear_backward that casts its own dout and sums its own bias gradient. Over several steps (the delayed
// recipe's history rolls over), every recipe the GPU runs, HYBRID and all-E4M3, and layers whose backward
// GEMMs are only partly FP8: the input and weight gradients and the kept float32 gradient must be the same
// bits, the scaling states and counts the same, the cast telemetry the same; the bias gradient, summed in
// another order, within float32 tolerance.
//
// And linear_backward's own gradient cast, which sums the bias gradient in the same pass over dout where the
// recipe lets the cast be fused (delayed and static scaling, no SQNR): a layer given dbias against one given
// none (whose cast is the plain cast_amax), over the same configurations and a shape whose rows and columns
// end in partial tiles: the input and weight gradients the same bits, the scaling states, counts and
// telemetry the same, the bias gradient within float32 tolerance of the float64 column sums, and the same
// bits again from a third layer (determinism). Every test skips without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "octet/check.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Activation;
using octet::Backend;
using octet::ConstTensorView;
using octet::Normalization;
using octet::TensorView;
using octet::Dtype;
using octet::GemmMode;
using octet::LinearExecution;
using octet::ScalingRecipe;
using octet::ScalingState;

// The consumer layer: input [N, C], output [N, OC], the GELU over its output gradient [N, OC].
struct Shape {
  int64_t N, C, OC;
  std::string label() const {
    return "[" + std::to_string(N) + ", " + std::to_string(C) + "] -> " + std::to_string(OC);
  }
};
constexpr Shape kShape{64, 32, 96};
constexpr int64_t kN = kShape.N, kC = kShape.C, kOC = kShape.OC;
constexpr int kSteps = 6;

struct Config {
  std::string name;
  std::shared_ptr<const ScalingRecipe> recipe;
  GemmMode input_gradient = GemmMode::fp8;
  GemmMode weight_gradient = GemmMode::fp8;
  Dtype gradient_format = Dtype::e5m2;
  bool sqnr = false;
};

// Host inputs of one step: activations and gradients whose size changes from step to step, so that delayed
// scaling lags behind and saturates, with planted values far below the rest that underflow.
struct StepInputs {
  std::vector<float> weight, bias, inp, pre, dout;
};

StepInputs step_inputs(size_t step, const Shape& shape = kShape) {
  const float dout_std[] = {1e-2f, 1e-3f, 5e-2f, 2e-3f, 1e-2f, 3e-2f};
  const uint64_t seed = seed_of("gradient cast", "step " + std::to_string(step));
  const auto [N, C, OC] = shape;
  StepInputs in{octet::testing::random_normal(OC * C, seed, 0.5f),
                octet::testing::random_normal(OC, seed + 1, 0.1f),
                octet::testing::random_normal(N * C, seed + 2, 1.0f),
                octet::testing::random_normal(N * OC, seed + 3, 3.0f),
                octet::testing::random_normal(N * OC, seed + 4, dout_std[step % 6])};
  for (size_t i = 6; i < in.dout.size(); i += 13) in.dout[i] *= 1e-11f;
  return in;
}

// One layer with its state, counters and buffers on the backend.
struct Layer {
  Shape shape;
  octet::Fp8LinearState state;
  octet::Fp8LinearTelemetry telemetry;
  LinearExecution exec;
  std::unique_ptr<octet::WeightCopy> copy;
  std::unique_ptr<octet::Fp8Tensor> input_codes, gradient_codes;
  int64_t fp8_gemms = 0, other_gemms = 0, saturated = 0, underflowed = 0;
  GuardedBuffer out, dpre, dinp, dweight, dbias;

  Layer(Backend& backend, const Config& config, const Shape& s = kShape)
      : shape(s),
        out(backend, as_bytes(nan_filled(s.N * s.OC))),
        dpre(backend, as_bytes(nan_filled(s.N * s.OC))),
        dinp(backend, as_bytes(nan_filled(s.N * s.C))),
        dweight(backend, as_bytes(std::vector<float>(s.OC * s.C, 0.0f))),
        dbias(backend, as_bytes(std::vector<float>(s.OC, 0.0f))) {
    exec.forward = GemmMode::fp8;
    exec.input_gradient = config.input_gradient;
    exec.weight_gradient = config.weight_gradient;
    exec.recipe = config.recipe.get();
    exec.formats.gradient = config.gradient_format;
    state = {config.recipe->initial_state(), config.recipe->initial_state(), config.recipe->initial_state()};
    exec.state = &state;
    exec.telemetry = &telemetry;
    exec.measure_sqnr = config.sqnr;
    exec.fp8_gemms = &fp8_gemms;
    exec.other_gemms = &other_gemms;
    exec.saturated = &saturated;
    exec.underflowed = &underflowed;
  }
};

// The step's inputs on the backend, shared by both layers.
struct Inputs {
  GuardedBuffer weight, bias, inp, pre, dout;
  Inputs(Backend& backend, const StepInputs& in)
      : weight(backend, as_bytes(in.weight)),
        bias(backend, as_bytes(in.bias)),
        inp(backend, as_bytes(in.inp)),
        pre(backend, as_bytes(in.pre)),
        dout(backend, as_bytes(in.dout)) {}
};

void forward(Backend& backend, Layer& layer, Inputs& in) {
  const auto [N, C, OC] = layer.shape;
  backend.prepare_weight(layer.copy, in.weight.floats(), OC, C, layer.exec);
  backend.linear_forward(TensorView(layer.out.floats(), {N, OC}), ConstTensorView(in.inp.floats(), {N, C}),
                         ConstTensorView(in.weight.floats(), {OC, C}), layer.copy.get(),
                         {.bias = in.bias.floats()}, layer.exec, {&layer.input_codes});
}

void unfused_backward(Backend& backend, Layer& layer, Inputs& in) {
  const auto [N, C, OC] = layer.shape;
  backend.activation_backward(Activation::gelu, TensorView(layer.dpre.floats(), {N * OC}),
                              ConstTensorView(in.pre.floats(), {N * OC}),
                              ConstTensorView(in.dout.floats(), {N * OC}), nullptr, {});
  backend.linear_backward(TensorView(layer.dinp.floats(), {N, C}),
                          TensorView(layer.dweight.floats(), {OC, C}), layer.dbias.floats(),
                          ConstTensorView(layer.dpre.floats(), {N, OC}),
                          ConstTensorView(in.inp.floats(), {N, C}),
                          ConstTensorView(in.weight.floats(), {OC, C}), layer.copy.get(), layer.exec,
                          layer.input_codes.get(), {&layer.gradient_codes});
}

void fused_backward(Backend& backend, Layer& layer, Inputs& in) {
  const auto [N, C, OC] = layer.shape;
  float* kept = octet::gradient_cast_suffices(layer.exec) ? nullptr : layer.dpre.floats();
  backend.activation_backward(Activation::gelu, TensorView(kept, {N, OC}),
                              ConstTensorView(in.pre.floats(), {N, OC}),
                              ConstTensorView(in.dout.floats(), {N, OC}), layer.dbias.floats(),
                              {&layer.exec, &layer.gradient_codes});
  ASSERT_NE(layer.gradient_codes, nullptr);
  const octet::Fp8TensorView cast = layer.gradient_codes->view();
  EXPECT_EQ(cast.shape, octet::Shape({N, OC}));
  EXPECT_EQ(cast.role, octet::TensorRole::gradient);
  EXPECT_EQ(cast.state, &layer.state.gradient);
  EXPECT_NE(cast.codes, nullptr);
  EXPECT_NE(cast.codes_transposed, nullptr);
  backend.linear_backward(TensorView(layer.dinp.floats(), {N, C}),
                          TensorView(layer.dweight.floats(), {OC, C}), nullptr,
                          ConstTensorView(kept, {N, OC}), ConstTensorView(in.inp.floats(), {N, C}),
                          ConstTensorView(in.weight.floats(), {OC, C}), layer.copy.get(), layer.exec,
                          layer.input_codes.get(), {&layer.gradient_codes, true});
}

std::vector<float> read(const GuardedBuffer& buffer, const std::string& name) {
  bool guards_ok = false;
  std::vector<float> values = as_floats(buffer.download(&guards_ok));
  EXPECT_TRUE(guards_ok) << "the guard bytes around '" << name << "' were overwritten";
  return values;
}

::testing::AssertionResult same_scaling(const ScalingState& a, const ScalingState& e, const char* operand) {
  const auto bits = [](float x) { return std::bit_cast<uint32_t>(x); };
  bool same = bits(a.scale) == bits(e.scale) && bits(a.scale_inv) == bits(e.scale_inv) &&
              bits(a.last_amax) == bits(e.last_amax) && a.updates == e.updates &&
              a.degenerate_amax == e.degenerate_amax && a.amax_history.size() == e.amax_history.size();
  for (size_t i = 0; same && i < a.amax_history.size(); ++i)
    same = bits(a.amax_history[i]) == bits(e.amax_history[i]);
  if (same) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << operand << ": scale " << a.scale << " against " << e.scale << ", last amax " << a.last_amax
         << " against " << e.last_amax << ", updates " << a.updates << " against " << e.updates;
}

void expect_same_telemetry(const octet::CastTelemetry& a, const octet::CastTelemetry& e,
                           const char* operand) {
  SCOPED_TRACE(operand);
  EXPECT_EQ(a.casts, e.casts);
  EXPECT_EQ(a.elements, e.elements);
  EXPECT_EQ(a.nonzero, e.nonzero);
  EXPECT_EQ(a.saturated, e.saturated);
  EXPECT_EQ(a.underflowed, e.underflowed);
  // Sums of float64 atomics on the device: equal up to their order.
  EXPECT_NEAR(a.signal_energy, e.signal_energy, 1e-9 * std::fabs(e.signal_energy));
  EXPECT_NEAR(a.noise_energy, e.noise_energy, 1e-9 * std::fabs(e.noise_energy));
}

void run_config(Backend& backend, const Config& config) {
  SCOPED_TRACE(config.name);
  std::printf("[ op ] gelu_backward_cast %s\n", config.name.c_str());
  Layer unfused(backend, config);
  Layer fused(backend, config);
  for (size_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepInputs host = step_inputs(step);
    Inputs in(backend, host);
    // The bias gradients start from zero each step, so that each holds one sum in its own order.
    unfused.dbias.upload(as_bytes(std::vector<float>(kOC, 0.0f)));
    fused.dbias.upload(as_bytes(std::vector<float>(kOC, 0.0f)));
    forward(backend, unfused, in);
    unfused_backward(backend, unfused, in);
    forward(backend, fused, in);
    fused_backward(backend, fused, in);
    backend.synchronize();

    EXPECT_TRUE(
        exact_with_report(config.name + " dinp", read(fused.dinp, "dinp"), read(unfused.dinp, "dinp")));
    EXPECT_TRUE(exact_with_report(config.name + " dweight", read(fused.dweight, "dweight"),
                                  read(unfused.dweight, "dweight")));
    const std::vector<float> dpre = read(unfused.dpre, "dpre");
    if (octet::gradient_cast_suffices(fused.exec)) {
      EXPECT_TRUE(bytes_identical(as_bytes(read(fused.dpre, "dpre")), as_bytes(nan_filled(kN * kOC)),
                                  "dpre (not written)"));
    } else {
      EXPECT_TRUE(exact_with_report(config.name + " dpre", read(fused.dpre, "dpre"), dpre));
    }
    // Each bias gradient is a sum of N terms in its own order: the two differ by at most twice the float32
    // bound of one such sum.
    std::vector<float> magnitude(kOC, 0.0f);
    for (int64_t n = 0; n < kN; ++n) {
      for (int64_t o = 0; o < kOC; ++o) magnitude[o] += std::fabs(dpre[n * kOC + o]);
    }
    octet::testing::CompareOptions bias_options;
    bias_options.reduction_length = 2 * kN;
    bias_options.magnitude = magnitude;
    const std::vector<float> dbias = read(fused.dbias, "dbias");
    EXPECT_TRUE(octet::testing::has_nonzero(dbias));
    EXPECT_TRUE(close_with_report(config.name + " dbias", dbias, read(unfused.dbias, "dbias"), bias_options));

    backend.fetch_scaling(unfused.state);
    backend.fetch_scaling(fused.state);
    EXPECT_TRUE(same_scaling(fused.state.activation, unfused.state.activation, "activation"));
    EXPECT_TRUE(same_scaling(fused.state.weight, unfused.state.weight, "weight"));
    EXPECT_TRUE(same_scaling(fused.state.gradient, unfused.state.gradient, "gradient"));
    EXPECT_EQ(fused.state.gradient.updates, static_cast<int64_t>(step + 1)) << "one gradient cast per step";
    backend.fetch_telemetry(unfused.telemetry);
    backend.fetch_telemetry(fused.telemetry);
    expect_same_telemetry(fused.telemetry.gradient, unfused.telemetry.gradient, "gradient");
    expect_same_telemetry(fused.telemetry.activation, unfused.telemetry.activation, "activation");
    EXPECT_EQ(fused.fp8_gemms, unfused.fp8_gemms);
    EXPECT_EQ(fused.other_gemms, unfused.other_gemms);
    EXPECT_EQ(fused.saturated, unfused.saturated);
    EXPECT_EQ(fused.underflowed, unfused.underflowed);
  }
  // The casts had something to count.
  EXPECT_GT(fused.telemetry.gradient.underflowed, 0);
  EXPECT_GT(fused.telemetry.gradient.casts, 0);
}

// linear_backward's gradient cast with and without a bias gradient: `with_bias` and `again` sum it (in the
// cast's pass where the recipe allows), `without_bias` gets a null dbias and casts with cast_amax.
void run_bias_config(Backend& backend, const Config& config, const Shape& shape) {
  const std::string name = config.name + " " + shape.label();
  SCOPED_TRACE(name);
  std::printf("[ op ] linear_backward with dbias %s\n", name.c_str());
  const auto [N, C, OC] = shape;
  Layer with_bias(backend, config, shape);
  Layer again(backend, config, shape);
  Layer without_bias(backend, config, shape);
  const auto backward = [&](Layer& layer, Inputs& in, bool bias) {
    backend.linear_backward(TensorView(layer.dinp.floats(), {N, C}),
                            TensorView(layer.dweight.floats(), {OC, C}),
                            bias ? layer.dbias.floats() : nullptr, ConstTensorView(in.dout.floats(), {N, OC}),
                            ConstTensorView(in.inp.floats(), {N, C}),
                            ConstTensorView(in.weight.floats(), {OC, C}), layer.copy.get(), layer.exec,
                            layer.input_codes.get(), {&layer.gradient_codes});
  };
  for (size_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const StepInputs host = step_inputs(step, shape);
    Inputs in(backend, host);
    // Each step's bias gradient is one sum, from zero.
    with_bias.dbias.upload(as_bytes(std::vector<float>(OC, 0.0f)));
    again.dbias.upload(as_bytes(std::vector<float>(OC, 0.0f)));
    for (Layer* layer : {&with_bias, &again, &without_bias}) forward(backend, *layer, in);
    backward(with_bias, in, true);
    backward(without_bias, in, false);
    backward(again, in, true);
    backend.synchronize();

    const std::vector<float> dinp = read(with_bias.dinp, "dinp");
    const std::vector<float> dweight = read(with_bias.dweight, "dweight");
    EXPECT_TRUE(octet::testing::has_nonzero(dinp));
    EXPECT_TRUE(exact_with_report(name + " dinp", dinp, read(without_bias.dinp, "dinp")));
    EXPECT_TRUE(exact_with_report(name + " dweight", dweight, read(without_bias.dweight, "dweight")));
    EXPECT_TRUE(bytes_identical(as_bytes(read(again.dinp, "dinp")), as_bytes(dinp), "dinp, again"));
    EXPECT_TRUE(
        bytes_identical(as_bytes(read(again.dweight, "dweight")), as_bytes(dweight), "dweight, again"));
    EXPECT_TRUE(bytes_identical(as_bytes(read(without_bias.dbias, "dbias")),
                                as_bytes(std::vector<float>(OC, 0.0f)), "dbias (not passed)"));

    // The column sums of dout in float64, and sum |dout| per column, which bounds a float32 sum's error in
    // any order.
    std::vector<double> sums(static_cast<size_t>(OC), 0.0), magnitude(static_cast<size_t>(OC), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < OC; ++o) {
        const double x = host.dout[static_cast<size_t>(n * OC + o)];
        sums[static_cast<size_t>(o)] += x;
        magnitude[static_cast<size_t>(o)] += std::fabs(x);
      }
    }
    const std::vector<float> expected(sums.begin(), sums.end());
    const std::vector<float> bound(magnitude.begin(), magnitude.end());
    octet::testing::CompareOptions bias_options;
    bias_options.reduction_length = N + 1;  // N terms added to the zero it starts from, in any order
    bias_options.magnitude = bound;
    const std::vector<float> dbias = read(with_bias.dbias, "dbias");
    EXPECT_TRUE(octet::testing::has_nonzero(dbias));
    EXPECT_TRUE(close_with_report(name + " dbias", dbias, expected, bias_options));
    EXPECT_TRUE(bytes_identical(as_bytes(read(again.dbias, "dbias")), as_bytes(dbias), "dbias, again"));

    backend.fetch_scaling(with_bias.state);
    backend.fetch_scaling(without_bias.state);
    backend.fetch_scaling(again.state);
    EXPECT_TRUE(same_scaling(with_bias.state.activation, without_bias.state.activation, "activation"));
    EXPECT_TRUE(same_scaling(with_bias.state.weight, without_bias.state.weight, "weight"));
    EXPECT_TRUE(same_scaling(with_bias.state.gradient, without_bias.state.gradient, "gradient"));
    EXPECT_TRUE(same_scaling(again.state.gradient, with_bias.state.gradient, "gradient, again"));
    EXPECT_EQ(with_bias.state.gradient.updates, static_cast<int64_t>(step + 1))
        << "one gradient cast per step";
    backend.fetch_telemetry(with_bias.telemetry);
    backend.fetch_telemetry(without_bias.telemetry);
    backend.fetch_telemetry(again.telemetry);
    expect_same_telemetry(with_bias.telemetry.gradient, without_bias.telemetry.gradient, "gradient");
    expect_same_telemetry(with_bias.telemetry.activation, without_bias.telemetry.activation, "activation");
    EXPECT_EQ(with_bias.fp8_gemms, without_bias.fp8_gemms);
    EXPECT_EQ(with_bias.other_gemms, without_bias.other_gemms);
    EXPECT_EQ(with_bias.saturated, without_bias.saturated);
    EXPECT_EQ(with_bias.underflowed, without_bias.underflowed);
  }
  // The casts had something to count.
  EXPECT_GT(with_bias.telemetry.gradient.underflowed, 0);
  EXPECT_GT(with_bias.telemetry.gradient.casts, 0);
}

std::vector<Config> configs() {
  auto delayed = std::make_shared<octet::DelayedScaling>(16, octet::AmaxAlgorithm::max, 0);
  auto delayed_short = std::make_shared<octet::DelayedScaling>(4, octet::AmaxAlgorithm::most_recent, 1);
  auto current = std::make_shared<octet::CurrentScaling>(0);
  auto fixed = std::make_shared<octet::StaticScaling>(64.0f);
  return {
      {"delayed hybrid", delayed},
      {"delayed(4, most recent, margin 1) hybrid", delayed_short},
      {"static hybrid", fixed},
      {"delayed all-e4m3", delayed, GemmMode::fp8, GemmMode::fp8, Dtype::e4m3},
      // Not fused on the GPU (the scale needs the amax first; SQNR needs the float32 values): the same ops in
      // the producer's place.
      {"current hybrid", current},
      {"delayed hybrid with SQNR telemetry", delayed, GemmMode::fp8, GemmMode::fp8, Dtype::e5m2, true},
      // The float32 gradient is read by a BF16 GEMM as well: kept.
      {"delayed, fp8 dgrad, bf16 wgrad", delayed, GemmMode::fp8, GemmMode::bf16},
      {"static, bf16 dgrad, fp8 wgrad", fixed, GemmMode::bf16, GemmMode::fp8},
  };
}

TEST(BackendOpsGeluBackwardCast, TrainsAsTheUnfusedOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) run_config(*backend, config);
}

// Rows that end in half a tile of the fused cast (32 rows), columns in a partial tile (128 columns).
TEST(BackendOpsLinearBackwardBiasCast, SameCastsAsWithoutTheBias) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Shape& shape : {kShape, Shape{48, 32, 144}}) {
    for (const Config& config : configs()) run_bias_config(*backend, config, shape);
  }
}

// The cast a producer made serves the layer it was made for only: a linear_backward handed another layer's
// cast refuses it, and without a producer's cast it needs the float32 gradient.
TEST(BackendOpsGeluBackwardCast, ServesOnlyItsOwnLayer) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  const Config config{"delayed hybrid", std::make_shared<octet::DelayedScaling>(16)};
  Layer a(*backend, config);
  Layer b(*backend, config);
  Inputs in(*backend, step_inputs(0));
  forward(*backend, a, in);
  forward(*backend, b, in);
  backend->activation_backward(Activation::gelu, TensorView(nullptr, {kN, kOC}),
                               ConstTensorView(in.pre.floats(), {kN, kOC}),
                               ConstTensorView(in.dout.floats(), {kN, kOC}), a.dbias.floats(),
                               {&a.exec, &a.gradient_codes});
  unfused_backward(*backend, b, in);  // casts its own gradient into b's tensor
  const auto a_backward = [&](std::unique_ptr<octet::Fp8Tensor>* gradient, bool cast_by_producer) {
    backend->linear_backward(TensorView(a.dinp.floats(), {kN, kC}), TensorView(a.dweight.floats(), {kOC, kC}),
                             nullptr, ConstTensorView(nullptr, {kN, kOC}),
                             ConstTensorView(in.inp.floats(), {kN, kC}),
                             ConstTensorView(in.weight.floats(), {kOC, kC}), a.copy.get(), a.exec,
                             a.input_codes.get(), {gradient, cast_by_producer});
  };
  EXPECT_THROW(a_backward(&b.gradient_codes, true), octet::Error);
  // Without a producer's cast, linear_backward needs the float32 gradient.
  EXPECT_THROW(a_backward(&a.gradient_codes, false), octet::Error);
  a_backward(&a.gradient_codes, true);
  backend->synchronize();
  EXPECT_TRUE(octet::testing::has_nonzero(read(a.dinp, "dinp"))) << "a's backward ran on its own cast";
}

}  // namespace
