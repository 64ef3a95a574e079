// The optimizer update (Backend::optimizer_update) as the optimizer drives it, on the CUDA backend against
// the CPU reference (harness: backend_ops_harness.h): one call over linear layers' weights whose copies it
// remakes (FP8 under delayed and static scaling, which the AdamW pass casts; FP8 under current scaling and
// FP16, whose copies are made after it; BF16, which the AdamW pass rounds), their biases (bias_of), a plain
// tensor, and weight gradients stored as bf16. params, m and v are held to the reference with optimizer
// tolerances; each remade copy must be the one prepare_weight makes from the updated weights: the same
// forward outputs and scaling states, bit for bit, as a second CUDA backend that updates the same segments
// as plain tensors and then prepares every weight. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "octet/numerics/minifloat.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Backend;
using octet::ConstTensorView;
using octet::Fp8LinearState;
using octet::GemmMode;
using octet::LinearExecution;
using octet::TensorView;
using octet::testing::random_normal;

// One linear layer of the update: its weight [OC, C] and, with `bias`, its bias [OC], at their offsets in
// the parameters; how its GEMMs run.
struct Layer {
  std::string name;
  int64_t OC, C;
  bool bias;
  GemmMode mode;
  std::shared_ptr<const octet::ScalingRecipe> recipe;  // FP8 layers
  float weight_decay = 0.1f;
  float learning_rate_scale = 1.0f;  // its parameter group's (weight and bias)
};

// A layer's execution state on one side.
struct LayerSide {
  std::unique_ptr<octet::WeightCopy> copy;
  std::unique_ptr<octet::Fp8Tensor> input_codes;
  Fp8LinearState state;
  LinearExecution exec;
};

// One backend's run: its parameters, moments and gradients, and every layer's copy.
struct Side {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<octet::Buffer> params, m, v, grads, grads_bf16, inp, out;
  std::vector<LayerSide> layers;
};

std::unique_ptr<octet::Buffer> upload(Backend& b, const void* host, size_t bytes) {
  auto buffer = b.allocate(bytes);
  b.copy_from_host(buffer->data(), host, bytes);
  return buffer;
}

std::vector<float> download(Backend& b, octet::Buffer& buffer, size_t floats) {
  std::vector<float> host(floats);
  b.copy_to_host(host.data(), buffer.data(), floats * sizeof(float));
  return host;
}

