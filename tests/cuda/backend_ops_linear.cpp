// Linear layers on the CUDA backend against the CPU reference (harness: backend_ops_harness.h), in every GEMM
// mode: f32, bf16, f16, and FP8 under the delayed, current and static recipes with HYBRID and all-E4M3
// formats, as the model drives them: prepare_weight, linear_forward, linear_backward, several steps in a row
// so that the delayed recipe's amax history fills and rolls over, a restored (published) scaling state, and
// an evaluation forward that must leave the activation's state alone. Odd steps run the forward as a layer
// of the residual stream does (linear_forward with a residual epilogue), adding a residual to the output.
//
// Each side runs the whole sequence on its own and records, after every op, the outputs, the scaling state
// (fetched from the device) and the counters. The FP8 casts must be identical: the same states bit for bit,
// the same FP8/other GEMM counts and saturation/underflow counts. GEMM outputs are float32 on both sides
// (the forward's bias rounded alike to the GEMM's 16-bit type), so they differ only by accumulation order and
// the float32 rounding of the epilogue (and, on residual steps, the order of the additions). The tested
// backend runs the sequence twice: the same bits. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "octet/check.h"
#include "octet/numerics/minifloat.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Activation;
using octet::Backend;
using octet::ConstTensorView;
using octet::Dtype;
using octet::Epilogue;
using octet::Fp8LinearState;
using octet::GemmMode;
using octet::LinearExecution;
using octet::Normalization;
using octet::ScalingRecipe;
using octet::ScalingState;
using octet::TensorView;
using octet::testing::CompareOptions;
using octet::testing::random_normal;

struct LinearShape {
  int64_t N, C, OC;
  bool bias = true;
  std::string label() const {
    return shape_label({{"N", N}, {"C", C}, {"OC", OC}}) + (bias ? "" : " no bias");
  }
  // Hopper's FP8 GEMMs need every dimension a multiple of 16 (precision_policy.cpp holds layers to it).
  bool fp8_shape() const { return N % 16 == 0 && C % 16 == 0 && OC % 16 == 0; }
};

const std::vector<LinearShape> kFp8Shapes = {{16, 16, 16}, {32, 48, 64}, {64, 128, 96, false}};
const std::vector<LinearShape> kOddShapes = {{1, 1, 1}, {13, 7, 5}, {37, 24, 72}, {13, 24, 128, false}};

struct LinearConfig {
  std::string name;
  GemmMode forward, input_gradient, weight_gradient;
  std::shared_ptr<const ScalingRecipe> recipe;  // FP8 configs only
  octet::Fp8Formats formats;
  // The scales the operands' states start with (activation, weight, gradient), as a calibration file sets
  // them for the static recipe; zeros: the recipe's initial state as it is.
  std::array<float, 3> state_scales{};
  bool fp8() const { return recipe != nullptr; }
  bool prepares_weight() const { return forward != GemmMode::f32 || input_gradient != GemmMode::f32; }
  // The same layer with every FP8 GEMM in BF16: what a backend that routes FP8 GEMMs of unsupported shapes to
  // BF16 computes.
  LinearConfig in_bf16() const {
    auto wide = [](GemmMode m) { return m == GemmMode::fp8 ? GemmMode::bf16 : m; };
    return {name + " in bf16", wide(forward), wide(input_gradient), wide(weight_gradient), nullptr, formats};
  }
};

LinearConfig uniform(const std::string& name, GemmMode mode) {
  return {name, mode, mode, mode, nullptr, {}};
}
LinearConfig fp8(const std::string& name, std::shared_ptr<const ScalingRecipe> recipe,
                 GemmMode forward = GemmMode::fp8, GemmMode input_gradient = GemmMode::fp8,
                 GemmMode weight_gradient = GemmMode::fp8, Dtype gradient_format = Dtype::e5m2) {
  octet::Fp8Formats formats;
  formats.gradient = gradient_format;
  return {name, forward, input_gradient, weight_gradient, std::move(recipe), formats};
}

// --- what one side records ---

struct Counters {
  int64_t fp8_gemms = 0, other_gemms = 0, saturated = 0, underflowed = 0;
};

enum class Step { train, restore_then_train, eval };

struct OpRecord {
  std::string op;  // prepare_weight, linear_forward, linear_backward
  size_t step = 0;
  bool eval = false;
  std::vector<std::pair<std::string, std::vector<float>>> outputs;
  Fp8LinearState state;  // after the op
  Counters counters;     // after the op, cumulative
  bool refused = false;  // the op threw octet::Error; the sequence stopped there
  octet::ErrorKind refusal_kind = octet::ErrorKind::internal;
  std::string refusal;
};
using Trace = std::vector<OpRecord>;

// Host inputs of step `step`: fresh weights (as after an optimizer step) and activations whose size changes
// from step to step, so that delayed scaling lags behind and saturates, and gradients small enough for E5M2
// to underflow.
struct StepInputs {
  std::vector<float> weight, bias, inp, dout, dweight, dbias;
  std::vector<float> residual;  // [N, OC] on odd steps, whose forward adds it; empty on the others
};

