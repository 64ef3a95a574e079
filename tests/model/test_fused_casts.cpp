// GPT-2 trained with the producer-fused FP8 casts (LayerNorm and GELU casting the input of the FP8 layer they
// feed, GELU's backward casting the output gradient of mlp.c_fc and summing its bias gradient) against the
// same model with every fusion undone by a wrapper around the CPU backend: the plain op writes its float32
// result, and the consumer's own linear_forward or linear_backward casts it (and sums the bias gradient), as
// a model without the fused ops would. The CPU backend is the reference, so the two must train to the very
// same bits: losses, weights, scaling states and cast telemetry, under every recipe, with a layer moved to
// BF16 mid-run. The same harness holds the storage of the MLP's hidden tensors in bf16 to the CPU backend's
// rounded float32 storage.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "forwarding_backend.h"
#include "model_fixture.h"
#include "octet/numerics/minifloat.h"
#include "telemetry_compare.h"

namespace octet {
namespace {

using testing::expect_same_telemetry;
using testing::mode;
using testing::tiny_config;

// The CPU backend with the producers' casts taken back to the consumers. Every other op passes through.
class UnfusedCasts final : public testing::ForwardingBackend {
 public:
  explicit UnfusedCasts(Backend& inner) : ForwardingBackend(inner) {}
  std::string_view name() const override { return "cpu, unfused casts"; }

  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             const Fp8CastTarget& cast_for) override {
    const TensorView y = cast_for.given() ? hold_input(*cast_for.layer, out) : out;
    inner_.normalization_forward(kind, y, mean, rstd, inp, weight, bias, {});
  }
  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override {
    const TensorView y = cast_for.given() ? hold_input(*cast_for.layer, out) : out;
    inner_.activation_forward(kind, y, inp, {});
  }
  // The consumer's own cast of the values its producer was asked to cast.
  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override {
    ConstTensorView x = inp;
    const auto it = inputs_.find(&exec);
    EXPECT_EQ(input.cast_by_producer, it != inputs_.end()) << "the model says whose cast the forward takes";
    if (it != inputs_.end()) {
      x.data = it->second;
      inputs_.erase(it);
    }
    inner_.linear_forward(out, x, weight, copy, epilogue, exec, {input.tensor, false});
  }
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) override {
    inner_.linear_recompute(out, weight, copy, epilogue, exec, input);
    ++recomputed_;
  }
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias,
                           const Fp8CastTarget& cast_for) override {
    if (!cast_for.given()) {
      inner_.activation_backward(kind, dinp, inp, dout, dbias, {});
      return;
    }
    EXPECT_TRUE(casts_gradient(*cast_for.layer));
    TensorView d = dinp;
    if (!d.has_data()) {
      std::vector<float>& held = held_[cast_for.layer];
      held.resize(static_cast<size_t>(d.numel()));
      d.data = held.data();
    }
    inner_.activation_backward(kind, d, inp, dout, nullptr, {});
    gradients_[cast_for.layer] = {d.f32(), dbias};
    ++fused_backward_;
  }
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override {
    ConstTensorView dy = dout;
    const auto it = gradients_.find(&exec);
    EXPECT_EQ(gradient.cast_by_producer, it != gradients_.end()) << "the model says whose cast it takes";
    if (it != gradients_.end()) {
      EXPECT_EQ(dbias, nullptr) << "the producer summed the bias gradient";
      dy.data = it->second.dout;
      dbias = it->second.dbias;
      gradients_.erase(it);
    }
    inner_.linear_backward(dinp, dweight, dbias, dy, inp, weight, copy, exec, input,
                           {gradient.tensor, false});
  }
  // A mixture of experts' gather of an expert's rows, cast for its input or its output gradient.
  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override {
    if (!cast_for.given()) {
      inner_.gather_rows(out, src, index, divisor, scale, {}, cast_as);
      return;
    }
    ++gathers_cast_;
    if (cast_as == TensorRole::activation) {
      inner_.gather_rows(hold_input(*cast_for.layer, out), src, index, divisor, scale, {}, cast_as);
      return;
    }
    EXPECT_TRUE(casts_gradient(*cast_for.layer));
    TensorView d = out;
    if (!d.has_data()) {
      std::vector<float>& held = held_[cast_for.layer];
      held.resize(static_cast<size_t>(d.numel()));
      d.data = held.data();
    }
    inner_.gather_rows(d, src, index, divisor, scale, {}, cast_as);
    gradients_[cast_for.layer] = {d.f32(), nullptr};
  }
  // How many GELU backwards the model fused with a gradient cast.
  int64_t fused_backward() const { return fused_backward_; }
  // How many gathers of rows the model asked to cast.
  int64_t gathers_cast() const { return gathers_cast_; }
  // How many forward GEMMs the backward ran again (fp8.recompute_mlp, _qkv, _residual).
  int64_t recomputed() const { return recomputed_; }

 private:
  // Where a producer's float32 output goes: `out`, or a buffer held for the consumer when the model keeps
  // none. The consumer's next linear_forward reads it.
  TensorView hold_input(LinearExecution& consumer, const TensorView& out) {
    EXPECT_EQ(consumer.forward, GemmMode::fp8);
    TensorView y = out;
    if (!y.has_data()) {
      std::vector<float>& held = held_[&consumer];
      held.resize(static_cast<size_t>(y.numel()));
      y.data = held.data();
    }
    inputs_[&consumer] = y.f32();
    return y;
  }

  struct Gradient {
    const float* dout;
    float* dbias;
  };
  std::unordered_map<const LinearExecution*, std::vector<float>> held_;
  std::unordered_map<const LinearExecution*, const float*> inputs_;
  std::unordered_map<const LinearExecution*, Gradient> gradients_;
  int64_t fused_backward_ = 0;
  int64_t recomputed_ = 0;
  int64_t gathers_cast_ = 0;
};

