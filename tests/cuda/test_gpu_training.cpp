// End to end on the GPU: the same small GPT-2, trained from the same weights on the same tokens by the CPU
// reference and by the CUDA backend, follows the same losses in every mode; in fp8 the layers' scaling states
// (amax histories, scales) follow the CPU's; and the FP8 GEMMs really ran as FP8 GEMMs (the per-step counts,
// against the GEMMs that did not). Skips without a GPU.
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/backend/cpu_backend.h"
#include "octet/backend/cuda_backend.h"
#include "octet/model/model.h"
#include "octet/train/trainer.h"

namespace octet {
namespace {

constexpr int64_t kB = 4, kT = 32, kSteps = 50, kEarlySteps = 3;

// GPT-2 (shape 0), a Llama of the same width (1: grouped-query attention with 2 kv heads, rotary embedding,
// SwiGLU, untied head), or that Llama with a mixture of experts (2: 4 experts of 64, 2 per token, a shared
// expert, the balance loss).
ModelConfig small_config(int shape = 0) {
  const bool llama = shape >= 1;
  ModelConfig c;
  c.vocab_size = 250;
  c.padded_vocab_size = 256;
  c.max_seq_len = kT;
  c.layers = 2;
  c.heads = 4;
  c.channels = 64;
  if (llama) {
    c.arch = ModelArchitecture::llama;
    c.kv_heads = 2;
    c.ffn_hidden = 176;
    c.rope_theta = 10000.0f;
  }
  if (shape == 2) {
    c.ffn_hidden = 64;
    c.experts = 4;
    c.experts_per_token = 2;
    c.shared_expert = true;
  }
  return c;
}

// Tokens with structure a model learns quickly: each sequence walks a fixed successor function from a random
// start, with a little noise.
BatchSource token_stream(uint64_t seed, int64_t V) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return [rng, V](int32_t* tokens, int32_t* targets) {
    for (int64_t b = 0; b < kB; ++b) {
      int32_t x = static_cast<int32_t>((*rng)() % static_cast<uint64_t>(V));
      for (int64_t t = 0; t < kT; ++t) {
        tokens[b * kT + t] = x;
        x = ((*rng)() % 8 == 0) ? static_cast<int32_t>((*rng)() % static_cast<uint64_t>(V))
                                : static_cast<int32_t>((x * 31 + 7) % V);
        targets[b * kT + t] = x;
      }
    }
  };
}

struct TrainingRun {
  std::vector<float> losses;
  std::vector<int64_t> fp8_gemms;
  std::vector<int64_t> other_gemms;
  std::vector<Fp8LinearState> early_states;  // per FP8 layer, after kEarlySteps steps
  std::vector<Fp8LinearState> states;        // per FP8 layer, after the run
  std::vector<std::string> layers;
};

TrainingRun train(Backend& backend, const PrecisionSettings& precision, int64_t grad_accum_steps = 1,
                  float grad_clip = 1.0f, int shape = 0) {
  const ModelConfig config = small_config(shape);
  const std::unique_ptr<Model> model_owner =
      make_model(config, backend, PrecisionPolicy(precision, config, kB * kT), kB, kT);
  Model& model = *model_owner;
  model.init_weights(1234);
  TrainSettings settings;
  settings.batch_size = kB;
  settings.seq_len = kT;
  settings.grad_accum_steps = grad_accum_steps;
  settings.grad_clip = grad_clip;
  settings.schedule = LearningRateSchedule{3e-3f, 5, kSteps, 0.1f};
  if (precision.mode == MixedPrecision::fp16) settings.loss_scale.dynamic = true;
  Trainer trainer(model, settings);
  const BatchSource data = token_stream(99, config.vocab_size);
  TrainingRun run;
  for (int64_t s = 0; s < kSteps; ++s) {
    const StepResult r = trainer.step(data);
    run.losses.push_back(r.loss);
    run.fp8_gemms.push_back(r.fp8_gemms);
    run.other_gemms.push_back(r.other_gemms);
    if (s + 1 == kEarlySteps) {
      for (const LinearPlan& plan : model.policy().layers()) {
        if (Fp8LinearState* state = model.fp8_state(plan.name)) run.early_states.push_back(*state);
      }
    }
  }
  for (const LinearPlan& plan : model.policy().layers()) {
    if (Fp8LinearState* s = model.fp8_state(plan.name)) {
      run.states.push_back(*s);
      run.layers.push_back(plan.name);
    }
  }
  return run;
}

PrecisionSettings precision(MixedPrecision m, RecipeKind recipe = RecipeKind::delayed) {
  PrecisionSettings p;
  p.mode = m;
  p.recipe = recipe;
  return p;
}

struct ModeCase {
  const char* name;
  MixedPrecision mode;
  RecipeKind recipe;
  bool emulate_fp8;
  bool bf16_attention;
  // Largest relative difference of any step's loss. The two backends add in different orders, and a
  // difference in the last bit of a rounded (BF16, FP16, FP8) value moves later steps a little: the bound
  // grows with the coarseness of the mode's rounding.
  double step_tolerance;
  // train.weight_gradients = "bf16" on both backends (the CPU rounds in place, the GPU stores bf16).
  bool bf16_weight_gradients = false;
  int shape = 0;  // small_config's: GPT-2, the Llama, or the mixture of experts
  bool fp8_experts = false;
};

class GpuTraining : public ::testing::TestWithParam<ModeCase> {};

TEST_P(GpuTraining, FollowsTheCpuReference) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const ModeCase& c = GetParam();
  auto cpu = make_cpu_backend();
  CudaBackendOptions options;
  options.emulate_fp8 = c.emulate_fp8;
  options.bf16_attention = c.bf16_attention;
  auto gpu = make_cuda_backend(options);
  PrecisionSettings p = precision(c.mode, c.recipe);
  p.bf16_weight_gradients = c.bf16_weight_gradients;
  p.experts = c.fp8_experts;
  const TrainingRun reference = train(*cpu, p, 1, 1.0f, c.shape);
  const TrainingRun device = train(*gpu, p, 1, 1.0f, c.shape);