// `layers` in one optimizer_update a step, for three steps, plus a LayerNorm-like plain tensor; with
// `bf16_gradients`, the weights' gradients are stored as bf16 on the tested side (the reference and the
// plain side read their float32 values).
void run_update(const std::vector<Layer>& layers, bool bf16_gradients) {
  const int64_t N = 32, plain_count = 61;
  // The parameters: each layer's weight, then its bias; the plain tensor last.
  std::vector<int64_t> weight_at, bias_at;
  int64_t n = 0, widest = 0;
  for (const Layer& l : layers) {
    weight_at.push_back(n);
    n += l.OC * l.C;
    bias_at.push_back(l.bias ? n : -1);
    if (l.bias) n += l.OC;
    widest = std::max({widest, l.C, l.OC});
  }
  const int64_t plain_at = n;
  n += plain_count;
  const auto count = static_cast<size_t>(n);
  const uint64_t seed =
      seed_of("optimizer_update weights", std::to_string(n) + (bf16_gradients ? " bf16" : ""));
  const std::vector<float> params0 = random_normal(count, seed, 0.5f);
  const std::vector<float> m0 = random_normal(count, seed + 1, 0.01f);
  const std::vector<float> v0 = octet::testing::random_uniform(count, seed + 2, 0.0f, 1e-4f);
  const std::vector<float> inp = random_normal(static_cast<size_t>(N * widest), seed + 3, 1.0f);

  // 0: the tested backend with weight segments; 1: the tested backend with plain segments, then
  // prepare_weight; 2: the CPU reference with weight segments.
  Side sides[3];
  for (int k = 0; k < 3; ++k) {
    Side& side = sides[k];
    side.backend = k < 2 ? make_tested_backend() : make_reference_backend();
    Backend& b = *side.backend;
    side.params = upload(b, params0.data(), count * sizeof(float));
    side.m = upload(b, m0.data(), count * sizeof(float));
    side.v = upload(b, v0.data(), count * sizeof(float));
    side.grads = b.allocate(count * sizeof(float));
    side.grads_bf16 = b.allocate(count * sizeof(uint16_t));
    side.inp = upload(b, inp.data(), inp.size() * sizeof(float));
    side.out = b.allocate(static_cast<size_t>(N * widest) * sizeof(float));
    side.layers.resize(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      LayerSide& s = side.layers[i];
      s.exec.forward = s.exec.input_gradient = s.exec.weight_gradient = l.mode;
      if (l.recipe != nullptr) {
        s.exec.recipe = l.recipe.get();
        const octet::ScalingState initial = l.recipe->initial_state();
        s.state = {initial, initial, initial};
        s.exec.state = &s.state;
      }
      b.prepare_weight(s.copy, side.params->floats() + weight_at[i], l.OC, l.C, s.exec);
    }
  }

  for (int64_t step = 7; step < 10; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Backend::AdamWStep h{.learning_rate = 1e-2f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .step = step,
                               .grad_scale = 0.5f};
    // Gradients exactly representable in bf16, so that every side reads the same values.
    std::vector<float> grads = random_normal(count, seed + 10 + static_cast<uint64_t>(step), 1.0f);
    std::vector<uint16_t> bits(count);
    for (size_t i = 0; i < count; ++i) {
      bits[i] = octet::float_to_bf16(grads[i]);
      grads[i] = octet::bf16_to_float(bits[i]);
    }
    // The reference starts from the tested side's values, so that each step is compared alone.
    const std::vector<float> params = download(*sides[0].backend, *sides[0].params, count);
    const std::vector<float> m = download(*sides[0].backend, *sides[0].m, count);
    const std::vector<float> v = download(*sides[0].backend, *sides[0].v, count);
    for (int k = 0; k < 3; ++k) {
      Side& side = sides[k];
      Backend& b = *side.backend;
      b.copy_from_host(side.grads->data(), grads.data(), count * sizeof(float));
      b.copy_from_host(side.grads_bf16->data(), bits.data(), count * sizeof(uint16_t));
      if (k == 2) {
        b.copy_from_host(side.params->data(), params.data(), count * sizeof(float));
        b.copy_from_host(side.m->data(), m.data(), count * sizeof(float));
        b.copy_from_host(side.v->data(), v.data(), count * sizeof(float));
      }
      const bool weights = k != 1;
      std::vector<Backend::UpdateSegment> segments;
      for (size_t i = 0; i < layers.size(); ++i) {
        const Layer& l = layers[i];
        Backend::UpdateSegment w{.offset = weight_at[i], .count = l.OC * l.C, .weight_decay = l.weight_decay};
        w.learning_rate_scale = l.learning_rate_scale;
        if (weights) {
          w.copy = &side.layers[i].copy;
          w.exec = &side.layers[i].exec;
          w.rows = l.OC;
          w.cols = l.C;
          if (bf16_gradients && k == 0)
            w.grads_bf16 = static_cast<const uint16_t*>(side.grads_bf16->data()) + w.offset;
        }
        segments.push_back(w);
      }
      for (size_t i = 0; i < layers.size(); ++i) {
        if (layers[i].bias) {
          segments.push_back({.offset = bias_at[i],
                              .count = layers[i].OC,
                              .learning_rate_scale = layers[i].learning_rate_scale,
                              .bias_of = side.layers[i].copy.get()});
        }
      }
      segments.push_back({.offset = plain_at, .count = plain_count});
      b.optimizer_update(h, {side.params->floats(), side.m->floats(), side.v->floats(), side.grads->floats()},
                         segments);
      if (!weights) {
        for (size_t i = 0; i < layers.size(); ++i) {
          b.prepare_weight(side.layers[i].copy, side.params->floats() + weight_at[i], layers[i].OC,
                           layers[i].C, side.layers[i].exec);
        }
      }
      b.synchronize();
      if (k == 2) {
        // Against the reference: one update from the same values.
        const std::vector<Check> checks = adamw_checks(h, segments, params, m, v, grads);
        const std::vector<float> actual[] = {download(*sides[0].backend, *sides[0].m, count),
                                             download(*sides[0].backend, *sides[0].v, count),
                                             download(*sides[0].backend, *sides[0].params, count)};
        const std::vector<float> expected[] = {download(b, *side.m, count), download(b, *side.v, count),
                                               download(b, *side.params, count)};
        for (size_t c = 0; c < checks.size(); ++c) {
          EXPECT_TRUE(
              check_output("optimizer_update " + checks[c].target, checks[c], actual[c], expected[c]));
        }
        EXPECT_FALSE(actual[2] == params) << "params unchanged";
      }
    }
    // The fused passes give the plain update's bits, and their copies prepare_weight's.
    for (const char* what : {"params", "m", "v"}) {
      const auto pick = [&](Side& s) -> octet::Buffer& {
        return what[0] == 'p' ? *s.params : what[0] == 'm' ? *s.m : *s.v;
      };
      EXPECT_TRUE(bytes_identical(as_bytes(download(*sides[0].backend, pick(sides[0]), count)),
                                  as_bytes(download(*sides[1].backend, pick(sides[1]), count)), what));
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      SCOPED_TRACE(l.name);
      std::vector<float> outputs[2];
      for (int k = 0; k < 2; ++k) {
        Side& side = sides[k];
        float* weight = side.params->floats() + weight_at[i];
        side.backend->linear_forward(
            TensorView(side.out->floats(), {N, l.OC}), ConstTensorView(side.inp->floats(), {N, l.C}),
            ConstTensorView(weight, {l.OC, l.C}), side.layers[i].copy.get(),
            {.bias = l.bias ? side.params->floats() + bias_at[i] : nullptr}, side.layers[i].exec,
            {&side.layers[i].input_codes});
        side.backend->synchronize();
        side.backend->fetch_scaling(side.layers[i].state);
        outputs[k] = download(*side.backend, *side.out, static_cast<size_t>(N * l.OC));
      }
      EXPECT_TRUE(bytes_identical(as_bytes(outputs[0]), as_bytes(outputs[1]), "the forward's output"));
      if (l.recipe != nullptr) {
        const Fp8LinearState& a = sides[0].layers[i].state;
        const Fp8LinearState& e = sides[1].layers[i].state;
        EXPECT_EQ(a.weight.amax_history, e.weight.amax_history);
        EXPECT_EQ(a.weight.scale, e.weight.scale);
        EXPECT_EQ(a.weight.updates, e.weight.updates);
        EXPECT_EQ(a.weight_copy_scale, e.weight_copy_scale);
      }
    }
  }
}