struct TrainingRecord {
  std::vector<float> losses;
  std::vector<float> params;
  std::vector<Fp8LinearState> states;
  std::vector<Fp8LinearTelemetry> telemetry;
  float eval_loss = 0.0f;
};

// Four steps, `moved` (h.1.mlp.c_fc unless said) moved to BF16 after the second (the fused path stops for it
// mid-run), then an evaluation.
TrainingRecord train(Backend& backend, const PrecisionSettings& precision,
                     const char* moved = "h.1.mlp.c_fc", const ModelConfig& c = tiny_config()) {
  Decoder model(c, backend, PrecisionPolicy(precision, c, 32), 2, 16);
  model.init_weights(21);
  model.set_telemetry(true, true);
  TrainSettings s;
  s.batch_size = 2;
  s.seq_len = 16;
  Trainer trainer(model, s);
  const BatchSource data = testing::pattern_stream(8, 2, 16, c.vocab_size);
  TrainingRecord run;
  for (int step = 0; step < 4; ++step) {
    if (step == 2) model.move_layer_to_bf16(moved, "BF16 by test");
    run.losses.push_back(trainer.step(data).loss);
  }
  run.eval_loss = trainer.evaluate(data, 1);
  run.params.assign(model.params(), model.params() + model.parameter_count());
  for (const LinearPlan& plan : model.policy().layers()) {
    if (Fp8LinearState* state = model.fp8_state(plan.name)) run.states.push_back(*state);
    if (Fp8LinearTelemetry* telemetry = model.telemetry(plan.name)) run.telemetry.push_back(*telemetry);
  }
  return run;
}

void expect_same_state(const ScalingState& a, const ScalingState& e, const std::string& what) {
  EXPECT_EQ(std::memcmp(&a.scale, &e.scale, sizeof(float)), 0) << what << " scale";
  EXPECT_EQ(std::memcmp(&a.scale_inv, &e.scale_inv, sizeof(float)), 0) << what << " scale_inv";
  EXPECT_EQ(a.amax_history, e.amax_history) << what;
  EXPECT_EQ(a.updates, e.updates) << what;
  EXPECT_EQ(a.degenerate_amax, e.degenerate_amax) << what;
}

