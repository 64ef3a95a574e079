// RMSNorm's and SwiGLU's forwards and a mixture of experts' gather of rows with their consumer's FP8 input
// cast (Fusion::input_cast), and SwiGLU's backward with its consumer's FP8 gradient cast and bias gradient
// and the gather with its consumer's gradient cast (Fusion::gradient_cast), on the CUDA
// backend as the model drives them: the producer with a cast target, then the consumer layer's linear op
// taking the producer's cast. Held against the unfused ops on a twin layer from the same start: the producer
// without a cast target, then the linear op casting its own operand. Over several steps (the delayed recipe's
// history rolls over) and the recipes the GPU fuses (delayed, static) and does not (current scaling: the same
// ops in the producer's place): the layer's outputs and gradients, the producer's kept output and rstd the
// same bits, the scaling states, counts and telemetry the same; the bias gradient, summed in another order,
// within float32 tolerance. Every test skips without a GPU.
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
using octet::Dtype;
using octet::GemmMode;
using octet::LinearExecution;
using octet::Normalization;
using octet::ScalingRecipe;
using octet::ScalingState;
using octet::TensorView;

// The consumer layer: input [N, C], output [N, OC]. N ends in half a tile of the fused casts (32 rows).
constexpr int64_t kN = 48, kC = 96, kOC = 64;
constexpr int kSteps = 4;

struct Config {
  std::string name;
  std::shared_ptr<const ScalingRecipe> recipe;
  Dtype gradient_format = Dtype::e5m2;
};

std::vector<Config> configs() {
  auto delayed = std::make_shared<octet::DelayedScaling>(16, octet::AmaxAlgorithm::max, 0);
  auto current = std::make_shared<octet::CurrentScaling>(0);
  auto fixed = std::make_shared<octet::StaticScaling>(64.0f);
  return {{"delayed hybrid", delayed},
          {"static hybrid", fixed},
          {"delayed all-e4m3", delayed, Dtype::e4m3},
          // Not fused on the GPU (the scale needs the amax first): the same ops in the producer's place.
          {"current hybrid", current}};
}

// One FP8 layer [C -> OC] with its state, counters and buffers.
struct Layer {
  int64_t C, OC;
  octet::Fp8LinearState state;
  octet::Fp8LinearTelemetry telemetry;
  LinearExecution exec;
  std::unique_ptr<octet::WeightCopy> copy;
  std::unique_ptr<octet::Fp8Tensor> input_codes, gradient_codes;
  int64_t fp8_gemms = 0, other_gemms = 0, saturated = 0, underflowed = 0;
  GuardedBuffer out, dinp, dweight;

  Layer(Backend& backend, const Config& config, int64_t c, int64_t oc)
      : C(c),
        OC(oc),
        out(backend, as_bytes(nan_filled(kN * oc))),
        dinp(backend, as_bytes(nan_filled(kN * c))),
        dweight(backend, as_bytes(std::vector<float>(oc * c, 0.0f))) {
    exec.forward = GemmMode::fp8;
    exec.input_gradient = GemmMode::fp8;
    exec.weight_gradient = GemmMode::fp8;
    exec.recipe = config.recipe.get();
    exec.formats.gradient = config.gradient_format;
    state = {config.recipe->initial_state(), config.recipe->initial_state(), config.recipe->initial_state()};
    exec.state = &state;
    exec.telemetry = &telemetry;
    exec.fp8_gemms = &fp8_gemms;
    exec.other_gemms = &other_gemms;
    exec.saturated = &saturated;
    exec.underflowed = &underflowed;
  }
};

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
              a.amax_history.size() == e.amax_history.size();
  for (size_t i = 0; same && i < a.amax_history.size(); ++i)
    same = bits(a.amax_history[i]) == bits(e.amax_history[i]);
  if (same) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << operand << ": scale " << a.scale << " against " << e.scale
                                       << ", updates " << a.updates << " against " << e.updates;
}