  double worst = 0.0;
  for (int64_t s = 0; s < kSteps; ++s) {
    const double a = reference.losses[static_cast<size_t>(s)], b = device.losses[static_cast<size_t>(s)];
    ASSERT_TRUE(std::isfinite(b)) << "step " << s << ": the GPU loss is " << b;
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
    // The same GEMMs ran in the same precisions on both.
    EXPECT_EQ(reference.fp8_gemms[static_cast<size_t>(s)], device.fp8_gemms[static_cast<size_t>(s)]) << s;
    EXPECT_EQ(reference.other_gemms[static_cast<size_t>(s)], device.other_gemms[static_cast<size_t>(s)]) << s;
  }
  std::printf("[%s] losses: first %.5f, last cpu %.5f gpu %.5f; largest relative step difference %.3g\n",
              c.name, reference.losses.front(), reference.losses.back(), device.losses.back(), worst);
  EXPECT_LE(worst, c.step_tolerance);
  // It learned: the run is not trivially equal because nothing moved.
  EXPECT_LT(device.losses.back(), device.losses.front() * 0.8);

  if (c.mode == MixedPrecision::fp8) {
    // Per step: 4 block linears x 2 layers x 3 GEMMs in FP8, the LM head's 3 in BF16 (the mixture of
    // experts: attention's 2 and the shared expert's 2, the router's and, unless converted, the experts'
    // GEMMs in BF16).
    if (c.shape < 2) {
      EXPECT_EQ(device.fp8_gemms.back(), 24);
      EXPECT_EQ(device.other_gemms.back(), 3);
    } else {
      // Every expert takes tokens at this size: 2 blocks x 4 experts x 2 layers x 3 GEMMs, in FP8 where
      // converted; attention's and the shared expert's 24 in FP8; the routers' 6 and the head's 3 in BF16.
      EXPECT_EQ(device.fp8_gemms.back(), c.fp8_experts ? 24 + 48 : 24);
      EXPECT_EQ(device.fp8_gemms.back() + device.other_gemms.back(), 24 + 48 + 6 + 3);
    }
    // Largest relative difference of the amax histories, per operand (activation, weight, gradient).
    // With `routed_too` false, experts' layers are left out: once a token's choice of experts differs
    // between the runs (their router logits drift apart like any other activation), the experts involved
    // see different tokens, and their amaxes say nothing about the kernels.
    const auto amax_differences = [&](const std::vector<Fp8LinearState>& expected,
                                      const std::vector<Fp8LinearState>& actual, bool routed_too) {
      std::array<double, 3> largest{0.0, 0.0, 0.0};
      EXPECT_EQ(expected.size(), actual.size());
      for (size_t i = 0; i < std::min(expected.size(), actual.size()); ++i) {
        if (!routed_too && device.layers[i].find(".experts.") != std::string::npos) continue;
        const ScalingState* rs[3] = {&expected[i].activation, &expected[i].weight, &expected[i].gradient};
        const ScalingState* ds[3] = {&actual[i].activation, &actual[i].weight, &actual[i].gradient};
        for (size_t k = 0; k < 3; ++k) {
          EXPECT_EQ(rs[k]->updates, ds[k]->updates) << device.layers[i] << " operand " << k;
          EXPECT_EQ(rs[k]->amax_history.size(), ds[k]->amax_history.size());
          for (size_t h = 0; h < std::min(rs[k]->amax_history.size(), ds[k]->amax_history.size()); ++h) {
            const double a = rs[k]->amax_history[h], b = ds[k]->amax_history[h];
            EXPECT_TRUE(std::isfinite(b));
            largest[k] = std::max(largest[k], std::abs(a - b) / std::max(std::abs(a), 1e-30));
          }
        }
      }
      return largest;
    };
    // Early on the two runs have barely drifted apart: the amaxes agree within a few percent. The GEMMs'
    // accumulation order (and Hopper's fast accumulation in the forward) is the only difference, but AdamW's
    // normalised update turns a tiny gradient difference into a step of about the learning rate, so even the
    // weights' amaxes move apart by that much.
    const std::array<double, 3> early = amax_differences(reference.early_states, device.early_states, true);
    // After 50 steps each run has followed its own rounding: activations and weights a little apart, and a
    // gradient's amax, the largest of many small values, further.
    const std::array<double, 3> late = amax_differences(reference.states, device.states, false);
    std::printf(
        "[%s] largest relative amax history difference over %zu layers after %lld steps: activation "
        "%.3g, weight %.3g, gradient %.3g; after %lld steps: %.3g, %.3g, %.3g\n",
        c.name, device.states.size(), static_cast<long long>(kEarlySteps), early[0], early[1], early[2],
        static_cast<long long>(kSteps), late[0], late[1], late[2]);
    // A mixture of experts' output gradients also pass through the router's weights, which the two runs
    // compute in different orders from the first step: its gradients' amaxes move apart a little further, and
    // after 50 steps its activations' too (0.167 and 0.209 against the CPU backends of two machines, whose
    // BLAS libraries sum in different orders).
    const double gradient_early = c.shape == 2 ? 0.1 : 0.06, gradient_late = c.shape == 2 ? 0.6 : 0.4;
    const double activation_late = c.shape == 2 ? 0.3 : 0.2;
    EXPECT_LE(early[0], 0.06);
    EXPECT_LE(early[1], 0.06);
    EXPECT_LE(early[2], gradient_early);
    EXPECT_LE(late[0], activation_late);
    EXPECT_LE(late[1], 0.2);
    EXPECT_LE(late[2], gradient_late);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, GpuTraining,
    ::testing::Values(
        ModeCase{"fp32", MixedPrecision::fp32, RecipeKind::delayed, false, false, 2e-3},
        ModeCase{"bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false, 2e-2},
        ModeCase{"fp16", MixedPrecision::fp16, RecipeKind::delayed, false, false, 2e-2},
        ModeCase{"fp8_delayed", MixedPrecision::fp8, RecipeKind::delayed, false, false, 3e-2},
        ModeCase{"fp8_current", MixedPrecision::fp8, RecipeKind::current, false, false, 3e-2},
        ModeCase{"fp8_emulated", MixedPrecision::fp8, RecipeKind::delayed, true, false, 3e-2},
        // As `octet train` runs fp8 on the GPU: attention's products on BF16 tensor cores too.
        ModeCase{"fp8_bf16_attention", MixedPrecision::fp8, RecipeKind::delayed, false, true, 5e-2},
        // Weight gradients kept in bf16, as bench/compare.sh trains.
        ModeCase{"bf16_weight_gradients_bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false, 2e-2,
                 true},
        ModeCase{"fp8_bf16_weight_gradients", MixedPrecision::fp8, RecipeKind::delayed, false, true, 5e-2,
                 true},
        // Llama: RMSNorm, the rotary embedding, grouped-query attention, SwiGLU.
        ModeCase{"llama_fp32", MixedPrecision::fp32, RecipeKind::delayed, false, false, 2e-3, false, true},
        ModeCase{"llama_bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false, 2e-2, false, true},
        ModeCase{"llama_fp16", MixedPrecision::fp16, RecipeKind::delayed, false, false, 2e-2, false, true},
        ModeCase{"llama_fp8_delayed", MixedPrecision::fp8, RecipeKind::delayed, false, false, 3e-2, false,
                 true},
        ModeCase{"llama_fp8_current", MixedPrecision::fp8, RecipeKind::current, false, false, 3e-2, false,
                 true},
        ModeCase{"llama_fp8_bf16_attention", MixedPrecision::fp8, RecipeKind::delayed, false, true, 5e-2,
                 false, true},
        ModeCase{"llama_fp8_bf16_weight_gradients", MixedPrecision::fp8, RecipeKind::delayed, false, true,
                 5e-2, true, true},
        // The mixture of experts: the routing ops, the per-expert GEMMs, the balance loss.
        ModeCase{"moe_fp32", MixedPrecision::fp32, RecipeKind::delayed, false, false, 2e-3, false, 2},
        ModeCase{"moe_bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false, 3e-2, false, 2},
        ModeCase{"moe_fp16", MixedPrecision::fp16, RecipeKind::delayed, false, false, 3e-2, false, 2},
        ModeCase{"moe_fp8_delayed", MixedPrecision::fp8, RecipeKind::delayed, false, false, 5e-2, false, 2},
        ModeCase{"moe_fp8_current", MixedPrecision::fp8, RecipeKind::current, false, false, 5e-2, false, 2},
        ModeCase{"moe_fp8_experts", MixedPrecision::fp8, RecipeKind::delayed, false, true, 5e-2, true, 2,
                 true}),
    [](const ::testing::TestParamInfo<ModeCase>& mode) { return std::string(mode.param.name); });

// The same run twice on the GPU gives the same bits: every kernel is deterministic at this size (cuDNN's
// attention backward too; at training sizes it is not, see CudnnAttention.RepeatedBackwardsAtTrainingShapes).
TEST(GpuTrainingDeterminism, RepeatsBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  auto gpu = make_cuda_backend();
  const TrainingRun a = train(*gpu, precision(MixedPrecision::fp8));
  const TrainingRun b = train(*gpu, precision(MixedPrecision::fp8));
  for (size_t s = 0; s < a.losses.size(); ++s) ASSERT_EQ(a.losses[s], b.losses[s]) << "step " << s;
}

// train.activation_checkpointing on the GPU: the backward's rerun of a block's forward (with the FP8 layers'
// scaling state as that forward found it) gives the activations the forward gave, so training is the same,
// bit for bit, at every level, for GPT-2 and Llama, in bf16 and in fp8 with delayed and current scaling.
TEST(GpuTrainingCheckpointing, TrainsBitForBitAsKeepingEverything) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  auto gpu = make_cuda_backend();
  for (const bool llama : {false, true}) {
    for (const auto& [mode, recipe] : {std::pair{MixedPrecision::bf16, RecipeKind::delayed},
                                       std::pair{MixedPrecision::fp8, RecipeKind::delayed},
                                       std::pair{MixedPrecision::fp8, RecipeKind::current}}) {
      SCOPED_TRACE(std::string(llama ? "llama " : "gpt2 ") + std::string(mixed_precision_name(mode)) + " " +
                   recipe_name(recipe));
      const TrainingRun kept = train(*gpu, precision(mode, recipe), 1, 1.0f, llama);
      for (const ActivationCheckpointing level :
           {ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
        SCOPED_TRACE(activation_checkpointing_name(level));
        PrecisionSettings p = precision(mode, recipe);
        p.activation_checkpointing = level;
        const TrainingRun rerun = train(*gpu, p, 1, 1.0f, llama);
        for (size_t s = 0; s < kept.losses.size(); ++s) {
          ASSERT_EQ(kept.losses[s], rerun.losses[s]) << "step " << s;
          ASSERT_EQ(kept.fp8_gemms[s], rerun.fp8_gemms[s]) << "step " << s;
        }
        ASSERT_EQ(kept.states.size(), rerun.states.size());
        for (size_t i = 0; i < kept.states.size(); ++i) {
          EXPECT_EQ(kept.states[i].activation.amax_history, rerun.states[i].activation.amax_history) << i;
          EXPECT_EQ(kept.states[i].gradient.amax_history, rerun.states[i].gradient.amax_history) << i;
        }
      }
    }
  }
}

// fp8.recompute_mlp, _qkv and _residual on the GPU: the backward's rerun of a forward GEMM (mlp.c_fc's,
// attn.c_attn's, attn.c_proj's with its residual add in the epilogue) gives the very output the forward gave
// (the same codes, scales, weight copy, bias, addend and GEMM), so training is the same, bit for bit, as
// keeping that output. fp8.recompute_weight_transposes: W's codes transposed before each input-gradient GEMM
// are the W^T codes the weight cast would have kept. Each alone and all four, with FP8 tensor cores and
// emulated, delayed and current scaling.
TEST(GpuTrainingRecompute, TrainsBitForBitAsKeepingTheOutputs) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  struct Recompute {
    const char* name;
    bool mlp, qkv, residual, weight_transposes;
  };
  const Recompute cases[] = {
      {"mlp", true, false, false, false},      {"qkv", false, true, false, false},
      {"residual", false, false, true, false}, {"weight transposes", false, false, false, true},
      {"all four", true, true, true, true},
  };
  for (const bool emulate : {false, true}) {
    for (const RecipeKind recipe : {RecipeKind::delayed, RecipeKind::current}) {
      CudaBackendOptions options;
      options.emulate_fp8 = emulate;
      options.bf16_attention = true;
      auto gpu = make_cuda_backend(options);
      PrecisionSettings p = precision(MixedPrecision::fp8, recipe);
      const TrainingRun kept = train(*gpu, p);
      for (const Recompute& r : cases) {
        p.recompute_mlp = r.mlp;
        p.recompute_qkv = r.qkv;
        p.recompute_residual = r.residual;
        p.recompute_weight_transposes = r.weight_transposes;
        const TrainingRun recomputed = train(*gpu, p);
        const std::string what =
            std::string(r.name) + ", " + std::string(recipe_name(recipe)) + (emulate ? ", emulated" : "");
        for (size_t s = 0; s < kept.losses.size(); ++s) {
          ASSERT_EQ(std::memcmp(&kept.losses[s], &recomputed.losses[s], sizeof(float)), 0)
              << what << ", step " << s << ": " << kept.losses[s] << " kept, " << recomputed.losses[s];
          EXPECT_EQ(kept.fp8_gemms[s], recomputed.fp8_gemms[s]) << what << ": reruns are not counted";
        }
        ASSERT_EQ(kept.states.size(), recomputed.states.size());
        for (size_t i = 0; i < kept.states.size(); ++i) {
          EXPECT_EQ(kept.states[i].gradient.amax_history, recomputed.states[i].gradient.amax_history)
              << what << ", " << kept.layers[i];
        }
        EXPECT_LT(recomputed.losses.back(), recomputed.losses.front() * 0.8) << what;
      }
    }
  }
}

struct StorageCase {
  const char* name;
  MixedPrecision mode;
  RecipeKind recipe;
  bool emulate;
  bool recompute;
  bool bf16_weight_gradients = false;
  int64_t grad_accum_steps = 1;
  // 0: bit for bit. Otherwise the largest relative difference of a step's loss, the amax histories unchecked.
  double tolerance = 0.0;
};

// Trains case `c` on a backend that stores some tensors in bf16 and on one that stores their float32 values
// instead (`store` sets the option; `stored_type` says which type the backend reports), and expects the
// same run, bit for bit: losses, GEMM counts and the FP8 layers' amax histories.
void expect_storage_changes_nothing(const StorageCase& c,
                                    const std::function<void(CudaBackendOptions&, bool)>& store,
                                    const std::function<Dtype(const Backend&)>& stored_type) {
  TrainingRun runs[2];
  for (const bool bf16_storage : {true, false}) {
    CudaBackendOptions options;
    options.emulate_fp8 = c.emulate;
    options.bf16_attention = true;
    store(options, bf16_storage);
    auto gpu = make_cuda_backend(options);
    ASSERT_EQ(stored_type(*gpu), bf16_storage ? Dtype::bf16 : Dtype::f32) << c.name;
    PrecisionSettings p = precision(c.mode, c.recipe);
    p.recompute_mlp = c.recompute;
    p.bf16_weight_gradients = c.bf16_weight_gradients;
    // Stored apart, the bf16 and the float32 gradients are summed for the norm in two reductions, stored
    // together in one: the same norm but for its last bits, which clipping would carry into the update.
    runs[bf16_storage ? 0 : 1] = train(*gpu, p, c.grad_accum_steps, c.bf16_weight_gradients ? 0.0f : 1.0f);
  }
  const TrainingRun& bf16 = runs[0];
  const TrainingRun& f32 = runs[1];
  ASSERT_EQ(bf16.losses.size(), f32.losses.size());
  for (size_t s = 0; s < bf16.losses.size(); ++s) {
    ASSERT_FALSE(std::isnan(bf16.losses[s])) << c.name << ", step " << s;
    if (c.tolerance > 0.0) {
      ASSERT_TRUE(std::isfinite(f32.losses[s])) << c.name << ", step " << s;
      EXPECT_LE(std::abs(bf16.losses[s] - f32.losses[s]) / std::abs(f32.losses[s]), c.tolerance)
          << c.name << ", step " << s << ": " << bf16.losses[s] << " with bf16 storage, " << f32.losses[s]
          << " with float32";
      continue;
    }
    ASSERT_EQ(std::memcmp(&bf16.losses[s], &f32.losses[s], sizeof(float)), 0)
        << c.name << ", step " << s << ": " << bf16.losses[s] << " with bf16 storage, " << f32.losses[s]
        << " with float32";
    EXPECT_EQ(bf16.fp8_gemms[s], f32.fp8_gemms[s]) << c.name;
    EXPECT_EQ(bf16.other_gemms[s], f32.other_gemms[s]) << c.name;
  }
  ASSERT_EQ(bf16.states.size(), f32.states.size());
  for (size_t i = 0; i < bf16.states.size() && c.tolerance == 0.0; ++i) {
    EXPECT_EQ(bf16.states[i].activation.amax_history, f32.states[i].activation.amax_history)
        << c.name << ", " << bf16.layers[i];
    EXPECT_EQ(bf16.states[i].gradient.amax_history, f32.states[i].gradient.amax_history)
        << c.name << ", " << bf16.layers[i];
  }
  if (c.mode == MixedPrecision::fp8) {
    EXPECT_FALSE(bf16.states.empty()) << c.name;
  }
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() * 0.8) << c.name;
}

// Where cuDNN runs attention, attention's output and the gradients on either side of it are stored in bf16
// (CudaBackendOptions::attention_outputs_in_bf16), which cuDNN reads and writes anyway: the GEMMs and casts
// around it then read and write bf16 themselves instead of float32 copies converted to and from bf16. The
// values are the same, so training is the same, bit for bit, as with float32 storage: in bf16 mode (BF16
// GEMMs read and write the bf16 tensors), in fp8 mode with delayed scaling (fused casts read them), with
// current scaling (the bf16 values widened for the amax pass) and with emulated FP8 GEMMs (which write
// float32, rounded to bf16 after).
TEST(GpuTrainingAttentionStorage, Bf16OutputsTrainBitForBitAsFloat32) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const ModelConfig config = small_config();
  const std::string kernels = cuda_attention_kernels(kB, kT, config.channels, config.heads,
                                                     CudaBackendOptions::AttentionKernels::automatic);
  if (kernels.rfind("cuDNN", 0) != 0) GTEST_SKIP() << "attention runs on " << kernels;
  for (const StorageCase& c :
       {StorageCase{"bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false},
        StorageCase{"fp8 delayed", MixedPrecision::fp8, RecipeKind::delayed, false, false},
        StorageCase{"fp8 current", MixedPrecision::fp8, RecipeKind::current, false, false},
        StorageCase{"fp8 delayed, emulated", MixedPrecision::fp8, RecipeKind::delayed, true, false}}) {
    expect_storage_changes_nothing(
        c, [](CudaBackendOptions& o, bool bf16) { o.attention_outputs_in_bf16 = bf16; },
        [&](const Backend& b) {
          return b.storage_type({StorageRole::attention_output, config.channels, config.heads});
        });
  }
}

// The MLP's hidden activation (mlp.c_fc's output, GELU's input) and the gradient that reaches it, which the
// model rounds to bf16 in bf16 and fp8 modes, stored in bf16 (CudaBackendOptions::hidden_in_bf16): the
// GEMMs write them from their epilogues and the GELU kernels, fused casts included, read the bf16 values.
// In bf16 mode the inputs of the blocks' BF16 layers (LayerNorm's and GELU's outputs) are stored in bf16
// too, written by LayerNorm and GELU and read by both GEMMs.
// Training is the same, bit for bit, as storing the float32 values that the model rounds in place: in bf16
// mode, in fp8 mode with delayed scaling (fused casts), current scaling (unfused), emulated FP8 GEMMs (their
// float32 results rounded after) and fp8.recompute_mlp (the rerun GEMM writes bf16 too).
TEST(GpuTrainingHiddenStorage, Bf16TrainsBitForBitAsRoundedFloat32) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const StorageCase& c :
       {StorageCase{"bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false},
        StorageCase{"fp8 delayed", MixedPrecision::fp8, RecipeKind::delayed, false, false},
        StorageCase{"fp8 current", MixedPrecision::fp8, RecipeKind::current, false, false},
        StorageCase{"fp8 delayed, emulated", MixedPrecision::fp8, RecipeKind::delayed, true, false},
        StorageCase{"fp8 delayed, recompute", MixedPrecision::fp8, RecipeKind::delayed, false, true},
        StorageCase{"fp8 current, emulated, recompute", MixedPrecision::fp8, RecipeKind::current, true,
                    true}}) {
    expect_storage_changes_nothing(
        c, [](CudaBackendOptions& o, bool bf16) { o.hidden_in_bf16 = bf16; },
        [](const Backend& b) { return b.storage_type({StorageRole::rounded_activation}); });
  }
}

// Weight gradients kept rounded to bf16 (train.weight_gradients = "bf16") stored in bf16
// (CudaBackendOptions::weight_gradients_in_bf16): the weight-gradient GEMMs write them (adding to them on
// later micro-batches) from their epilogues, the gradient norm and AdamW read the bf16 values. With one
// micro-batch a step, training is the same, bit for bit, as storing the float32 GEMM output and rounding it
// in place: in bf16 mode and in fp8 mode with delayed and current scaling. With three, the GEMMs that add
// into the gradient are cuBLASLt's kernels for a bf16 and for a float32 C, whose sums are not the same bits
// (measured on the H100: step 1's losses differ in the sixth digit): the runs agree within 1e-3 a step.
TEST(GpuTrainingWeightGradientStorage, Bf16TrainsBitForBitAsRoundedFloat32) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (const StorageCase& c :
       {StorageCase{"bf16", MixedPrecision::bf16, RecipeKind::delayed, false, false, true},
        StorageCase{"fp8 delayed", MixedPrecision::fp8, RecipeKind::delayed, false, false, true},
        StorageCase{"fp8 current", MixedPrecision::fp8, RecipeKind::current, false, false, true},
        StorageCase{"bf16, 3 micro-batches", MixedPrecision::bf16, RecipeKind::delayed, false, false, true, 3,
                    1e-3},
        StorageCase{"fp8 delayed, 3 micro-batches", MixedPrecision::fp8, RecipeKind::delayed, false, false,
                    true, 3, 1e-3}}) {
    expect_storage_changes_nothing(
        c, [](CudaBackendOptions& o, bool bf16) { o.weight_gradients_in_bf16 = bf16; },
        [](const Backend& b) {
          LinearExecution fp8;
          fp8.forward = fp8.input_gradient = fp8.weight_gradient = GemmMode::fp8;
          return b.storage_type({.role = StorageRole::weight_gradient, .layer = &fp8});
        });
  }
}

}  // namespace
}  // namespace octet