// Two runs that must have trained bit for bit alike: losses, weights, scaling states and telemetry.
void expect_same_training(const TrainingRecord& a, const TrainingRecord& b, RecipeKind recipe) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
  EXPECT_EQ(a.eval_loss, b.eval_loss);
  EXPECT_TRUE(a.params == b.params) << "the weights after training";
  ASSERT_EQ(a.states.size(), b.states.size());
  for (size_t i = 0; i < a.states.size(); ++i) {
    const std::string layer = "FP8 layer " + std::to_string(i);
    expect_same_state(a.states[i].activation, b.states[i].activation, layer + " activation");
    expect_same_state(a.states[i].weight, b.states[i].weight, layer + " weight");
    expect_same_state(a.states[i].gradient, b.states[i].gradient, layer + " gradient");
    if (recipe != RecipeKind::block) {  // block scales keep no state
      EXPECT_GT(a.states[i].gradient.updates, 0) << layer;
    }
  }
  ASSERT_EQ(a.telemetry.size(), b.telemetry.size());
  for (size_t i = 0; i < a.telemetry.size(); ++i) {
    const std::string layer = "FP8 layer " + std::to_string(i);
    expect_same_telemetry(a.telemetry[i].activation, b.telemetry[i].activation, layer + " activation");
    expect_same_telemetry(a.telemetry[i].gradient, b.telemetry[i].gradient, layer + " gradient");
  }
}

// FP8 mode with `recipe`, a short amax history and a static scale that suits the tiny model.
PrecisionSettings fp8_with(RecipeKind recipe) {
  PrecisionSettings precision = mode(MixedPrecision::fp8);
  precision.recipe = recipe;
  precision.amax_history = 4;
  precision.static_scale = 64.0f;
  return precision;
}

class FusedCasts : public ::testing::TestWithParam<RecipeKind> {};

TEST_P(FusedCasts, TrainBitForBitAsTheUnfusedOps) {
  PrecisionSettings precision = fp8_with(GetParam());
  auto fused_backend = make_cpu_backend();
  auto inner = make_cpu_backend();
  UnfusedCasts unfused_backend(*inner);
  const TrainingRecord fused = train(*fused_backend, precision);
  const TrainingRecord unfused = train(unfused_backend, precision);
  // mlp.c_fc of both blocks for two steps, then of block 0 only.
  EXPECT_EQ(unfused_backend.fused_backward(), 2 * 2 + 2 * 1);

  expect_same_training(fused, unfused, GetParam());
}

// A mixture of experts with its experts in FP8: each expert's input cast by the gather of its rows and by
// SwiGLU over them, each expert's output gradients by the gather of the combine's gradient and by SwiGLU's
// backward, each with that expert's own scale, train as the experts' own linear ops casting the float32 rows,
// with an expert moved to BF16 mid-run.
TEST_P(FusedCasts, ExpertsTrainBitForBitAsTheUnfusedOps) {
  PrecisionSettings precision = fp8_with(GetParam());
  precision.experts = true;
  const ModelConfig c = testing::tiny_moe_config(false);
  // An expert's gate/up, then another's down projection, moved: the float32 rows that the casts made
  // unnecessary are then made for them.
  for (const char* moved : {"layers.1.mlp.experts.2.gate_up_proj", "layers.0.mlp.experts.1.down_proj"}) {
    SCOPED_TRACE(moved);
    auto fused_backend = make_cpu_backend();
    auto inner = make_cpu_backend();
    UnfusedCasts unfused_backend(*inner);
    const TrainingRecord fused = train(*fused_backend, precision, moved, c);
    const TrainingRecord unfused = train(unfused_backend, precision, moved, c);
    for (const float loss : fused.losses) ASSERT_FALSE(std::isnan(loss));
    // Forward and backward, each block's experts with rows: the gathers of inputs and of gradients.
    EXPECT_GT(unfused_backend.gathers_cast(), 2 * 4);
    EXPECT_GT(unfused_backend.fused_backward(), 2 * 4);
    expect_same_training(fused, unfused, GetParam());
  }
}