// Both layers' states, telemetry and counts agree.
void expect_same_layers(Backend& backend, Layer& fused, Layer& unfused) {
  backend.fetch_scaling(fused.state);
  backend.fetch_scaling(unfused.state);
  EXPECT_TRUE(same_scaling(fused.state.activation, unfused.state.activation, "activation"));
  EXPECT_TRUE(same_scaling(fused.state.weight, unfused.state.weight, "weight"));
  EXPECT_TRUE(same_scaling(fused.state.gradient, unfused.state.gradient, "gradient"));
  backend.fetch_telemetry(fused.telemetry);
  backend.fetch_telemetry(unfused.telemetry);
  for (const auto& [a, e, what] :
       {std::tuple{&fused.telemetry.activation, &unfused.telemetry.activation, "input"},
        std::tuple{&fused.telemetry.gradient, &unfused.telemetry.gradient, "gradient"}}) {
    SCOPED_TRACE(what);
    EXPECT_EQ(a->casts, e->casts);
    EXPECT_EQ(a->elements, e->elements);
    EXPECT_EQ(a->nonzero, e->nonzero);
    EXPECT_EQ(a->saturated, e->saturated);
    EXPECT_EQ(a->underflowed, e->underflowed);
  }
  EXPECT_EQ(fused.fp8_gemms, unfused.fp8_gemms);
  EXPECT_EQ(fused.saturated, unfused.saturated);
  EXPECT_EQ(fused.underflowed, unfused.underflowed);
}

// The producers of a layer's input: RMSNorm over [N, C], SwiGLU over [N, 2C], or a mixture of experts'
// gather of an expert's rows from [N, C] (the rows of kN tokens that chose 2 experts each).
enum class Producer { rmsnorm, swiglu, gather };

constexpr int64_t kTopK = 2;

// An expert's kN grouped rows: kN - 8 of the kN kTopK assignments, in a scrambled order, then 8 rows of padding
// (-1), as group_by_expert leaves them.
std::vector<int32_t> expert_slots(int step) {
  std::vector<int32_t> slots(static_cast<size_t>(kN), -1);
  for (int64_t m = 0; m + 8 < kN; ++m) {
    slots[static_cast<size_t>(m)] = static_cast<int32_t>((m * 37 + 5 * step) % (kN * kTopK));
  }
  return slots;
}

void run_input_cast(Backend& backend, const Config& config, Producer producer) {
  const char* name = producer == Producer::rmsnorm  ? "rmsnorm"
                     : producer == Producer::swiglu ? "swiglu"
                                                    : "gather_rows";
  SCOPED_TRACE(std::string(name) + " " + config.name);
  std::printf("[ op ] %s_forward_cast %s\n", name, config.name.c_str());
  Layer fused(backend, config, kC, kOC), unfused(backend, config, kC, kOC);
  const int64_t width = producer == Producer::swiglu ? 2 * kC : kC;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t seed = seed_of(name, config.name + " step " + std::to_string(step));
    const float scale[] = {1.0f, 8.0f, 0.25f, 2.0f};
    GuardedBuffer weight(backend, as_bytes(octet::testing::random_normal(kOC * kC, seed, 0.5f)));
    GuardedBuffer inp(backend,
                      as_bytes(octet::testing::random_normal(kN * width, seed + 1, 2.0f * scale[step])));
    GuardedBuffer gain(backend, as_bytes(octet::testing::random_normal(kC, seed + 2, scale[step])));
    GuardedBuffer kept(backend, as_bytes(nan_filled(kN * kC))), plain(backend, as_bytes(nan_filled(kN * kC)));
    GuardedBuffer rstd_fused(backend, as_bytes(nan_filled(kN))),
        rstd_plain(backend, as_bytes(nan_filled(kN)));
    GuardedBuffer slots(backend, as_bytes(expert_slots(step)));
    // The producer's output is kept where the consumer reads more than its cast.
    float* out = octet::input_cast_suffices(fused.exec) ? nullptr : kept.floats();
    const auto produce = [&](float* y, float* rstd, const octet::Fp8CastTarget& target) {
      if (producer == Producer::rmsnorm) {
        backend.normalization_forward(Normalization::rmsnorm, TensorView(y, {kN, kC}), nullptr, rstd,
                                      ConstTensorView(inp.floats(), {kN, kC}), gain.floats(), nullptr,
                                      target);
      } else if (producer == Producer::swiglu) {
        backend.activation_forward(Activation::swiglu, TensorView(y, {kN, kC}),
                                   ConstTensorView(inp.floats(), {kN, width}), target);
      } else {
        backend.gather_rows(TensorView(y, {kN, kC}), ConstTensorView(inp.floats(), {kN, kC}),
                            static_cast<const int32_t*>(slots.data()), kTopK, nullptr, target,
                            octet::TensorRole::activation);
      }
    };
    for (Layer* layer : {&fused, &unfused})
      backend.prepare_weight(layer->copy, weight.floats(), kOC, kC, layer->exec);
    produce(out, rstd_fused.floats(), {&fused.exec, &fused.input_codes});
    backend.linear_forward(TensorView(fused.out.floats(), {kN, kOC}), ConstTensorView(out, {kN, kC}),
                           ConstTensorView(weight.floats(), {kOC, kC}), fused.copy.get(), {}, fused.exec,
                           {&fused.input_codes, true});
    produce(plain.floats(), rstd_plain.floats(), {});
    backend.linear_forward(TensorView(unfused.out.floats(), {kN, kOC}),
                           ConstTensorView(plain.floats(), {kN, kC}),
                           ConstTensorView(weight.floats(), {kOC, kC}), unfused.copy.get(), {}, unfused.exec,
                           {&unfused.input_codes});
    backend.synchronize();
    EXPECT_TRUE(exact_with_report(config.name + " out", read(fused.out, "out"), read(unfused.out, "out")));
    if (out != nullptr) {
      EXPECT_TRUE(exact_with_report(config.name + " kept", read(kept, "kept"), read(plain, "plain")));
    }
    if (producer == Producer::rmsnorm) {
      EXPECT_TRUE(
          exact_with_report(config.name + " rstd", read(rstd_fused, "rstd"), read(rstd_plain, "rstd")));
    }
    EXPECT_TRUE(octet::testing::has_nonzero(read(fused.out, "out")));
    expect_same_layers(backend, fused, unfused);
  }
  EXPECT_GT(fused.telemetry.activation.casts, 0);
}