StepInputs step_inputs(const LinearShape& s, size_t step) {
  const float inp_std[] = {1.0f, 4.0f, 0.25f, 2.0f, 1.0f, 3.0f, 0.5f};
  const float dout_std[] = {1e-2f, 1e-3f, 5e-2f, 2e-3f, 1e-2f, 1e-2f, 1e-3f};
  const size_t k = step % 7;
  const uint64_t seed = seed_of("linear", s.label() + " step " + std::to_string(step));
  StepInputs in{random_normal(s.OC * s.C, seed, 0.5f),
                random_normal(s.OC, seed + 1, 0.1f),
                random_normal(s.N * s.C, seed + 2, inp_std[k]),
                random_normal(s.N * s.OC, seed + 3, dout_std[k]),
                random_normal(s.OC * s.C, seed + 4, 1e-2f),
                random_normal(s.OC, seed + 5, 1e-2f),
                {}};
  // Every 13th element far below the rest, beyond the reach of any per-tensor scale (E4M3 spans about 2^17
  // from its smallest subnormal to its largest value, E5M2 2^32), so that every recipe's casts underflow; and
  // one exact zero, which is not an underflow.
  for (size_t i = 6; i < in.inp.size(); i += 13) in.inp[i] *= 1e-7f;
  for (size_t i = 6; i < in.dout.size(); i += 13) in.dout[i] *= 1e-11f;
  if (in.inp.size() > 1) in.inp[0] = 0.0f;
  if (in.dout.size() > 1) in.dout[0] = 0.0f;
  // Odd steps run the forward as a residual layer does (linear_forward with a residual epilogue): out =
  // residual + y.
  if (step % 2 == 1) in.residual = random_normal(s.N * s.OC, seed + 6, 2.0f);
  return in;
}

std::vector<Step> plan_for(const LinearConfig& config, const LinearShape& shape) {
  if (config.fp8() && shape.fp8_shape()) {
    // Six training steps (history 4 rolls over), the state of step 1 restored before step 3, then an eval.
    return {Step::train, Step::train, Step::train, Step::restore_then_train,
            Step::train, Step::train, Step::eval};
  }
  return {Step::train, Step::train, Step::eval};
}

// Runs the plan on one backend: every pointer comes from this backend's allocate().
Trace run_linear(Backend& backend, const LinearConfig& config, const LinearShape& s) {
  const int64_t N = s.N, C = s.C, OC = s.OC;
  auto state = std::make_unique<Fp8LinearState>();
  auto exec = std::make_unique<LinearExecution>();
  Counters counters;
  exec->forward = config.forward;
  exec->input_gradient = config.input_gradient;
  exec->weight_gradient = config.weight_gradient;
  if (config.fp8()) {
    exec->recipe = config.recipe.get();
    exec->formats = config.formats;
    *state = {config.recipe->initial_state(), config.recipe->initial_state(), config.recipe->initial_state()};
    if (config.state_scales[0] > 0.0f) {
      octet::ScalingState* operands[3] = {&state->activation, &state->weight, &state->gradient};
      for (size_t k = 0; k < 3; ++k) {
        operands[k]->scale = config.state_scales[k];
        operands[k]->scale_inv = 1.0f / config.state_scales[k];
      }
    }
    exec->state = state.get();
  }
  exec->fp8_gemms = &counters.fp8_gemms;
  exec->other_gemms = &counters.other_gemms;
  // Cast counts come from the layer's telemetry, which both backends fill (the CUDA backend on the device,
  // brought to the host by fetch_telemetry).
  octet::Fp8LinearTelemetry telemetry;
  exec->telemetry = &telemetry;

  const auto floats = [](size_t n) { return as_bytes(nan_filled(n)); };
  GuardedBuffer weight(backend, floats(OC * C)), bias(backend, floats(OC)), inp(backend, floats(N * C)),
      out(backend, floats(N * OC)), residual(backend, floats(N * OC)), dout(backend, floats(N * OC)),
      dinp(backend, floats(N * C)), dweight(backend, floats(OC * C)), dbias(backend, floats(OC));
  std::unique_ptr<octet::WeightCopy> copy;
  std::unique_ptr<octet::Fp8Tensor> input_codes, gradient_codes;
  Fp8LinearState restore_point;
  Trace trace;

  const auto read = [&](GuardedBuffer& buffer, const std::string& name, const std::string& op) {
    bool guards_ok = false;
    std::vector<float> values = as_floats(buffer.download(&guards_ok));
    EXPECT_TRUE(guards_ok) << backend.name() << " " << config.name << " " << s.label() << " " << op
                           << ": the guard bytes around '" << name << "' were overwritten";
    return values;
  };
  const auto unchanged = [&](GuardedBuffer& buffer, const std::vector<float>& uploaded,
                             const std::string& name, const std::string& op) {
    EXPECT_TRUE(bytes_identical(as_bytes(read(buffer, name, op)), as_bytes(uploaded), "input '" + name + "'"))
        << backend.name() << " " << config.name << " " << s.label() << " " << op << " changed an input";
  };
  // Runs one op; records what it wrote, or its refusal. False when it threw.
  const auto record = [&](const std::string& op, size_t step, bool eval, auto&& call, auto&& outputs) {
    OpRecord r;
    r.op = op, r.step = step, r.eval = eval;
    try {
      call();
      backend.synchronize();
      if (config.fp8()) {
        backend.fetch_scaling(*state);
        backend.fetch_telemetry(telemetry);
        counters.saturated =
            telemetry.activation.saturated + telemetry.weight.saturated + telemetry.gradient.saturated;
        counters.underflowed =
            telemetry.activation.underflowed + telemetry.weight.underflowed + telemetry.gradient.underflowed;
      }
    } catch (const octet::Error& e) {
      r.refused = true, r.refusal_kind = e.kind(), r.refusal = e.what();
    }
    r.state = *state;
    r.counters = counters;
    if (!r.refused) outputs(r);
    trace.push_back(std::move(r));
    return !trace.back().refused;
  };

  const std::vector<Step> plan = plan_for(config, s);
  for (size_t step = 0; step < plan.size(); ++step) {
    const StepInputs in = step_inputs(s, step);
    const bool eval = plan[step] == Step::eval;
    weight.upload(as_bytes(in.weight));
    bias.upload(as_bytes(in.bias));
    inp.upload(as_bytes(in.inp));
    dout.upload(as_bytes(in.dout));
    out.upload(floats(N * OC));  // NaN: an element left unwritten shows
    if (!in.residual.empty()) residual.upload(as_bytes(in.residual));
    dinp.upload(floats(N * C));
    dweight.upload(as_bytes(in.dweight));  // accumulated into
    dbias.upload(as_bytes(in.dbias));
    if (plan[step] == Step::restore_then_train && config.fp8()) {
      *state = restore_point;  // as a checkpoint restore does: change the host copy, publish it
      backend.publish_scaling(*state);
    }
    // The weight copy is remade after every optimizer step, evaluation or not; only the eval forward runs
    // with update_scaling false.
    exec->update_scaling = true;
    if (config.prepares_weight()) {
      const bool ok = record(
          "prepare_weight", step, false, [&] { backend.prepare_weight(copy, weight.floats(), OC, C, *exec); },
          [&](OpRecord&) { unchanged(weight, in.weight, "weight", "prepare_weight"); });
      if (!ok) return trace;
    }
    exec->update_scaling = !eval;
    float* bias_pointer = s.bias ? bias.floats() : nullptr;
    const bool forward_ok = record(
        "linear_forward", step, eval,
        [&] {
          if (in.residual.empty()) {
            backend.linear_forward(TensorView(out.floats(), {N, OC}), ConstTensorView(inp.floats(), {N, C}),
                                   ConstTensorView(weight.floats(), {OC, C}), copy.get(),
                                   {.bias = bias_pointer}, *exec, {&input_codes});
          } else {
            backend.linear_forward(TensorView(out.floats(), {N, OC}), ConstTensorView(inp.floats(), {N, C}),
                                   ConstTensorView(weight.floats(), {OC, C}), copy.get(),
                                   {.bias = bias_pointer, .residual = residual.floats()}, *exec,
                                   {&input_codes});
          }
        },
        [&](OpRecord& r) {
          r.outputs.emplace_back("out", read(out, "out", "linear_forward"));
          if (!in.residual.empty()) unchanged(residual, in.residual, "residual", "linear_forward");
          unchanged(inp, in.inp, "inp", "linear_forward");
          unchanged(weight, in.weight, "weight", "linear_forward");
          if (s.bias) unchanged(bias, in.bias, "bias", "linear_forward");
        });
    if (!forward_ok) return trace;
    if (eval) continue;
    float* dbias_pointer = s.bias ? dbias.floats() : nullptr;
    const bool backward_ok = record(
        "linear_backward", step, eval,
        [&] {
          backend.linear_backward(TensorView(dinp.floats(), {N, C}), TensorView(dweight.floats(), {OC, C}),
                                  dbias_pointer, ConstTensorView(dout.floats(), {N, OC}),
                                  ConstTensorView(inp.floats(), {N, C}),
                                  ConstTensorView(weight.floats(), {OC, C}), copy.get(), *exec,
                                  input_codes.get(), {&gradient_codes});
        },
        [&](OpRecord& r) {
          r.outputs.emplace_back("dinp", read(dinp, "dinp", "linear_backward"));
          r.outputs.emplace_back("dweight", read(dweight, "dweight", "linear_backward"));
          if (s.bias) r.outputs.emplace_back("dbias", read(dbias, "dbias", "linear_backward"));
          unchanged(dout, in.dout, "dout", "linear_backward");
          unchanged(inp, in.inp, "inp", "linear_backward");
        });
    if (!backward_ok) return trace;
    if (step == 1) restore_point = *state;
  }
  return trace;
}