// Counts the model's grouped ops and the casting ops it makes outside them; the grouped ops run as the
// CPU runs them (one op per group).
class GroupedCalls final : public testing::ForwardingBackend {
 public:
  explicit GroupedCalls(Backend& inner) : ForwardingBackend(inner) {}
  std::string_view name() const override { return "cpu, grouped calls counted"; }

  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override {
    if (cast_for.given() && !inside_) ++casts_outside;
    inner_.gather_rows(out, src, index, divisor, scale, cast_for, cast_as);
  }
  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override {
    if (cast_for.given() && !inside_) ++casts_outside;
    inner_.activation_forward(kind, out, inp, cast_for);
  }
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias, const Fp8CastTarget& cast_for) override {
    if (cast_for.given() && !inside_) ++casts_outside;
    inner_.activation_backward(kind, dinp, inp, dout, dbias, cast_for);
  }
  void gather_rows_grouped(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                           int64_t divisor, const float* scale, const RowGroupCasts& casts,
                           TensorRole cast_as) override {
    record(casts);
    ++(cast_as == TensorRole::activation ? input_gathers : gradient_gathers);
    inside_ = true;
    Backend::gather_rows_grouped(out, src, index, divisor, scale, casts, cast_as);
    inside_ = false;
  }
  void activation_forward_grouped(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                  const RowGroupCasts& casts) override {
    record(casts);
    ++activations;
    inside_ = true;
    Backend::activation_forward_grouped(kind, out, inp, casts);
    inside_ = false;
  }
  void activation_backward_grouped(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                   const ConstTensorView& dout, const RowGroupCasts& casts) override {
    record(casts);
    ++activation_gradients;
    inside_ = true;
    Backend::activation_backward_grouped(kind, dinp, inp, dout, casts);
    inside_ = false;
  }

  int input_gathers = 0, gradient_gathers = 0, activations = 0, activation_gradients = 0, casts_outside = 0;
  int64_t groups_seen = 0, cast_groups = 0;

 private:
  void record(const RowGroupCasts& casts) {
    groups_seen = std::max(groups_seen, casts.groups());
    for (const Fp8CastTarget& target : casts.targets) cast_groups += target.given() ? 1 : 0;
  }
  bool inside_ = false;
};

// With the experts in FP8, each block casts every expert's rows in one grouped op per producer (the gather
// of the inputs, SwiGLU, the gather of the output gradients, SwiGLU's backward), a group per expert, and
// makes no per-expert casting op of its own, also once an expert has moved to BF16.
TEST(ExpertCasts, EachBlockCastsEveryExpertsRowsInOneOpPerProducer) {
  PrecisionSettings precision = fp8_with(RecipeKind::delayed);
  precision.experts = true;
  const ModelConfig c = testing::tiny_moe_config(false);
  auto inner = make_cpu_backend();
  GroupedCalls backend(*inner);
  const TrainingRecord run = train(backend, precision, "layers.1.mlp.experts.2.gate_up_proj", c);
  for (const float loss : run.losses) ASSERT_TRUE(std::isfinite(loss));
  const int blocks = static_cast<int>(c.layers), forwards = 4 + 1, backwards = 4;  // 4 steps, 1 evaluation
  EXPECT_EQ(backend.input_gathers, forwards * blocks);
  EXPECT_EQ(backend.activations, forwards * blocks);
  EXPECT_EQ(backend.gradient_gathers, backwards * blocks);
  EXPECT_EQ(backend.activation_gradients, backwards * blocks);
  EXPECT_EQ(backend.casts_outside, 0);
  EXPECT_EQ(backend.groups_seen, c.experts);
  EXPECT_GT(backend.cast_groups, (forwards + backwards) * blocks);
}

// With every expert in FP8 (casts all their GEMMs read, per-tensor scales), the plan keeps none of the
// experts' float32 rows: the activations take less memory than with the experts in BF16's float32 rows.
TEST(ExpertRows, FloatRowsLeftOutWhereTheExpertsCastsSuffice) {
  const ModelConfig c = testing::tiny_moe_config(false);
  auto activation_bytes = [&](bool experts, RecipeKind recipe) {
    auto backend = make_cpu_backend();
    PrecisionSettings precision = fp8_with(recipe);
    precision.experts = experts;
    Decoder model(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16);
    return model.activation_bytes();
  };
  const int64_t N = 2 * 16, M = grouped_rows(N, c.experts_per_token, c.experts, 16);
  // The gathered inputs [M, C] and the SwiGLU outputs [M, H] of each of the 2 blocks, float32.
  const int64_t rows_bytes = 2 * M * (c.channels + c.ffn_hidden) * 4;
  EXPECT_LE(activation_bytes(true, RecipeKind::delayed), activation_bytes(false, RecipeKind::delayed) - rows_bytes);
  // Block scales take their scales afresh from the float32 values: the rows stay.
  EXPECT_EQ(activation_bytes(true, RecipeKind::block), activation_bytes(false, RecipeKind::block));
}