// SwiGLU's backward writing the output gradient [N, 2C] of the layer [C0 -> 2C] that produced its input.
void run_gradient_cast(Backend& backend, const Config& config, bool bias) {
  SCOPED_TRACE(config.name + (bias ? ", with the bias gradient" : ", no bias"));
  std::printf("[ op ] swiglu_backward_cast %s%s\n", config.name.c_str(), bias ? " with dbias" : "");
  // FP8 GEMM dimensions are multiples of 16.
  constexpr int64_t kC0 = 48, kHidden = kC / 2, kWidth = kC;  // the layer's output: [N, 2 kHidden]
  Layer fused(backend, config, kC0, kWidth), unfused(backend, config, kC0, kWidth);
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t seed = seed_of("swiglu backward", config.name + " step " + std::to_string(step));
    const float dout_std[] = {1e-2f, 1e-3f, 5e-2f, 2e-3f};
    GuardedBuffer weight(backend, as_bytes(octet::testing::random_normal(kWidth * kC0, seed, 0.5f)));
    GuardedBuffer x(backend, as_bytes(octet::testing::random_normal(kN * kC0, seed + 1)));
    GuardedBuffer pre(backend, as_bytes(octet::testing::random_normal(kN * kWidth, seed + 2, 2.0f)));
    std::vector<float> d = octet::testing::random_normal(kN * kHidden, seed + 3, dout_std[step]);
    for (size_t i = 5; i < d.size(); i += 11) d[i] *= 1e-11f;  // underflows
    GuardedBuffer dout(backend, as_bytes(d));
    GuardedBuffer dbias_fused(backend, as_bytes(std::vector<float>(kWidth, 0.0f)));
    GuardedBuffer dbias_plain(backend, as_bytes(std::vector<float>(kWidth, 0.0f)));
    GuardedBuffer kept(backend, as_bytes(nan_filled(kN * kWidth))),
        plain(backend, as_bytes(nan_filled(kN * kWidth)));
    for (Layer* layer : {&fused, &unfused}) {
      backend.prepare_weight(layer->copy, weight.floats(), kWidth, kC0, layer->exec);
      backend.linear_forward(TensorView(layer->out.floats(), {kN, kWidth}),
                             ConstTensorView(x.floats(), {kN, kC0}),
                             ConstTensorView(weight.floats(), {kWidth, kC0}), layer->copy.get(), {},
                             layer->exec, {&layer->input_codes});
    }
    float* d_kept = octet::gradient_cast_suffices(fused.exec) ? nullptr : kept.floats();
    backend.activation_backward(Activation::swiglu, TensorView(d_kept, {kN, kWidth}),
                                ConstTensorView(pre.floats(), {kN, kWidth}),
                                ConstTensorView(dout.floats(), {kN, kHidden}),
                                bias ? dbias_fused.floats() : nullptr, {&fused.exec, &fused.gradient_codes});
    backend.linear_backward(TensorView(fused.dinp.floats(), {kN, kC0}),
                            TensorView(fused.dweight.floats(), {kWidth, kC0}), nullptr,
                            ConstTensorView(d_kept, {kN, kWidth}), ConstTensorView(x.floats(), {kN, kC0}),
                            ConstTensorView(weight.floats(), {kWidth, kC0}), fused.copy.get(), fused.exec,
                            fused.input_codes.get(), {&fused.gradient_codes, true});
    backend.activation_backward(Activation::swiglu, TensorView(plain.floats(), {kN, kWidth}),
                                ConstTensorView(pre.floats(), {kN, kWidth}),
                                ConstTensorView(dout.floats(), {kN, kHidden}), nullptr, {});
    backend.linear_backward(
        TensorView(unfused.dinp.floats(), {kN, kC0}), TensorView(unfused.dweight.floats(), {kWidth, kC0}),
        bias ? dbias_plain.floats() : nullptr, ConstTensorView(plain.floats(), {kN, kWidth}),
        ConstTensorView(x.floats(), {kN, kC0}), ConstTensorView(weight.floats(), {kWidth, kC0}),
        unfused.copy.get(), unfused.exec, unfused.input_codes.get(), {&unfused.gradient_codes});
    backend.synchronize();
    EXPECT_TRUE(
        exact_with_report(config.name + " dinp", read(fused.dinp, "dinp"), read(unfused.dinp, "dinp")));
    EXPECT_TRUE(exact_with_report(config.name + " dweight", read(fused.dweight, "dweight"),
                                  read(unfused.dweight, "dweight")));
    const std::vector<float> gradient = read(plain, "plain");
    if (d_kept != nullptr) {
      EXPECT_TRUE(exact_with_report(config.name + " kept", read(kept, "kept"), gradient));
    }
    if (bias) {
      std::vector<float> magnitude(kWidth, 0.0f);
      for (int64_t n = 0; n < kN; ++n) {
        for (int64_t o = 0; o < kWidth; ++o) magnitude[o] += std::fabs(gradient[n * kWidth + o]);
      }
      octet::testing::CompareOptions options;
      options.reduction_length = 2 * kN;
      options.magnitude = magnitude;
      const std::vector<float> dbias = read(dbias_fused, "dbias");
      EXPECT_TRUE(octet::testing::has_nonzero(dbias));
      EXPECT_TRUE(close_with_report(config.name + " dbias", dbias, read(dbias_plain, "dbias"), options));
    }
    expect_same_layers(backend, fused, unfused);
  }
  EXPECT_GT(fused.telemetry.gradient.casts, 0);
}