// --- comparisons ---

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

void describe_difference(std::ostringstream& out, const char* operand, const ScalingState& a,
                         const ScalingState& e) {
  const auto field = [&](const char* name, float x, float y) {
    if (!same_bits(x, y)) out << "\n  " << operand << "." << name << ": " << x << " against " << y;
  };
  field("scale", a.scale, e.scale);
  field("scale_inv", a.scale_inv, e.scale_inv);
  field("last_amax", a.last_amax, e.last_amax);
  if (a.amax_history.size() != e.amax_history.size()) {
    out << "\n  " << operand << ".amax_history has " << a.amax_history.size() << " entries against "
        << e.amax_history.size();
  } else {
    for (size_t i = 0; i < a.amax_history.size(); ++i) {
      if (!same_bits(a.amax_history[i], e.amax_history[i])) {
        out << "\n  " << operand << ".amax_history[" << i << "]: " << a.amax_history[i] << " against "
            << e.amax_history[i];
      }
    }
  }
  if (a.updates != e.updates)
    out << "\n  " << operand << ".updates: " << a.updates << " against " << e.updates;
  if (a.degenerate_amax != e.degenerate_amax) {
    out << "\n  " << operand << ".degenerate_amax: " << a.degenerate_amax << " against " << e.degenerate_amax;
  }
}