INSTANTIATE_TEST_SUITE_P(Recipes, FusedCasts,
                         ::testing::Values(RecipeKind::delayed, RecipeKind::current, RecipeKind::static_scale,
                                           RecipeKind::block),
                         [](const auto& p) { return std::string(recipe_name(p.param)); });

// fp8.recompute_mlp, _qkv and _residual: each mlp.c_fc, attn.c_attn or attn.c_proj keeps its FP8 input codes
// instead of its output, and the backward runs its forward GEMM (and attn.c_proj's residual add) again.
// Training is the same, bit for bit, fused casts or not, and the GEMM runs again exactly where the layer
// qualifies, with a layer of the kind moved to BF16 mid-run.
struct RecomputeCase {
  const char* name;
  bool mlp, qkv, residual;
  const char* moved;  // moved to BF16 after two steps
};

class Recompute : public ::testing::TestWithParam<std::tuple<RecipeKind, RecomputeCase>> {};

TEST_P(Recompute, TrainsBitForBitAsKeepingTheOutput) {
  const auto& [recipe, r] = GetParam();
  PrecisionSettings precision = fp8_with(recipe);
  auto keeping_backend = make_cpu_backend();
  const TrainingRecord kept = train(*keeping_backend, precision, r.moved);
  precision.recompute_mlp = r.mlp;
  precision.recompute_qkv = r.qkv;
  precision.recompute_residual = r.residual;
  auto recomputing_backend = make_cpu_backend();
  const TrainingRecord recomputed = train(*recomputing_backend, precision, r.moved);
  auto inner = make_cpu_backend();
  UnfusedCasts unfused_backend(*inner);
  const TrainingRecord recomputed_unfused = train(unfused_backend, precision, r.moved);
  // Per kind that recomputes: both blocks for two steps, then one block for the kind of the moved layer
  // (which keeps its output from then on), both for the others; block scales are not per tensor, so no
  // layer qualifies.
  const std::string moved = r.moved;
  auto reruns = [&](bool on, const char* kind) -> int64_t {
    if (!on) return 0;
    return moved.find(kind) != std::string::npos ? 2 * 2 + 2 * 1 : 2 * 4;
  };
  const int64_t expected =
      reruns(r.mlp, "mlp.c_fc") + reruns(r.qkv, "attn.c_attn") + reruns(r.residual, "attn.c_proj");
  EXPECT_EQ(unfused_backend.recomputed(), recipe == RecipeKind::block ? 0 : expected);
  EXPECT_GT(expected, 0);
  expect_same_training(recomputed, kept, recipe);
  expect_same_training(recomputed_unfused, kept, recipe);
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, Recompute,
    ::testing::Combine(::testing::Values(RecipeKind::delayed, RecipeKind::current, RecipeKind::block),
                       ::testing::Values(RecomputeCase{"mlp", true, false, false, "h.1.mlp.c_fc"},
                                         RecomputeCase{"qkv", false, true, false, "h.1.attn.c_attn"},
                                         RecomputeCase{"residual", false, false, true, "h.1.attn.c_proj"},
                                         RecomputeCase{"all", true, true, true, "h.0.attn.c_proj"})),
    [](const auto& p) {
      return std::string(recipe_name(std::get<0>(p.param))) + "_" + std::get<1>(p.param).name;
    });