// A mixture of experts' gather of an expert's rows of the combine's gradient [N, W] (each row scaled by its
// assignment's weight) as the output gradient of the expert's layer [C0 -> W]: the gather with a cast
// target, then the layer's backward taking that cast, against the plain gather and the backward casting it.
void run_gather_gradient_cast(Backend& backend, const Config& config) {
  SCOPED_TRACE(config.name);
  std::printf("[ op ] gather_rows gradient cast %s\n", config.name.c_str());
  constexpr int64_t kC0 = 48, kWidth = kC;
  Layer fused(backend, config, kC0, kWidth), unfused(backend, config, kC0, kWidth);
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t seed = seed_of("gather gradient", config.name + " step " + std::to_string(step));
    const float dout_std[] = {1e-2f, 1e-3f, 5e-2f, 2e-3f};
    GuardedBuffer weight(backend, as_bytes(octet::testing::random_normal(kWidth * kC0, seed, 0.5f)));
    GuardedBuffer x(backend, as_bytes(octet::testing::random_normal(kN * kC0, seed + 1)));
    std::vector<float> d = octet::testing::random_normal(kN * kWidth, seed + 2, dout_std[step]);
    for (size_t i = 5; i < d.size(); i += 11) d[i] *= 1e-11f;  // underflows
    GuardedBuffer dresidual(backend, as_bytes(d));
    GuardedBuffer weights(
        backend, as_bytes(octet::testing::random_uniform(static_cast<size_t>(kN * kTopK), seed + 3, 0.0f, 1.0f)));
    GuardedBuffer slots(backend, as_bytes(expert_slots(step)));
    GuardedBuffer kept(backend, as_bytes(nan_filled(kN * kWidth))),
        plain(backend, as_bytes(nan_filled(kN * kWidth)));
    for (Layer* layer : {&fused, &unfused}) {
      backend.prepare_weight(layer->copy, weight.floats(), kWidth, kC0, layer->exec);
      backend.linear_forward(TensorView(layer->out.floats(), {kN, kWidth}),
                             ConstTensorView(x.floats(), {kN, kC0}),
                             ConstTensorView(weight.floats(), {kWidth, kC0}), layer->copy.get(), {},
                             layer->exec, {&layer->input_codes});
    }
    const auto* index = static_cast<const int32_t*>(slots.data());
    float* d_kept = octet::gradient_cast_suffices(fused.exec) ? nullptr : kept.floats();
    backend.gather_rows(TensorView(d_kept, {kN, kWidth}), ConstTensorView(dresidual.floats(), {kN, kWidth}),
                        index, kTopK, weights.floats(), {&fused.exec, &fused.gradient_codes},
                        octet::TensorRole::gradient);
    backend.linear_backward(TensorView(fused.dinp.floats(), {kN, kC0}),
                            TensorView(fused.dweight.floats(), {kWidth, kC0}), nullptr,
                            ConstTensorView(d_kept, {kN, kWidth}), ConstTensorView(x.floats(), {kN, kC0}),
                            ConstTensorView(weight.floats(), {kWidth, kC0}), fused.copy.get(), fused.exec,
                            fused.input_codes.get(), {&fused.gradient_codes, true});
    backend.gather_rows(TensorView(plain.floats(), {kN, kWidth}),
                        ConstTensorView(dresidual.floats(), {kN, kWidth}), index, kTopK, weights.floats(), {},
                        octet::TensorRole::gradient);
    backend.linear_backward(
        TensorView(unfused.dinp.floats(), {kN, kC0}), TensorView(unfused.dweight.floats(), {kWidth, kC0}),
        nullptr, ConstTensorView(plain.floats(), {kN, kWidth}), ConstTensorView(x.floats(), {kN, kC0}),
        ConstTensorView(weight.floats(), {kWidth, kC0}), unfused.copy.get(), unfused.exec,
        unfused.input_codes.get(), {&unfused.gradient_codes});
    backend.synchronize();
    EXPECT_TRUE(
        exact_with_report(config.name + " dinp", read(fused.dinp, "dinp"), read(unfused.dinp, "dinp")));
    EXPECT_TRUE(exact_with_report(config.name + " dweight", read(fused.dweight, "dweight"),
                                  read(unfused.dweight, "dweight")));
    EXPECT_TRUE(octet::testing::has_nonzero(read(fused.dinp, "dinp")));
    if (d_kept != nullptr) {
      EXPECT_TRUE(exact_with_report(config.name + " kept", read(kept, "kept"), read(plain, "plain")));
    }
    expect_same_layers(backend, fused, unfused);
  }
  EXPECT_GT(fused.telemetry.gradient.casts, 0);
}