// The scaling state bit for bit: scales, amaxes, histories, counts.
::testing::AssertionResult same_state(const Fp8LinearState& actual, const Fp8LinearState& expected) {
  std::ostringstream out;
  describe_difference(out, "activation", actual.activation, expected.activation);
  describe_difference(out, "weight", actual.weight, expected.weight);
  describe_difference(out, "gradient", actual.gradient, expected.gradient);
  if (!same_bits(actual.weight_copy_scale, expected.weight_copy_scale)) {
    out << "\n  weight_copy_scale: " << actual.weight_copy_scale << " against " << expected.weight_copy_scale;
  }
  if (out.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "scaling states differ (tested against reference):" << out.str();
}

// How much an operand of a GEMM in `mode` may differ from its float32 value, relative: half an ulp of BF16,
// FP16, E4M3 or E5M2 (identically on both backends; this only bounds the magnitude of the products).
double operand_rounding(GemmMode mode, Dtype fp8_format) {
  switch (mode) {
    case GemmMode::f32:
      return 0.0;
    case GemmMode::bf16:
      return std::ldexp(1.0, -8);
    case GemmMode::f16:
      return std::ldexp(1.0, -11);
    case GemmMode::fp8:
      return std::ldexp(1.0, -(octet::minifloat_spec(fp8_format).mantissa_bits + 1));
  }
  return 0.0;
}

// Float32 accumulation keeps 23 bits (no TF32 in f32 mode); Hopper's FP8 tensor cores accumulate with about
// 14 (DeepSeek-V3's measurement, docs FP8 facts), whatever cuBLASLt's fast-accumulation setting.
int accumulator_bits(GemmMode mode) {
  return mode == GemmMode::fp8 ? 14 : 23;
}

struct OutputCheck {
  CompareOptions options;
  std::vector<float> magnitude;
  std::string why;
};

// sum_k |a[i,k]| |b[j,k]| (1 + ra)(1 + rb) over a [M,K] and b [J,K] given as element accessors, plus
// `add[i,j]`.
template <typename A, typename B>
std::vector<float> product_terms(int64_t M, int64_t J, int64_t K, A a, B b, double slack,
                                 const std::vector<float>& add) {
  std::vector<float> terms(static_cast<size_t>(M * J));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < J; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < K; ++k) sum += std::fabs(static_cast<double>(a(i, k)) * b(j, k));
      terms[i * J + j] = static_cast<float>(sum * slack + (add.empty() ? 0.0 : std::fabs(add[i * J + j])));
    }
  }
  return terms;
}

OutputCheck check_for(const std::string& output, const LinearConfig& c, const LinearShape& s,
                      const StepInputs& in) {
  const int64_t N = s.N, C = s.C, OC = s.OC;
  const auto x = [&](int64_t n, int64_t k) { return in.inp[n * C + k]; };
  const auto w = [&](int64_t o, int64_t k) { return in.weight[o * C + k]; };
  const auto w_t = [&](int64_t k, int64_t o) { return in.weight[o * C + k]; };
  const auto dy = [&](int64_t n, int64_t o) { return in.dout[n * OC + o]; };
  const auto dy_t = [&](int64_t o, int64_t n) { return in.dout[n * OC + o]; };
  const auto x_t = [&](int64_t k, int64_t n) { return in.inp[n * C + k]; };
  const auto slack = [&](GemmMode m, Dtype a, Dtype b) {
    return (1.0 + operand_rounding(m, a)) * (1.0 + operand_rounding(m, b));
  };
  OutputCheck r;
  // Every output is float32 in every mode (backend.h): no rounding to a narrower output type to allow for.
  const std::string rule = "accumulator of 2^-bits over sum |a b| of the rounded operands";
  if (output == "out") {
    std::vector<float> bias(static_cast<size_t>(N * OC), 0.0f);
    for (int64_t n = 0; n < N && s.bias; ++n) {
      for (int64_t o = 0; o < OC; ++o) bias[n * OC + o] = in.bias[o];
    }
    r.options.dtype = Dtype::f32;
    r.options.reduction_length = gemm_reduction_length(C, accumulator_bits(c.forward));
    for (size_t i = 0; i < in.residual.size(); ++i) bias[i] += std::fabs(in.residual[i]);
    r.magnitude =
        product_terms(N, OC, C, x, w, slack(c.forward, c.formats.activation, c.formats.weight), bias);
    r.why = "forward: " + rule + ", K = C, plus |bias| (rounded alike on both sides) and |residual|";
  } else if (output == "dinp") {
    r.options.dtype = Dtype::f32;
    r.options.reduction_length = gemm_reduction_length(OC, accumulator_bits(c.input_gradient));
    r.magnitude =
        product_terms(N, C, OC, dy, w_t, slack(c.input_gradient, c.formats.gradient, c.formats.weight), {});
    r.why = "input gradient: " + rule + ", K = OC";
  } else if (output == "dweight") {
    r.options.dtype = Dtype::f32;  // accumulated in float32 in every mode
    r.options.reduction_length = gemm_reduction_length(N, accumulator_bits(c.weight_gradient));
    r.magnitude = product_terms(
        OC, C, N, dy_t, x_t, slack(c.weight_gradient, c.formats.gradient, c.formats.activation), in.dweight);
    r.why = "weight gradient: " + rule + ", K = N, plus the old value";
  } else {  // dbias: column sums of dout in float32, in every mode
    r.options.dtype = Dtype::f32;
    r.options.reduction_length = N + 1;
    r.magnitude = in.dbias;
    for (float& m : r.magnitude) m = std::fabs(m);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t o = 0; o < OC; ++o) r.magnitude[o] += std::fabs(dy(n, o));
    }
    r.why = "bias gradient: a float32 sum over N rows plus the old value";
  }
  return r;
}

int64_t expected_fp8_gemms(const LinearConfig& c, const std::string& op) {
  if (op == "linear_forward") return c.forward == GemmMode::fp8 ? 1 : 0;
  if (op == "linear_backward") {
    return (c.input_gradient == GemmMode::fp8 ? 1 : 0) + (c.weight_gradient == GemmMode::fp8 ? 1 : 0);
  }
  return 0;
}

int64_t gemms_of(const std::string& op) {
  return op == "linear_forward" ? 1 : op == "linear_backward" ? 2 : 0;
}