TEST(Recompute, SaysWhichLayersRecompute) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  PrecisionSettings precision = mode(MixedPrecision::fp8);
  EXPECT_EQ(Decoder(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16).memory_line(), "");
  precision.recompute_mlp = true;
  precision.exclude = {"h.1.mlp.c_fc"};
  Decoder model(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16);
  const std::string line = model.memory_line();
  EXPECT_NE(line.find("1 of 2 mlp.c_fc layers keep their FP8 input codes"), std::string::npos) << line;
  EXPECT_NE(line.find("the others keep their output"), std::string::npos) << line;
  EXPECT_EQ(line.find("attn."), std::string::npos) << line;
  model.move_layer_to_bf16("h.0.mlp.c_fc", "BF16 by test");
  EXPECT_NE(model.memory_line().find("0 of 2"), std::string::npos) << model.memory_line();

  // The three together: a line each.
  precision.exclude = {};
  precision.recompute_qkv = true;
  precision.recompute_residual = true;
  Decoder all(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16);
  const std::string lines = all.memory_line();
  EXPECT_NE(lines.find("fp8.recompute_mlp: 2 of 2 mlp.c_fc layers"), std::string::npos) << lines;
  EXPECT_NE(lines.find("\nfp8.recompute_qkv: 2 of 2 attn.c_attn layers keep their FP8 input codes instead of "
                       "their output (q, k, v)"),
            std::string::npos)
      << lines;
  EXPECT_NE(lines.find("\nfp8.recompute_residual: 2 of 2 attn.c_proj layers"), std::string::npos) << lines;
  EXPECT_EQ(lines.find("the others"), std::string::npos) << lines;
  EXPECT_EQ(lines.find("weight_transposes"), std::string::npos) << lines;

  // Weight transposes per use: the eight block layers (the LM head is BF16), whose weights are
  // 2 * (3 + 1 + 4 + 4) * 64 * 64 = 98,304 bytes of codes.
  precision.recompute_mlp = precision.recompute_qkv = precision.recompute_residual = false;
  precision.recompute_weight_transposes = true;
  Decoder transposing(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16);
  EXPECT_EQ(
      transposing.memory_line(),
      "fp8.recompute_weight_transposes: 8 of 9 linear layers keep the FP8 codes of their weight only and "
      "transpose them before each input-gradient GEMM (0.1 MiB less where the backend keeps weight copies, "
      "the GPU)");
  precision.recipe = RecipeKind::block;  // block scales of W^T are not W's: nothing transposes per use
  Decoder block(c, *backend, PrecisionPolicy(precision, c, 32), 2, 16);
  EXPECT_NE(block.memory_line().find(": 0 of 9 linear layers"), std::string::npos) << block.memory_line();
}

// The CPU backend storing the tensors that the model rounds to bf16 (the MLP's hidden activation and its
// gradient) and the inputs of layers whose GEMMs are BF16 as bf16 bits, as the CUDA backend does: the ops
// that write them round their float32 result once (float_to_bf16, not the round_in_place that the CPU
// backend's float32 storage gets), the ops that read them widen the bits again. Every other op passes
// through.
class Bf16HiddenStorage final : public testing::ForwardingBackend {
 public:
  explicit Bf16HiddenStorage(Backend& inner) : ForwardingBackend(inner) {}
  std::string_view name() const override { return "cpu, bf16 storage"; }
  Dtype storage_type(const StorageQuery& query) const override {
    return query.role == StorageRole::rounded_activation ? Dtype::bf16 : Dtype::f32;
  }

  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override {
    EXPECT_TRUE(inp.dtype == Dtype::f32 || exec.forward == GemmMode::bf16) << "a bf16 input of a BF16 GEMM";
    inner_.linear_forward(output(out), widened(inp, 0), weight, copy, epilogue, exec, input);
    store(out);
  }
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) override {
    EXPECT_TRUE(out.dtype == Dtype::bf16 || epilogue.residual != nullptr)
        << "the recomputed output is GELU's input, or joins the residual stream";
    inner_.linear_recompute(output(out), weight, copy, epilogue, exec, input);
    store(out);
  }
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override {
    EXPECT_EQ(dweight.dtype, Dtype::f32) << "this backend stores weight gradients in float32";
    EXPECT_TRUE(dout.dtype == Dtype::f32 || exec.input_gradient == GemmMode::bf16) << "a BF16 GEMM's dout";
    EXPECT_TRUE(inp.dtype == Dtype::f32 || exec.weight_gradient == GemmMode::bf16) << "a BF16 GEMM's input";
    inner_.linear_backward(output(dinp), dweight, dbias, widened(dout, 1), widened(inp, 0), weight, copy,
                           exec, input, gradient);
    store(dinp);
  }
  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             const Fp8CastTarget& cast_for) override {
    inner_.normalization_forward(kind, output(out), mean, rstd, inp, weight, bias, cast_for);
    store(out);
  }
  void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                              const ConstTensorView& dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd) override {
    inner_.normalization_backward(kind, dinp, dweight, dbias, widened(dout, 1), inp, weight, mean, rstd);
  }
  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override {
    const ConstTensorView x = widened(inp, 0);
    inner_.activation_forward(kind, output(out), x, cast_for);
    store(out);
  }
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias,
                           const Fp8CastTarget& cast_for) override {
    const ConstTensorView x = widened(inp, 0);
    const ConstTensorView d = widened(dout, 1);
    inner_.activation_backward(kind, output(dinp), x, d, dbias, cast_for);
    store(dinp);
  }
  // How many bf16 tensors the ops wrote and read.
  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override {
    inner_.gather_rows(output(out), src, index, divisor, scale, cast_for, cast_as);
    if (out.dtype == Dtype::bf16) ++gathered_;
    store(out);
  }
  int64_t gathered() const { return gathered_; }
  int64_t stored() const { return stored_; }
  int64_t read() const { return read_; }

 private:
  // Where an op writes `out`: out itself, or float32 staging for a bf16 out that store() then rounds.
  TensorView output(const TensorView& out) {
    if (out.dtype != Dtype::bf16) return out;
    staged_.resize(static_cast<size_t>(out.numel()));
    return TensorView(staged_.data(), out.shape);
  }
  void store(const TensorView& out) {
    if (out.dtype != Dtype::bf16) return;
    auto* bits = static_cast<uint16_t*>(out.data);
    for (int64_t i = 0; i < out.numel(); ++i) bits[i] = float_to_bf16(staged_[static_cast<size_t>(i)]);
    ++stored_;
  }
  ConstTensorView widened(const ConstTensorView& x, int slot) {
    if (x.dtype == Dtype::f32) return x;
    EXPECT_EQ(x.dtype, Dtype::bf16);
    std::vector<float>& w = widened_[slot];
    w.resize(static_cast<size_t>(x.numel()));
    const auto* bits = static_cast<const uint16_t*>(x.data);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(&w[static_cast<size_t>(i)], &word, sizeof(float));
    }
    ++read_;
    return ConstTensorView(w.data(), x.shape);
  }

  std::vector<float> staged_;
  std::vector<float> widened_[2];
  int64_t stored_ = 0;
  int64_t read_ = 0;
  int64_t gathered_ = 0;  // gather_rows into bf16
};