const auto kDelayed = std::make_shared<octet::DelayedScaling>(16, octet::AmaxAlgorithm::max, 0);
const auto kStatic = std::make_shared<octet::StaticScaling>(64.0f);
const auto kCurrent = std::make_shared<octet::CurrentScaling>(0);

// A model's mix in one call: FP8 weights the AdamW pass casts (one launch), BF16 weights it rounds (another),
// FP8 under current scaling and FP16 weights whose copies are made after it, float32 weights without a
// copy; biases that name their layers, and a plain tensor.
std::vector<Layer> model_mix() {
  return {{"fp8 delayed", 96, 128, true, GemmMode::fp8, kDelayed},
          {"bf16", 40, 24, true, GemmMode::bf16, nullptr},
          {"fp8 static", 32, 48, false, GemmMode::fp8, kStatic},
          {"fp8 current", 64, 32, true, GemmMode::fp8, kCurrent},
          {"f16", 24, 40, true, GemmMode::f16, nullptr},
          {"bf16 odd", 37, 23, true, GemmMode::bf16, nullptr},
          {"f32", 13, 7, true, GemmMode::f32, nullptr}};
}

TEST(BackendOpsOptimizer, WeightsBiasesAndPlainTensorsInOneCall) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_update(model_mix(), false);
}

TEST(BackendOpsOptimizer, WeightGradientsStoredAsBf16) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_update(model_mix(), true);
}

// Weights with a second weight decay go by themselves (the fused launches take one besides none), a bf16
// gradient widened for them first.
TEST(BackendOpsOptimizer, WeightsWithAnotherWeightDecay) {
  SKIP_WITHOUT_TESTED_BACKEND();
  std::vector<Layer> layers = model_mix();
  layers[1].weight_decay = 0.05f;
  layers[2].weight_decay = 0.05f;
  run_update(layers, true);
}

// Parameter groups: segments of other learning-rate multipliers (0 included) in the same call, each group's
// launches with the step's rate times its multiplier, as the CPU scales it.
TEST(BackendOpsOptimizer, SegmentsOfOtherLearningRates) {
  SKIP_WITHOUT_TESTED_BACKEND();
  std::vector<Layer> layers = model_mix();
  layers[0].learning_rate_scale = 0.5f;
  layers[1].learning_rate_scale = 0.0f;
  layers[3].learning_rate_scale = 0.5f;
  layers[5].learning_rate_scale = 2.0f;
  layers[5].weight_decay = 0.05f;
  run_update(layers, true);
}

}  // namespace