// Holds the tested trace to the reference; `bf16_reference` (FP8 configs on shapes FP8 GEMMs cannot take)
// is the same layer computed in BF16, what a backend that routes such GEMMs to BF16 must match.
void compare_traces(const Trace& expected, const Trace& actual, const Trace* bf16_reference,
                    const LinearConfig& config, const LinearShape& s) {
  Counters previous_expected, previous_actual;
  // A backend that routes FP8 GEMMs elsewhere may skip their casts from prepare_weight on, so that the
  // scaling states no longer correspond: they are compared only where every FP8 GEMM ran in FP8.
  const size_t common = std::min(expected.size(), actual.size());
  const bool fell_back =
      common > 0 && (actual[common - 1].refused ||
                     actual[common - 1].counters.fp8_gemms < expected[common - 1].counters.fp8_gemms);
  if (fell_back)
    std::printf("  %s %s: FP8 GEMMs routed elsewhere; scaling states not compared\n", config.name.c_str(),
                s.label().c_str());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_LT(i, actual.size()) << "the tested backend stopped early";
    const OpRecord& e = expected[i];
    const OpRecord& a = actual[i];
    const std::string label = config.name + " " + s.label() + " step " + std::to_string(e.step) + " " + e.op;
    SCOPED_TRACE(label);
    ASSERT_FALSE(e.refused) << "the reference refused: " << e.refusal;
    if (a.refused) {
      // A clear refusal of a shape FP8 GEMMs cannot take is acceptable; anything else is not.
      ASSERT_TRUE(config.fp8() && !s.fp8_shape() && a.refusal_kind == octet::ErrorKind::invalid_input)
          << "the tested backend threw: " << a.refusal;
      std::printf("  %-64s refused clearly: %s\n", label.c_str(), a.refusal.c_str());
      return;
    }
    const int64_t fp8_expected = e.counters.fp8_gemms - previous_expected.fp8_gemms;
    const int64_t fp8_actual = a.counters.fp8_gemms - previous_actual.fp8_gemms;
    const int64_t other_expected = e.counters.other_gemms - previous_expected.other_gemms;
    const int64_t other_actual = a.counters.other_gemms - previous_actual.other_gemms;
    previous_expected = e.counters;
    previous_actual = a.counters;
    EXPECT_EQ(fp8_expected, expected_fp8_gemms(config, e.op)) << "the reference's FP8 GEMM count";
    EXPECT_EQ(fp8_expected + other_expected, gemms_of(e.op)) << "every GEMM of the reference counted once";
    EXPECT_EQ(fp8_actual + other_actual, gemms_of(e.op)) << "every GEMM counted once, as FP8 or as other";
    const bool same_path = fp8_actual == fp8_expected;
    if (!same_path) {
      // Fewer FP8 GEMMs than asked for: only on shapes FP8 GEMMs cannot take, and counted as other GEMMs.
      EXPECT_FALSE(s.fp8_shape()) << "ran " << fp8_actual << " of " << fp8_expected
                                  << " FP8 GEMMs on a shape FP8 GEMMs support";
      EXPECT_LT(fp8_actual, fp8_expected);
      EXPECT_EQ(other_actual - other_expected, fp8_expected - fp8_actual)
          << "routed GEMMs count as other GEMMs";
      std::printf("  %-64s %lld of %lld FP8 GEMMs routed elsewhere, counted as other GEMMs\n", label.c_str(),
                  static_cast<long long>(fp8_expected - fp8_actual), static_cast<long long>(fp8_expected));
    }
    if (config.fp8() && !fell_back) {
      EXPECT_TRUE(same_state(a.state, e.state)) << "the FP8 casts differ";
      EXPECT_EQ(a.counters.saturated, e.counters.saturated) << "saturated elements of the FP8 casts";
      EXPECT_EQ(a.counters.underflowed, e.counters.underflowed) << "underflowed elements of the FP8 casts";
    }
    if (e.eval && config.fp8() && i > 0) {
      // Evaluation leaves the activation's scaling state as the last training op left it, on both sides.
      EXPECT_TRUE(same_state(e.state, expected[i - 1].state))
          << "the reference's eval forward changed the state";
      EXPECT_TRUE(same_state(a.state, actual[i - 1].state)) << "the eval forward changed the scaling state";
    }
    const StepInputs in = step_inputs(s, e.step);
    ASSERT_EQ(a.outputs.size(), e.outputs.size());
    for (size_t k = 0; k < e.outputs.size(); ++k) {
      const auto& [name, expected_values] = e.outputs[k];
      const std::vector<float>& actual_values = a.outputs[k].second;
      EXPECT_TRUE(octet::testing::has_nonzero(expected_values))
          << name << ": an all-zero reference proves nothing";
      OutputCheck check = check_for(name, config, s, in);
      check.options.magnitude = check.magnitude;
      const std::string output_label = label + " " + name;
      if (same_path || bf16_reference == nullptr) {
        EXPECT_TRUE(close_with_report(output_label, actual_values, expected_values, check.options))
            << "tolerance: " << check.why;
        continue;
      }
      // Routed elsewhere: the output must be the FP8 result or the BF16 one, each within its own tolerance.
      const ::testing::AssertionResult as_fp8 =
          close_with_report(output_label + " (as FP8)", actual_values, expected_values, check.options);
      const OpRecord& b = (*bf16_reference)[i];
      const LinearConfig wide = config.in_bf16();
      OutputCheck wide_check = check_for(name, wide, s, in);
      wide_check.options.magnitude = wide_check.magnitude;
      const ::testing::AssertionResult as_bf16 = close_with_report(output_label + " (as BF16)", actual_values,
                                                                   b.outputs[k].second, wide_check.options);
      EXPECT_TRUE(as_fp8 || as_bf16) << "neither the FP8 nor the BF16 result:\n"
                                     << as_fp8.message() << "\n"
                                     << as_bf16.message();
    }
  }
  EXPECT_EQ(actual.size(), expected.size()) << "the tested backend ran more ops than the reference";
}