// bf16 and fp8 modes round the MLP's hidden activation and its gradient to bf16, as PyTorch autocast keeps
// them. Stored as bf16 bits, or as float32 values that the model rounds in place, training is the same bit
// for bit: the model rounds exactly where a bf16 store would, and hands every op the type it stored. fp32
// mode rounds (and stores in bf16) only the output gradient of a layer moved to BF16.
struct HiddenCase {
  const char* name;
  MixedPrecision mode;
  RecipeKind recipe;
  bool recompute;
};

void PrintTo(const HiddenCase& c, std::ostream* os) {
  *os << c.name;
}

class HiddenInBf16 : public ::testing::TestWithParam<HiddenCase> {};

TEST_P(HiddenInBf16, StoredAsBf16TrainsBitForBitAsRoundedFloat32) {
  const HiddenCase& c = GetParam();
  PrecisionSettings precision = c.mode == MixedPrecision::fp8 ? fp8_with(c.recipe) : mode(c.mode);
  precision.recompute_mlp = c.recompute;
  auto rounding_backend = make_cpu_backend();
  const TrainingRecord rounded = train(*rounding_backend, precision);
  auto inner = make_cpu_backend();
  Bf16HiddenStorage bf16_backend(*inner);
  const TrainingRecord stored = train(bf16_backend, precision);
  for (const float loss : stored.losses) ASSERT_FALSE(std::isnan(loss)) << c.name;
  expect_same_training(stored, rounded, c.recipe);
  // train() moves h.1.mlp.c_fc to BF16 before its last two steps: from then on GELU's backward rounds that
  // layer's output gradient to bf16 (both GEMMs that read it are BF16) and stores it so, in every mode (in
  // bf16 mode the layer was BF16 already). In fp32 mode its input gradient, which ln_2's backward reads, is
  // then rounded and stored in bf16 too (in the other modes every layer's is, below).
  const int64_t moved_steps = c.mode == MixedPrecision::bf16 ? 0 : 2;
  if (c.mode == MixedPrecision::fp32) {
    EXPECT_EQ(bf16_backend.stored(), 2 * moved_steps) << c.name;
    EXPECT_EQ(bf16_backend.read(), 2 * moved_steps) << c.name;
    return;
  }
  // Per block and training step: the forward writes GELU's input and reads it, the backward writes its
  // gradient and reads both (plus the recomputed input, written once more); the evaluation forwards once.
  // In bf16 mode the three linear layers' inputs that LayerNorm and GELU write (ln_1's and ln_2's outputs,
  // GELU's) are bf16 too: each written and read by the forward, read again by the weight gradient; and so
  // is GELU's input gradient, mlp.c_fc's output gradient: written by GELU's backward, read by mlp.c_fc's.
  // In both modes the input gradients of attn.c_attn and mlp.c_fc (BF16 or FP8 input-gradient GEMMs) are
  // bf16: written by those GEMMs, read by ln_1's and ln_2's backward. And in both the LM head is BF16, so its
  // input (ln_f's output) is bf16: written by every forward, read by the head's forward and weight-gradient
  // GEMMs in a training step, by its forward alone in the evaluation.
  const int64_t steps = 4, blocks = 2;
  const int64_t head_stored = steps + 1, head_read = 2 * steps + 1;
  const int64_t recomputes = c.recompute && c.recipe != RecipeKind::block ? 2 * 2 + 2 * 1 : 0;
  const int64_t inputs = c.mode == MixedPrecision::bf16 ? 3 : 0;
  const int64_t gradients = (c.mode == MixedPrecision::bf16 ? 1 : 0) + 2;
  EXPECT_EQ(bf16_backend.stored(), steps * blocks * (2 + inputs + gradients) + moved_steps + recomputes +
                                       blocks * (1 + inputs) + head_stored)
      << c.name;
  EXPECT_EQ(bf16_backend.read(),
            steps * blocks * (3 + 2 * inputs + gradients) + moved_steps + blocks * (1 + inputs) + head_read)
      << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, HiddenInBf16,
    ::testing::Values(HiddenCase{"bf16", MixedPrecision::bf16, RecipeKind::delayed, false},
                      HiddenCase{"fp8_delayed", MixedPrecision::fp8, RecipeKind::delayed, false},
                      HiddenCase{"fp8_current", MixedPrecision::fp8, RecipeKind::current, false},
                      HiddenCase{"fp8_block", MixedPrecision::fp8, RecipeKind::block, false},
                      HiddenCase{"fp8_delayed_recompute", MixedPrecision::fp8, RecipeKind::delayed, true},
                      HiddenCase{"fp32", MixedPrecision::fp32, RecipeKind::delayed, false}),
    [](const auto& p) { return std::string(p.param.name); });

