// What the data-parallel tests share: a tiny model trained on one rank (accumulating as several ranks would)
// and on several ranks as threads, what each ends with, bit-level comparisons, and a token shard on disk.
#pragma once

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/dist/in_process.h"
#include "octet/io/data_loader.h"
#include "octet/io/token_shard.h"
#include "octet/train/data_parallel.h"

namespace octet::dist_testing {

using testing::mode;
using testing::pattern_stream;
using testing::tiny_config;

constexpr int64_t B = 2, T = 16;
constexpr int kSteps = 4;

// The models the tests train: GPT-2, Llama (fused q/k/v and gate/up weights, grouped-query attention) and a
// mixture of experts (routing, the balance loss, every expert in FP8 with a scaling state of its own).
enum class Architecture : uint8_t { gpt2, llama, moe };

struct RunShape {
  Architecture architecture = Architecture::gpt2;
  MixedPrecision precision = MixedPrecision::fp32;
  RecipeKind recipe = RecipeKind::delayed;
  int ranks = 2;
  int64_t micro = 1;  // micro-batches per rank and step
  bool shard = false;
  // With shard: the shard groups (a hybrid layout: the optimizer state sharded over ranks / replicate ranks,
  // each group holding a whole copy); 1: sharded over every rank.
  int replicate = 1;
  dist::GradientReduceType reduce = dist::GradientReduceType::float32;
  // What the blocks keep for their backward, and whether FP8 layers run their forward GEMMs again there.
  ActivationCheckpointing checkpointing = ActivationCheckpointing::none;
  bool recompute = false;
  float initial_loss_scale = 0.0f;  // fp16: 0 for the default
  // With a sharded optimizer: the FP8 weights gathered as FP8 codes (DataParallel::fp8_weight_gather).
  bool fp8_gather = false;
  // The linear layers' weight gradients kept in BF16 (train.weight_gradients = "bf16"), which the ranks
  // sum in BF16.
  bool bf16_weight_gradients = false;
  // With FP8 gathers: fully sharded weights, the copies given back after use and gathered again
  // (DataParallel::reshard_after_forward).
  bool reshard = false;
};

inline std::string name_of(const RunShape& s) {
  std::string name = s.architecture == Architecture::gpt2    ? ""
                     : s.architecture == Architecture::llama ? "llama_"
                                                             : "moe_";
  name += mixed_precision_name(s.precision);
  if (s.precision == MixedPrecision::fp8) name += std::string("_") + recipe_name(s.recipe);
  return name + "_" + std::to_string(s.ranks) + "ranks_" + std::to_string(s.micro) + "micro" +
         (s.shard ? "_zero1" : "") +
         (s.replicate > 1
              ? "_hybrid" + std::to_string(s.ranks / s.replicate) + "x" + std::to_string(s.replicate)
              : "") +
         (s.reduce == dist::GradientReduceType::bf16 ? "_bf16sum" : "") +
         (s.checkpointing == ActivationCheckpointing::full        ? "_full_checkpointing"
          : s.checkpointing == ActivationCheckpointing::selective ? "_selective_checkpointing"
                                                                  : "") +
         (s.recompute ? "_recompute" : "") + (s.fp8_gather ? "_fp8gather" : "") +
         (s.bf16_weight_gradients ? "_bf16wgrad" : "") + (s.reshard ? "_reshard" : "");
}

// What a rank ends with.
struct Outcome {
  std::vector<float> losses, grad_norms, loss_scales;
  std::vector<int> skipped;
  std::vector<std::string> skip_reasons;
  std::vector<float> params, m, v;
  std::vector<float> scaling;  // every FP8 layer's scales, amax histories and counts, as floats
  std::vector<io::LoaderPosition> positions;  // after each step, where the data came from a loader
};

inline void PrintTo(const RunShape& s, std::ostream* out) {
  *out << name_of(s);
}

inline TrainSettings settings_of(const RunShape& s) {
  TrainSettings t;
  t.batch_size = B;
  t.seq_len = T;
  t.grad_accum_steps = s.micro;
  t.schedule.max_learning_rate = 3e-3f;
  t.schedule.warmup_steps = 1;
  t.schedule.total_steps = 10;
  t.grad_clip = 0.5f;  // clips on some steps: the norm must agree to the bit
  t.loss_scale.dynamic = s.precision == MixedPrecision::fp16;
  if (s.initial_loss_scale > 0.0f) t.loss_scale.initial_scale = s.initial_loss_scale;
  return t;
}

inline std::unique_ptr<Model> model_of(const RunShape& s, Backend& backend) {
  PrecisionSettings p = mode(s.precision);
  p.recipe = s.recipe;
  p.lm_head = true;  // the head in FP8 too, where the mode is fp8
  p.experts = true;
  p.activation_checkpointing = s.checkpointing;
  p.recompute_mlp = p.recompute_qkv = p.recompute_residual = s.recompute;
  p.bf16_weight_gradients = s.bf16_weight_gradients;
  const ModelConfig c = s.architecture == Architecture::gpt2    ? tiny_config()
                        : s.architecture == Architecture::llama ? testing::tiny_llama_config()
                                                                : testing::tiny_moe_config(true);
  // The policy sees the tokens of a whole step, whichever way the step is split.
  std::unique_ptr<Model> m = make_model(c, backend, PrecisionPolicy(p, c, B * T * s.micro * s.ranks), B, T);
  m->init_weights(11);
  return m;
}

inline void record_scaling(Model& m, std::vector<float>& out) {
  for (const LinearPlan& plan : m.policy().layers()) {
    const Fp8LinearState* state = m.fp8_state(plan.name);
    if (state == nullptr) continue;
    for (const ScalingState* s : {&state->activation, &state->gradient, &state->weight}) {
      out.push_back(s->scale);
      out.push_back(s->scale_inv);
      out.push_back(s->last_amax);
      out.insert(out.end(), s->amax_history.begin(), s->amax_history.end());
      out.push_back(static_cast<float>(s->updates));
      out.push_back(static_cast<float>(s->degenerate_amax));
    }
    out.push_back(state->weight_copy_scale);
  }
}

// The AdamW moments of every parameter: the trainer's own, or gathered from every rank's shard.
inline void whole_moments(Trainer& trainer, int64_t n, std::vector<float>& m, std::vector<float>& v) {
  AdamW& opt = trainer.optimizer();
  if (!opt.sharded()) {
    m.assign(opt.first_moment(), opt.first_moment() + n);
    v.assign(opt.second_moment(), opt.second_moment() + n);
    return;
  }
  dist::Communicator& c = *trainer.parallel().shard_group();
  const dist::ShardRange& shard = opt.shard();
  for (auto [moment, out] : {std::pair{opt.first_moment(), &m}, std::pair{opt.second_moment(), &v}}) {
    std::vector<float> mine(static_cast<size_t>(shard.chunk), 0.0f),
        all(static_cast<size_t>(shard.chunk * c.size()));
    std::copy(moment, moment + shard.size(), mine.begin());
    c.all_gather(std::span<const float>(mine), std::span<float>(all));
    out->assign(all.begin(), all.begin() + n);
  }
}

// Trains `steps` steps and records the outcome; `after_steps` runs once the steps are done, before anything
// is recorded (a checkpoint saved there sees the ranks as training leaves them), and `after_each_step` after
// every step.
inline Outcome train(const RunShape& s, Model& m, Trainer& trainer, const BatchSource& data,
                     const io::DataLoader* loader = nullptr, int steps = kSteps,
                     const std::function<void()>& after_steps = {},
                     const std::function<void()>& after_each_step = {}) {
  Outcome o;
  for (int i = 0; i < steps; ++i) {
    const StepResult r = trainer.step(data);
    if (after_each_step) after_each_step();
    if (s.initial_loss_scale == 0.0f) {
      EXPECT_FALSE(r.skipped) << r.skip_reason;
    }
    o.skipped.push_back(r.skipped ? 1 : 0);
    o.skip_reasons.push_back(r.skip_reason);
    o.loss_scales.push_back(r.loss_scale);
    EXPECT_EQ(r.tokens, B * T * s.micro * s.ranks);
    o.losses.push_back(r.loss);
    o.grad_norms.push_back(r.grad_norm);
    if (loader != nullptr) o.positions.push_back(loader->position());
  }
  if (after_steps) after_steps();
  trainer.gather_master_weights();  // FP8 gathers leave the float32 masters outside a shard stale
  o.params.assign(m.params(), m.params() + m.parameter_count());
  whole_moments(trainer, m.parameter_count(), o.m, o.v);
  record_scaling(m, o.scaling);
  return o;
}

// One rank accumulating each step's ranks x micro micro-batches as the ranks would (DataParallel's
// emulated ranks), reading them from one source in order.
inline Outcome one_rank(const RunShape& s,
                        const std::function<BatchSource(int rank, int ranks, io::DataLoader**)>& source) {
  auto backend = make_cpu_backend();
  std::unique_ptr<Model> m = model_of(s, *backend);
  Trainer trainer(*m, settings_of(s),
                  DataParallel{.shard_optimizer_state = s.shard,
                               .reduce_type = s.reduce,
                               .emulated_ranks = s.ranks,
                               .emulated_shard_ranks = s.replicate > 1 ? s.ranks / s.replicate : 0});
  io::DataLoader* loader = nullptr;
  const BatchSource data = source(0, 1, &loader);
  return train(s, *m, trainer, data, loader);
}

// s.ranks ranks as threads, each with its model and its own copy of the source, taking its micro-batches;
// `after_each_step` runs on every rank after each of its steps.
inline std::vector<Outcome> many_ranks(
    const RunShape& s, const std::function<BatchSource(int rank, int ranks, io::DataLoader**)>& source,
    const std::function<void(Model&, Trainer&)>& after_each_step = {}) {
  std::vector<Outcome> outcomes(static_cast<size_t>(s.ranks));
  dist::run_ranks(s.ranks, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    // A hybrid layout: the shard groups are consecutive ranks (topology.h).
    const int shard = s.ranks / s.replicate;
    std::unique_ptr<dist::Communicator> group =
        s.replicate > 1 ? c.split(c.rank() / shard, c.rank() % shard) : nullptr;
    Trainer trainer(*m, settings_of(s),
                    DataParallel{.communicator = &c,
                                 .shard_optimizer_state = s.shard,
                                 .reduce_scatter = s.shard && s.replicate == 1,
                                 .fp8_weight_gather = s.fp8_gather,
                                 // The token embedding (at least 2048 elements) gathered in place, the
                                 // norms and biases packed: both ways an FP8 gather moves float32 values.
                                 .in_place_gather_floats = 2048,
                                 // One gather buffer: each block's codes gathered once the block before
                                 // made its copies (the tiny models have two blocks).
                                 .gather_buffers = 1,
                                 .reshard_after_forward = s.reshard,
                                 .reduce_type = s.reduce,
                                 .shard_communicator = group.get()});
    if (s.shard) {
      const dist::ShardRange expected = dist::shard_range(m->parameter_count(), c.rank() % shard, shard);
      EXPECT_EQ(trainer.optimizer().shard().begin, expected.begin) << "rank " << c.rank();
      EXPECT_EQ(trainer.optimizer().shard().end, expected.end) << "rank " << c.rank();
    }
    io::DataLoader* loader = nullptr;
    const BatchSource data =
        rank_batches(source(c.rank(), c.size(), &loader), c.rank(), c.size(), s.micro, B, T);
    // FP8 gathers in FP8 mode send some weights as codes (the equalities would hold vacuously otherwise).
    if (s.fp8_gather && s.precision == MixedPrecision::fp8) {
      EXPECT_GT(trainer.parameter_gather_volume().fp8_weights, 0) << "rank " << c.rank();
    }
    std::function<void()> each;
    if (after_each_step) each = [&] { after_each_step(*m, trainer); };
    outcomes[static_cast<size_t>(c.rank())] = train(s, *m, trainer, data, loader, kSteps, {}, each);
  });
  return outcomes;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first element where a and b differ in their bits, for the failure message.
inline std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
    }
  }
  return "none";
}