// The same backend twice from the same start: identical outputs, states and counters.
void expect_deterministic(const Trace& first, const Trace& second, const std::string& label) {
  ASSERT_EQ(first.size(), second.size()) << label;
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_EQ(first[i].outputs.size(), second[i].outputs.size());
    for (size_t k = 0; k < first[i].outputs.size(); ++k) {
      EXPECT_TRUE(bytes_identical(as_bytes(second[i].outputs[k].second), as_bytes(first[i].outputs[k].second),
                                  first[i].outputs[k].first))
          << label << " step " << first[i].step << " " << first[i].op << " is not deterministic";
    }
    EXPECT_TRUE(same_state(second[i].state, first[i].state)) << label << " " << first[i].op;
    EXPECT_EQ(second[i].counters.saturated, first[i].counters.saturated);
    EXPECT_EQ(second[i].counters.underflowed, first[i].counters.underflowed);
    EXPECT_EQ(second[i].counters.fp8_gemms, first[i].counters.fp8_gemms);
  }
}

void run_config(Backend& reference, Backend& tested, const LinearConfig& config, const LinearShape& s) {
  SCOPED_TRACE(config.name + " " + s.label());
  std::printf("[ op ] linear %s %s\n", config.name.c_str(), s.label().c_str());
  const Trace expected = run_linear(reference, config, s);
  const Trace actual = run_linear(tested, config, s);
  Trace bf16;
  if (config.fp8() && !s.fp8_shape()) bf16 = run_linear(reference, config.in_bf16(), s);
  compare_traces(expected, actual, bf16.empty() ? nullptr : &bf16, config, s);
  if (config.fp8() && !expected.empty() && s.N * s.C > 13) {
    // The cast counts compared above must have had something to count.
    const Counters& total = expected.back().counters;
    std::printf("  %s %s: %lld FP8 GEMMs, %lld other; casts saturated %lld, underflowed %lld elements\n",
                config.name.c_str(), s.label().c_str(), static_cast<long long>(total.fp8_gemms),
                static_cast<long long>(total.other_gemms), static_cast<long long>(total.saturated),
                static_cast<long long>(total.underflowed));
    EXPECT_GT(total.saturated + total.underflowed, 0)
        << "inputs that exercise neither saturation nor underflow";
  }
  const Trace again = run_linear(tested, config, s);
  expect_deterministic(actual, again, config.name + " " + s.label());
}

std::vector<LinearConfig> fp8_configs() {
  auto delayed = std::make_shared<octet::DelayedScaling>(16, octet::AmaxAlgorithm::max, 0);
  auto delayed_short = std::make_shared<octet::DelayedScaling>(4, octet::AmaxAlgorithm::most_recent, 1);
  auto current = std::make_shared<octet::CurrentScaling>(0);
  auto fixed = std::make_shared<octet::StaticScaling>(64.0f);  // E4M3 saturates beyond |x| = 7
  // The static recipe with per-operand scales in the states, as from a calibration file: each cast must use
  // its operand's scale, not the recipe's.
  LinearConfig calibrated = fp8("fp8 static, per-operand scales 8, 256, 4096 hybrid", fixed);
  calibrated.state_scales = {8.0f, 256.0f, 4096.0f};
  return {fp8("fp8 delayed hybrid", delayed),
          calibrated,
          fp8("fp8 delayed(4, most recent, margin 1) hybrid", delayed_short),
          fp8("fp8 current hybrid", current),
          fp8("fp8 static hybrid", fixed),
          fp8("fp8 delayed all-e4m3", delayed, GemmMode::fp8, GemmMode::fp8, GemmMode::fp8, Dtype::e4m3),
          fp8("fp8 forward+dgrad, bf16 wgrad", delayed, GemmMode::fp8, GemmMode::fp8, GemmMode::bf16),
          fp8("fp8 forward+wgrad, bf16 dgrad", current, GemmMode::fp8, GemmMode::bf16, GemmMode::fp8),
          fp8("bf16 forward+wgrad, fp8 dgrad", delayed, GemmMode::bf16, GemmMode::fp8, GemmMode::bf16)};
}

TEST(BackendOpsLinear, WideModes) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  for (const LinearConfig& config :
       {uniform("f32", GemmMode::f32), uniform("bf16", GemmMode::bf16), uniform("f16", GemmMode::f16)}) {
    for (const std::vector<LinearShape>* shapes : {&kOddShapes, &kFp8Shapes}) {
      for (const LinearShape& s : *shapes) run_config(*reference, *tested, config, s);
    }
  }
}

TEST(BackendOpsLinear, Fp8RecipesOverSteps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  for (const LinearConfig& config : fp8_configs()) {
    for (const LinearShape& s : kFp8Shapes) run_config(*reference, *tested, config, s);
  }
}

// Shapes that are not multiples of 16: the tested backend runs them in FP8 (and matches), routes them to BF16
// and counts them as other GEMMs, or refuses them with invalid_input; never silently something else.
TEST(BackendOpsLinear, Fp8OnShapesFp8GemmsCannotTake) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  const std::vector<LinearConfig> configs = fp8_configs();
  for (const LinearShape& s : kOddShapes) {
    run_config(*reference, *tested, configs[0], s);
    run_config(*reference, *tested, configs[2], s);
  }
}

// Block and MXFP8 scaling: the CUDA backend refuses them clearly (octet::Error, invalid_input) when the layer
// is prepared or run; running them without a word is a failure.
TEST(BackendOpsLinear, BlockAndMxRecipesAreRefusedClearly) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto tested = make_tested_backend();
  const LinearShape s{128, 128, 128};
  for (const LinearConfig& config : {fp8("fp8 block", std::make_shared<octet::BlockScaling>(false)),
                                     fp8("fp8 mxfp8", std::make_shared<octet::MxScaling>())}) {
    const Trace trace = run_linear(*tested, config, s);
    ASSERT_FALSE(trace.empty());
    const OpRecord& last = trace.back();
    EXPECT_TRUE(last.refused) << config.name << " ran " << trace.size() << " ops without refusing";
    if (last.refused) {
      EXPECT_EQ(last.refusal_kind, octet::ErrorKind::invalid_input) << last.refusal;
      std::printf("  %s refused at %s: %s\n", config.name.c_str(), last.op.c_str(), last.refusal.c_str());
    }
  }
}