// ---------------------------------------------------------------------------------------------------------
// The grouped ops (Backend::gather_rows_grouped, activation_forward_grouped, activation_backward_grouped): a
// mixture of experts' producers over every expert's rows at once, each expert's rows cast for its own layer,
// against one op per group on the same backend, each followed by its layer's op as the decoder ran them. Four
// groups of the kGroupRows rows: 48 rows for layer 0, none for layer 1, 16 rows without a cast (written
// plain; only in the runs that keep the output), 32 rows for layer 2.
constexpr int64_t kGroupRows = 96;
enum class Grouped { gather_input, swiglu_input, gather_gradient, swiglu_gradient };

void run_grouped(Backend& backend, const Config& config, Grouped op, bool plain_group) {
  const bool input = op == Grouped::gather_input || op == Grouped::swiglu_input;
  const bool swiglu = op == Grouped::swiglu_input || op == Grouped::swiglu_gradient;
  const std::string name = std::string(swiglu ? "swiglu" : "gather_rows") + (input ? " input" : " gradient") +
                           " grouped" + (plain_group ? " with a plain group" : "");
  SCOPED_TRACE(name + " " + config.name);
  std::printf("[ op ] %s %s\n", name.c_str(), config.name.c_str());
  // The consumers: [kC -> kOC] in the forward; [kC0 -> kWidth] in the backward, their output gradient
  // produced.
  constexpr int64_t kC0 = 48, kWidth = kC, kHidden = kC / 2;
  const int64_t in = input ? kC : kC0, out_features = input ? kOC : kWidth;
  const std::vector<int64_t> offsets = {0, 48, 48, plain_group ? 64 : 48, kGroupRows};
  std::vector<std::unique_ptr<Layer>> grouped, single;
  for (int i = 0; i < 3; ++i) {
    grouped.push_back(std::make_unique<Layer>(backend, config, in, out_features));
    single.push_back(std::make_unique<Layer>(backend, config, in, out_features));
  }
  // Group g's layer (null: the plain group).
  const auto layer_of = [&](std::vector<std::unique_ptr<Layer>>& set, size_t g) -> Layer* {
    return g == 2 ? nullptr : set[g == 3 ? 2 : g].get();
  };
  const auto rows_of = [&](size_t g) { return offsets[g + 1] - offsets[g]; };
  bool nonzero = false;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const uint64_t seed = seed_of(name, config.name + " step " + std::to_string(step));
    const float spread[] = {1.0f, 8.0f, 0.25f, 2.0f};
    // The producer's source: tokens' rows for the gathers (kGroupRows assignments of kN tokens, top 2), the
    // hidden rows for SwiGLU; for the backward, the gradient's scale per step.
    const int64_t src_rows = swiglu ? kGroupRows : kN, src_width = swiglu ? 2 * (input ? kC : kHidden) : kC;
    const float magnitude = input ? 2.0f * spread[step] : 1e-2f / spread[step];
    std::vector<float> source = octet::testing::random_normal(src_rows * src_width, seed, magnitude);
    for (size_t i = 5; !input && i < source.size(); i += 11) source[i] *= 1e-11f;  // underflows
    GuardedBuffer src(backend, as_bytes(source));
    GuardedBuffer dout(backend, as_bytes(octet::testing::random_normal(kGroupRows * kHidden, seed + 1, magnitude)));
    std::vector<int32_t> slot_values(static_cast<size_t>(kGroupRows), -1);
    for (int64_t m = 0; m < kGroupRows; ++m) {
      if (m % 16 < 13) slot_values[static_cast<size_t>(m)] = static_cast<int32_t>((m * 37 + 5 * step) % (kN * kTopK));
    }
    GuardedBuffer slots(backend, as_bytes(slot_values));
    GuardedBuffer weights(backend, as_bytes(octet::testing::random_uniform(static_cast<size_t>(kN * kTopK),
                                                                           seed + 2, 0.0f, 1.0f)));
    GuardedBuffer x(backend, as_bytes(octet::testing::random_normal(kGroupRows * kC0, seed + 3)));
    GuardedBuffer kept(backend, as_bytes(nan_filled(kGroupRows * kC))),
        plain(backend, as_bytes(nan_filled(kGroupRows * kC)));
    std::vector<std::unique_ptr<GuardedBuffer>> layer_weights;
    for (int i = 0; i < 3; ++i) {
      layer_weights.push_back(std::make_unique<GuardedBuffer>(
          backend, as_bytes(octet::testing::random_normal(out_features * in, seed + 4 + i, 0.5f))));
    }
    const auto* index = static_cast<const int32_t*>(slots.data());
    const float* scale = input ? nullptr : weights.floats();
    const octet::TensorRole role = input ? octet::TensorRole::activation : octet::TensorRole::gradient;
    // The producer over rows [from, from + rows) into y, for `target`; the grouped op over every row.
    const auto produce = [&](float* y, int64_t from, int64_t rows, const octet::Fp8CastTarget& target) {
      if (op == Grouped::gather_input || op == Grouped::gather_gradient) {
        backend.gather_rows(TensorView(y, {rows, kC}), ConstTensorView(src.floats(), {kN, kC}), index + from,
                            kTopK, scale, target, role);
      } else if (input) {
        backend.activation_forward(Activation::swiglu, TensorView(y, {rows, kC}),
                                   ConstTensorView(src.floats() + from * 2 * kC, {rows, 2 * kC}), target);
      } else {
        backend.activation_backward(Activation::swiglu, TensorView(y, {rows, kWidth}),
                                    ConstTensorView(src.floats() + from * kWidth, {rows, kWidth}),
                                    ConstTensorView(dout.floats() + from * kHidden, {rows, kHidden}), nullptr,
                                    target);
      }
    };
    // A layer's op on its group's rows y, taking the cast its producer wrote or casting them itself.
    const auto consume = [&](Layer& layer, size_t g, const float* y, bool cast_by_producer) {
      const int64_t from = offsets[g], rows = rows_of(g);
      GuardedBuffer& w = *layer_weights[g == 3 ? 2 : g];
      if (input) {
        backend.linear_forward(TensorView(layer.out.floats(), {rows, kOC}), ConstTensorView(y, {rows, kC}),
                               ConstTensorView(w.floats(), {kOC, kC}), layer.copy.get(), {}, layer.exec,
                               {&layer.input_codes, cast_by_producer});
        return;
      }
      backend.linear_backward(TensorView(layer.dinp.floats(), {rows, kC0}),
                              TensorView(layer.dweight.floats(), {kWidth, kC0}), nullptr,
                              ConstTensorView(y, {rows, kWidth}), ConstTensorView(x.floats() + from * kC0, {rows, kC0}),
                              ConstTensorView(w.floats(), {kWidth, kC0}), layer.copy.get(), layer.exec,
                              layer.input_codes.get(), {&layer.gradient_codes, cast_by_producer});
    };
    for (size_t g = 0; g < 4; ++g) {
      for (auto* set : {&grouped, &single}) {
        Layer* layer = layer_of(*set, g);
        if (layer == nullptr || rows_of(g) == 0) continue;
        GuardedBuffer& w = *layer_weights[g == 3 ? 2 : g];
        backend.prepare_weight(layer->copy, w.floats(), out_features, in, layer->exec);
        if (!input) {  // the forward whose input cast the backward's weight gradient reads
          backend.linear_forward(TensorView(layer->out.floats(), {rows_of(g), kWidth}),
                                 ConstTensorView(x.floats() + offsets[g] * kC0, {rows_of(g), kC0}),
                                 ConstTensorView(w.floats(), {kWidth, kC0}), layer->copy.get(), {}, layer->exec,
                                 {&layer->input_codes});
        }
      }
    }
    // The grouped op, then each layer's op on its rows.
    const bool suffices = input ? octet::input_cast_suffices(grouped[0]->exec)
                                : octet::gradient_cast_suffices(grouped[0]->exec);
    float* out = plain_group || !suffices ? kept.floats() : nullptr;
    std::vector<octet::Fp8CastTarget> targets(4);
    for (size_t g = 0; g < 4; ++g) {
      if (Layer* layer = layer_of(grouped, g)) {
        targets[g] = {&layer->exec, input ? &layer->input_codes : &layer->gradient_codes};
      }
    }
    const octet::RowGroupCasts casts{offsets, targets};
    const int64_t width = input ? kC : kWidth;
    if (op == Grouped::gather_input || op == Grouped::gather_gradient) {
      backend.gather_rows_grouped(TensorView(out, {kGroupRows, kC}), ConstTensorView(src.floats(), {kN, kC}), index,
                                  kTopK, scale, casts, role);
    } else if (input) {
      backend.activation_forward_grouped(Activation::swiglu, TensorView(out, {kGroupRows, kC}),
                                         ConstTensorView(src.floats(), {kGroupRows, 2 * kC}), casts);
    } else {
      backend.activation_backward_grouped(Activation::swiglu, TensorView(out, {kGroupRows, kWidth}),
                                          ConstTensorView(src.floats(), {kGroupRows, kWidth}),
                                          ConstTensorView(dout.floats(), {kGroupRows, kHidden}), casts);
    }
    for (size_t g = 0; g < 4; ++g) {
      if (Layer* layer = layer_of(grouped, g); layer != nullptr && rows_of(g) > 0) {
        consume(*layer, g, out != nullptr ? out + offsets[g] * width : nullptr, true);
      }
    }
    // One op per group, each followed by its layer's op, the plain group's rows written plain.
    for (size_t g = 0; g < 4; ++g) {
      if (rows_of(g) == 0) continue;
      float* y = plain.floats() + offsets[g] * width;
      Layer* layer = layer_of(single, g);
      produce(y, offsets[g], rows_of(g), layer != nullptr ? octet::Fp8CastTarget{&layer->exec,
                                                                                  input ? &layer->input_codes
                                                                                        : &layer->gradient_codes}
                                                          : octet::Fp8CastTarget{});
      if (layer != nullptr) consume(*layer, g, y, true);
    }
    backend.synchronize();
    for (size_t g = 0; g < 4; ++g) {
      Layer* a = layer_of(grouped, g);
      Layer* e = layer_of(single, g);
      if (a == nullptr || rows_of(g) == 0) continue;
      SCOPED_TRACE("group " + std::to_string(g));
      // Small gradients may all underflow in E4M3 at the first step's scale: some step must give values.
      if (input) {
        const std::vector<float> y = read(a->out, "out");
        nonzero |= octet::testing::has_nonzero(y);
        EXPECT_TRUE(exact_with_report(name + " out", y, read(e->out, "out")));
      } else {
        EXPECT_TRUE(exact_with_report(name + " dinp", read(a->dinp, "dinp"), read(e->dinp, "dinp")));
        const std::vector<float> dweight = read(a->dweight, "dweight");
        nonzero |= octet::testing::has_nonzero(dweight);
        EXPECT_TRUE(exact_with_report(name + " dweight", dweight, read(e->dweight, "dweight")));
      }
      expect_same_layers(backend, *a, *e);
    }
    if (out != nullptr) {
      const std::vector<float> written = read(kept, "kept"), expected = read(plain, "plain");
      EXPECT_TRUE(exact_with_report(name + " kept", std::span(written).first(kGroupRows * width),
                                    std::span(expected).first(kGroupRows * width)));
    }
  }
  EXPECT_TRUE(nonzero) << "every output was zero: the comparisons proved nothing";
  EXPECT_GT(input ? grouped[0]->telemetry.activation.casts : grouped[0]->telemetry.gradient.casts, 0);
  EXPECT_EQ(input ? grouped[1]->telemetry.activation.casts : grouped[1]->telemetry.gradient.casts, 0)
      << "a group without rows is not cast";
}

TEST(BackendOpsLlamaCasts, GroupedCastsAsOneOpPerGroup) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) {
    for (const Grouped op :
         {Grouped::gather_input, Grouped::swiglu_input, Grouped::gather_gradient, Grouped::swiglu_gradient}) {
      run_grouped(*backend, config, op, false);
      run_grouped(*backend, config, op, true);
    }
  }
}

TEST(BackendOpsLlamaCasts, RmsNormInputCastAsTheUnfusedOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) run_input_cast(*backend, config, Producer::rmsnorm);
}

TEST(BackendOpsLlamaCasts, SwigluInputCastAsTheUnfusedOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) run_input_cast(*backend, config, Producer::swiglu);
}

TEST(BackendOpsLlamaCasts, SwigluGradientCastAsTheUnfusedOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) {
    run_gradient_cast(*backend, config, true);
    run_gradient_cast(*backend, config, false);
  }
}

TEST(BackendOpsLlamaCasts, ExpertGatherInputCastAsTheUnfusedOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) run_input_cast(*backend, config, Producer::gather);
}

TEST(BackendOpsLlamaCasts, ExpertGatherGradientCastAsTheUnfusedOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const Config& config : configs()) run_gather_gradient_cast(*backend, config);
}

}  // namespace