// A mixture of experts' rows (the experts' gathered inputs, SwiGLU's outputs, the gradients of the experts'
// outputs and of their gate/up outputs) stored in bf16 where every GEMM that reads them is BF16: the same
// bits as float32 rows rounded to bf16, in bf16 mode and in fp8 mode with the experts in BF16 and in FP8
// (where the experts' rows stay float32 for their casts).
TEST(ExpertRowsInBf16, StoredAsBf16TrainBitForBitAsRoundedFloat32) {
  const ModelConfig c = testing::tiny_moe_config(true);
  for (const int variant : {0, 1, 2}) {
    PrecisionSettings precision = variant == 0 ? mode(MixedPrecision::bf16) : fp8_with(RecipeKind::delayed);
    precision.experts = variant == 2;
    auto rounding_backend = make_cpu_backend();
    const TrainingRecord rounded = train(*rounding_backend, precision, "layers.1.mlp.shared_expert.down_proj", c);
    auto inner = make_cpu_backend();
    Bf16HiddenStorage bf16_backend(*inner);
    const TrainingRecord stored = train(bf16_backend, precision, "layers.1.mlp.shared_expert.down_proj", c);
    for (const float loss : stored.losses) ASSERT_FALSE(std::isnan(loss)) << variant;
    expect_same_training(stored, rounded, RecipeKind::delayed);
    // The experts' inputs and their outputs' gradients gathered into bf16 where the experts are BF16: twice
    // per block and training step, once per block in the evaluation; never where they are FP8.
    EXPECT_EQ(bf16_backend.gathered(), variant == 2 ? 0 : 2 * (2 * 4 + 1)) << variant;
  }
}

}  // namespace
}  // namespace octet