// AdamW over a linear layer's bias, told whose weight copy it belongs to (UpdateSegment::bias_of), may keep
// the bias as the next forward's epilogue reads it (rounded to BF16). That forward must give the bits of one
// that rounds the bias afresh (bias_of null), step after step: in FP8, and in BF16 with float32 and bf16
// outputs. A bias that AdamW updates without being told whose it is must be read anew, and so must one
// changed outside AdamW and then prepared as the model does (prepare_weight).
TEST(BackendOpsLinear, AdamWKeepsTheForwardsRoundedBias) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const int64_t N = 64, C = 128, OC = 96, W = OC * C;
  struct Mode {
    LinearConfig config;
    Dtype out_type;
  };
  const auto delayed = std::make_shared<octet::DelayedScaling>(16, octet::AmaxAlgorithm::max, 0);
  const std::vector<Mode> modes = {{fp8("fp8 delayed hybrid", delayed), Dtype::f32},
                                   {uniform("bf16", GemmMode::bf16), Dtype::f32},
                                   {uniform("bf16, bf16 output", GemmMode::bf16), Dtype::bf16}};
  for (const Mode& mode : modes) {
    SCOPED_TRACE(mode.config.name);
    // Side 0 names the bias's layer to AdamW, side 1 does not; both start from the same values.
    struct Side {
      std::unique_ptr<Backend> backend;
      std::unique_ptr<octet::Buffer> params, m, v, grads, inp, out;
      std::unique_ptr<octet::WeightCopy> copy;
      std::unique_ptr<octet::Fp8Tensor> input_codes;
      Fp8LinearState state;
      LinearExecution exec;
    };
    const std::vector<float> params0 = [&] {
      std::vector<float> p = random_normal(W + OC, 7001, 0.05f);
      for (int64_t i = W; i < W + OC; ++i) p[static_cast<size_t>(i)] *= 20.0f;  // the bias, about 1
      return p;
    }();
    const std::vector<float> inp = random_normal(N * C, 7002, 1.0f);
    const std::vector<float> zeros(static_cast<size_t>(W + OC), 0.0f);
    Side sides[2];
    for (Side& side : sides) {
      side.backend = make_tested_backend();
      Backend& b = *side.backend;
      const auto buffer = [&](size_t floats, const float* values) {
        auto buf = b.allocate(floats * sizeof(float));
        if (values != nullptr) b.copy_from_host(buf->data(), values, floats * sizeof(float));
        return buf;
      };
      side.params = buffer(params0.size(), params0.data());
      side.m = buffer(zeros.size(), zeros.data());
      side.v = buffer(zeros.size(), zeros.data());
      side.grads = buffer(zeros.size(), nullptr);
      side.inp = buffer(inp.size(), inp.data());
      side.out = buffer(static_cast<size_t>(N * OC), nullptr);
      side.exec.forward = mode.config.forward;
      side.exec.input_gradient = mode.config.input_gradient;
      side.exec.weight_gradient = mode.config.weight_gradient;
      if (mode.config.fp8()) {
        side.exec.recipe = mode.config.recipe.get();
        side.exec.formats = mode.config.formats;
        const ScalingState initial = mode.config.recipe->initial_state();
        side.state = {initial, initial, initial};
        side.exec.state = &side.state;
      }
      b.prepare_weight(side.copy, side.params->floats(), OC, C, side.exec);
    }
    const auto forward = [&](Side& side) {
      float* params = side.params->floats();
      side.backend->linear_forward(
          TensorView(side.out->data(), mode.out_type, {N, OC}), ConstTensorView(side.inp->floats(), {N, C}),
          ConstTensorView(params, {OC, C}), side.copy.get(), {.bias = params + W}, side.exec,
          {&side.input_codes});
      const size_t bytes = static_cast<size_t>(N * OC) * (mode.out_type == Dtype::bf16 ? 2 : 4);
      std::vector<uint8_t> host(bytes);
      side.backend->copy_to_host(host.data(), side.out->data(), bytes);
      return host;
    };
    const auto adamw = [&](Side& side, int64_t step, bool name_layer) {
      Backend& b = *side.backend;
      const std::vector<float> grads = random_normal(W + OC, 7100 + static_cast<uint64_t>(step), 1.0f);
      b.copy_from_host(side.grads->data(), grads.data(), grads.size() * sizeof(float));
      const Backend::UpdateSegment segments[] = {
          {.offset = 0,
           .count = W,
           .weight_decay = 0.1f,
           .copy = &side.copy,
           .exec = &side.exec,
           .rows = OC,
           .cols = C},
          {.offset = W, .count = OC, .bias_of = name_layer ? side.copy.get() : nullptr}};
      b.optimizer_update({1e-2f, 0.9f, 0.95f, 1e-8f, step, 1.0f},
                         {side.params->floats(), side.m->floats(), side.v->floats(), side.grads->floats()},
                         segments);
    };
    std::vector<uint8_t> previous = forward(sides[0]);
    EXPECT_TRUE(bytes_identical(previous, forward(sides[1]), "the first forward"));
    for (int64_t step = 1; step <= 5; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (int k = 0; k < 2; ++k) adamw(sides[k], step, k == 0 && step != 2);  // step 2: not named
      if (step == 4) {
        // The bias moves outside AdamW (a checkpoint's, say), then the weight copies are made again.
        std::vector<float> bias = random_normal(OC, 7200, 1.0f);
        for (Side& side : sides) {
          side.backend->copy_from_host(side.params->floats() + W, bias.data(), bias.size() * sizeof(float));
          side.backend->prepare_weight(side.copy, side.params->floats(), OC, C, side.exec);
        }
      }
      const std::vector<uint8_t> kept = forward(sides[0]);
      EXPECT_TRUE(bytes_identical(kept, forward(sides[1]), "a forward after AdamW"));
      EXPECT_FALSE(kept == previous) << "the forward's output did not change with the weights and bias";
      // The same copy again: a second forward reads what the first read.
      EXPECT_TRUE(bytes_identical(forward(sides[0]), kept, "the forward again"));
      previous = kept;
    }
  }
}