inline void expect_same(const Outcome& reference, const Outcome& rank, const std::string& who) {
  for (auto [what, a, b] : {std::tuple{"losses", &reference.losses, &rank.losses},
                            std::tuple{"gradient norms", &reference.grad_norms, &rank.grad_norms},
                            std::tuple{"loss scales", &reference.loss_scales, &rank.loss_scales},
                            std::tuple{"parameters", &reference.params, &rank.params},
                            std::tuple{"first moments", &reference.m, &rank.m},
                            std::tuple{"second moments", &reference.v, &rank.v},
                            std::tuple{"FP8 scaling state", &reference.scaling, &rank.scaling}}) {
    EXPECT_TRUE(same_bits(*a, *b)) << who << ": " << what << " differ at " << first_difference(*a, *b);
  }
  EXPECT_EQ(reference.positions, rank.positions) << who << ": the data loader's positions";
  EXPECT_EQ(reference.skipped, rank.skipped) << who << ": the skipped steps";
  EXPECT_EQ(reference.skip_reasons, rank.skip_reasons) << who << ": why steps were skipped";
}

inline BatchSource pattern(int, int, io::DataLoader**) {
  return pattern_stream(5, B, T, tiny_config().vocab_size);
}

// A token shard of random tokens in a fresh directory, removed at the end.
class TokenShardFile {
 public:
  TokenShardFile() {
    dir_ = std::filesystem::temp_directory_path() /
           ("octet_dist_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    const std::vector<int32_t> tokens = testing::random_tokens(20 * T + 1, 3, tiny_config().vocab_size);
    io::write_token_shard(path(), tokens, io::TokenWidth::uint16);
  }
  ~TokenShardFile() { std::filesystem::remove_all(dir_); }
  std::filesystem::path path() const { return dir_ / "train_000000.bin"; }

 private:
  std::filesystem::path dir_;
};

}  // namespace octet::dist_testing