// linear_recompute runs an FP8 layer's last forward GEMM again from the input codes that forward kept
// (LinearExecution::keep_input_codes), for a backward that did not keep the output: it must write the very
// bits of that forward, with the residual epilogue of a layer whose output joins the residual stream
// (fp8.recompute_residual) and with the bf16 output of the MLP's hidden activation (fp8.recompute_mlp),
// cast nothing and count no GEMM. Under delayed and current scaling, for two steps (the second forward casts
// with the scale the first one's amax moved).
TEST(BackendOpsLinear, RecomputeGivesTheBitsOfTheForwardItRepeats) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const int64_t N = 64, C = 128, OC = 96, W = OC * C;
  const auto delayed = std::make_shared<octet::DelayedScaling>(16, octet::AmaxAlgorithm::max, 0);
  const auto current = std::make_shared<octet::CurrentScaling>(0);
  struct Output {
    const char* name;
    Dtype type;
    bool residual;
  };
  for (const LinearConfig& config :
       {fp8("fp8 delayed hybrid", delayed), fp8("fp8 current hybrid", current)}) {
    for (const Output& output :
         {Output{"float32 output with a residual", Dtype::f32, true},
          Output{"bf16 output", Dtype::bf16, false}, Output{"float32 output", Dtype::f32, false}}) {
      SCOPED_TRACE(config.name + ", " + output.name);
      const auto backend = make_tested_backend();
      Backend& b = *backend;
      const auto buffer = [&](const std::vector<float>& values) {
        auto buf = b.allocate(values.size() * sizeof(float));
        b.copy_from_host(buf->data(), values.data(), values.size() * sizeof(float));
        return buf;
      };
      const std::vector<float> params = random_normal(W + OC, 7301, 0.05f);
      const std::vector<float> residual = random_normal(N * OC, 7302, 1.0f);
      const auto weights = buffer(params);
      const auto residual_buffer = buffer(residual);
      const auto out = b.allocate(static_cast<size_t>(N * OC) * sizeof(float));
      const auto again = b.allocate(static_cast<size_t>(N * OC) * sizeof(float));
      const float* residual_data = output.residual ? residual_buffer->floats() : nullptr;
      Fp8LinearState state;
      const ScalingState initial = config.recipe->initial_state();
      state = {initial, initial, initial};
      int64_t fp8_gemms = 0;
      LinearExecution exec;
      exec.forward = config.forward;
      exec.input_gradient = config.input_gradient;
      exec.weight_gradient = config.weight_gradient;
      exec.recipe = config.recipe.get();
      exec.formats = config.formats;
      exec.state = &state;
      exec.keep_input_codes = true;
      exec.fp8_gemms = &fp8_gemms;
      std::unique_ptr<octet::WeightCopy> copy;
      std::unique_ptr<octet::Fp8Tensor> input_codes;
      b.prepare_weight(copy, weights->floats(), OC, C, exec);
      const ConstTensorView weight(weights->floats(), {OC, C});
      const Epilogue epilogue{.bias = weights->floats() + W, .residual = residual_data};
      const size_t bytes = static_cast<size_t>(N * OC) * (output.type == Dtype::bf16 ? 2 : 4);
      for (int step = 0; step < 2; ++step) {
        const auto inp = buffer(random_normal(N * C, 7310 + static_cast<uint64_t>(step), 1.0f));
        b.linear_forward(TensorView(out->data(), output.type, {N, OC}),
                         ConstTensorView(inp->floats(), {N, C}), weight, copy.get(), epilogue, exec,
                         {&input_codes});
        const int64_t counted = fp8_gemms;
        b.fetch_scaling(state);
        const Fp8LinearState before = state;
        b.linear_recompute(TensorView(again->data(), output.type, {N, OC}), weight, copy.get(), epilogue,
                           exec, *input_codes);
        std::vector<uint8_t> forward_bytes(bytes), recomputed_bytes(bytes);
        b.copy_to_host(forward_bytes.data(), out->data(), bytes);
        b.copy_to_host(recomputed_bytes.data(), again->data(), bytes);
        EXPECT_TRUE(bytes_identical(recomputed_bytes, forward_bytes, "the recomputed output"));
        EXPECT_EQ(fp8_gemms, counted) << "a recompute counts no GEMM";
        EXPECT_EQ(counted, step + 1) << "each forward counts its FP8 GEMM";
        b.fetch_scaling(state);
        EXPECT_EQ(state.activation.scale, before.activation.scale) << "a recompute changes no scaling state";
        EXPECT_EQ(state.activation.updates, before.activation.updates) << "a recompute records no amax";
        EXPECT_EQ(state.activation.amax_history, before.activation.amax_history);
        if (output.type == Dtype::f32) {
          const std::vector<float> values = as_floats(forward_bytes);
          bool differs_from_residual = false;
          for (size_t i = 0; i < values.size(); ++i) {
            ASSERT_TRUE(std::isfinite(values[i])) << i;
            differs_from_residual = differs_from_residual || values[i] != residual[i];
          }
          EXPECT_TRUE(differs_from_residual) << "the layer's output was added";
        }
      }
    }
  }
}

}  // namespace
