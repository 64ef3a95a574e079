// Data-parallel training on the CPU, ranks as threads: 2 and 4 ranks, with and without a sharded optimizer
// state (ZeRO stage 1), give the same bits as one rank accumulating the same global batch in every precision
// mode: the losses, gradient norms, parameters, AdamW moments and FP8 scaling state of every rank. The data
// loader's position after each step is the same on every rank and on one rank, so a run resumes on another
// number of ranks where it stopped.
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/dist/in_process.h"
#include "octet/io/data_loader.h"
#include "octet/io/token_shard.h"
#include "octet/train/data_parallel.h"

namespace octet {
namespace {

using testing::mode;
using testing::pattern_stream;
using testing::tiny_config;

constexpr int64_t B = 2, T = 16;
constexpr int kSteps = 4;

struct RunShape {
  MixedPrecision precision = MixedPrecision::fp32;
  RecipeKind recipe = RecipeKind::delayed;
  int ranks = 2;
  int64_t micro = 1;  // micro-batches per rank and step
  bool shard = false;
  float initial_loss_scale = 0.0f;  // fp16: 0 for the default
};

std::string name_of(const RunShape& s) {
  std::string name(mixed_precision_name(s.precision));
  if (s.precision == MixedPrecision::fp8) name += std::string("_") + recipe_name(s.recipe);
  return name + "_" + std::to_string(s.ranks) + "ranks_" + std::to_string(s.micro) + "micro" +
         (s.shard ? "_zero1" : "");
}

// What a rank ends with.
struct Outcome {
  std::vector<float> losses, grad_norms, loss_scales;
  std::vector<int> skipped;
  std::vector<float> params, m, v;
  std::vector<float> scaling;  // every FP8 layer's scales, amax histories and counts, as floats
  std::vector<io::LoaderPosition> positions;  // after each step, where the data came from a loader
};

void PrintTo(const RunShape& s, std::ostream* out) {
  *out << name_of(s);
}

TrainSettings settings_of(const RunShape& s) {
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

std::unique_ptr<Model> model_of(const RunShape& s, Backend& backend) {
  PrecisionSettings p = mode(s.precision);
  p.recipe = s.recipe;
  p.lm_head = true;  // the head in FP8 too, where the mode is fp8
  const ModelConfig c = tiny_config();
  // The policy sees the tokens of a whole step, whichever way the step is split.
  std::unique_ptr<Model> m = make_model(c, backend, PrecisionPolicy(p, c, B * T * s.micro * s.ranks), B, T);
  m->init_weights(11);
  return m;
}

void record_scaling(Model& m, std::vector<float>& out) {
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

// Trains kSteps steps and records the outcome; `full_moments` gathers a shard's moments from every rank.
Outcome train(const RunShape& s, Model& m, Trainer& trainer, const BatchSource& data,
              const std::function<void(std::vector<float>&, std::vector<float>&)>& full_moments,
              const io::DataLoader* loader = nullptr) {
  Outcome o;
  for (int i = 0; i < kSteps; ++i) {
    const StepResult r = trainer.step(data);
    if (s.initial_loss_scale == 0.0f) {
      EXPECT_FALSE(r.skipped) << r.skip_reason;
    }
    o.skipped.push_back(r.skipped ? 1 : 0);
    o.loss_scales.push_back(r.loss_scale);
    EXPECT_EQ(r.tokens, B * T * s.micro * s.ranks);
    o.losses.push_back(r.loss);
    o.grad_norms.push_back(r.grad_norm);
    if (loader != nullptr) o.positions.push_back(loader->position());
  }
  o.params.assign(m.params(), m.params() + m.parameter_count());
  full_moments(o.m, o.v);
  record_scaling(m, o.scaling);
  return o;
}

// One rank accumulating each step's ranks x micro micro-batches as the ranks would (DataParallel's
// emulated ranks), reading them from one source in order.
Outcome one_rank(const RunShape& s,
                 const std::function<BatchSource(int rank, int ranks, io::DataLoader**)>& source) {
  auto backend = make_cpu_backend();
  std::unique_ptr<Model> m = model_of(s, *backend);
  Trainer trainer(*m, settings_of(s), DataParallel{.emulated_ranks = s.ranks});
  io::DataLoader* loader = nullptr;
  const BatchSource data = source(0, 1, &loader);
  const int64_t n = m->parameter_count();
  return train(
      s, *m, trainer, data,
      [&](std::vector<float>& mm, std::vector<float>& vv) {
        mm.assign(trainer.optimizer().first_moment(), trainer.optimizer().first_moment() + n);
        vv.assign(trainer.optimizer().second_moment(), trainer.optimizer().second_moment() + n);
      },
      loader);
}

// s.ranks ranks as threads, each with its model and its own copy of the source, taking its micro-batches.
std::vector<Outcome> many_ranks(
    const RunShape& s, const std::function<BatchSource(int rank, int ranks, io::DataLoader**)>& source) {
  std::vector<Outcome> outcomes(static_cast<size_t>(s.ranks));
  dist::run_ranks(s.ranks, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s), DataParallel{.communicator = &c, .shard_optimizer_state = s.shard});
    io::DataLoader* loader = nullptr;
    const BatchSource data =
        rank_batches(source(c.rank(), c.size(), &loader), c.rank(), c.size(), s.micro, B, T);
    const int64_t n = m->parameter_count();
    auto moments = [&](std::vector<float>& mm, std::vector<float>& vv) {
      AdamW& opt = trainer.optimizer();
      if (!opt.sharded()) {
        mm.assign(opt.first_moment(), opt.first_moment() + n);
        vv.assign(opt.second_moment(), opt.second_moment() + n);
        return;
      }
      const dist::ShardRange& shard = opt.shard();
      for (auto [moment, out] : {std::pair{opt.first_moment(), &mm}, std::pair{opt.second_moment(), &vv}}) {
        std::vector<float> mine(static_cast<size_t>(shard.chunk), 0.0f),
            all(static_cast<size_t>(shard.chunk * c.size()));
        std::copy(moment, moment + shard.size(), mine.begin());
        c.all_gather(std::span<const float>(mine), std::span<float>(all));
        out->assign(all.begin(), all.begin() + n);
      }
    };
    outcomes[static_cast<size_t>(c.rank())] = train(s, *m, trainer, data, moments, loader);
  });
  return outcomes;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The first element where a and b differ in their bits, for the failure message.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
    }
  }
  return "none";
}

void expect_same(const Outcome& reference, const Outcome& rank, const std::string& who) {
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
}

BatchSource pattern(int, int, io::DataLoader**) {
  return pattern_stream(5, B, T, tiny_config().vocab_size);
}

class DataParallelTraining : public ::testing::TestWithParam<RunShape> {};

TEST_P(DataParallelTraining, EveryRankHoldsTheBitsOfOneRankAccumulatingTheGlobalBatch) {
  const RunShape s = GetParam();
  const Outcome reference = one_rank(s, pattern);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_NE(reference.losses.front(), reference.losses.back()) << "the model trains";
  if (s.precision == MixedPrecision::fp8) {
    EXPECT_FALSE(reference.scaling.empty());
  }
  const std::vector<Outcome> ranks = many_ranks(s, pattern);
  for (int r = 0; r < s.ranks; ++r)
    expect_same(reference, ranks[static_cast<size_t>(r)], "rank " + std::to_string(r));
}

std::vector<RunShape> every_shape() {
  std::vector<RunShape> out;
  for (const auto& [precision, recipe] : {std::pair{MixedPrecision::fp32, RecipeKind::delayed},
                                          std::pair{MixedPrecision::bf16, RecipeKind::delayed},
                                          std::pair{MixedPrecision::fp16, RecipeKind::delayed},
                                          std::pair{MixedPrecision::fp8, RecipeKind::delayed},
                                          std::pair{MixedPrecision::fp8, RecipeKind::current}}) {
    for (const int ranks : {2, 4}) {
      for (const int64_t micro : {int64_t{1}, int64_t{2}}) {
        for (const bool shard : {false, true}) out.push_back({precision, recipe, ranks, micro, shard});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Setups, DataParallelTraining, ::testing::ValuesIn(every_shape()),
                         [](const auto& p) { return name_of(p.param); });

// The same step on 2 ranks but each rank reading the whole batch's first micro-batches (no sharding of the
// data) must differ: the equality above rests on every rank reading its own micro-batches.
TEST(DataParallel, RanksThatReadTheSameMicroBatchesDoNotMatch) {
  const RunShape s{.precision = MixedPrecision::fp32, .ranks = 2, .micro = 1};
  const Outcome reference = one_rank(s, pattern);
  std::vector<Outcome> outcomes(2);
  dist::run_ranks(2, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s), DataParallel{.communicator = &c});
    const BatchSource data = pattern_stream(5, B, T, tiny_config().vocab_size);  // not rank_batches
    outcomes[static_cast<size_t>(c.rank())].losses.push_back(trainer.step(data).loss);
  });
  EXPECT_NE(outcomes[0].losses[0], reference.losses[0]);
  EXPECT_EQ(outcomes[0].losses[0], outcomes[1].losses[0]) << "both ranks still agree with each other";
}

TEST(DataParallel, LossScalingSkipsTheSameStepsOnEveryRank) {
  // fp16 from a loss scale so large that the gradients overflow: the first step is skipped and the scale
  // backs off, on every rank as on one.
  const RunShape s{.precision = MixedPrecision::fp16, .ranks = 2, .micro = 2, .initial_loss_scale = 0x1p24f};
  const Outcome reference = one_rank(s, pattern);
  EXPECT_EQ(reference.skipped.front(), 1);
  EXPECT_EQ(reference.skipped.back(), 0) << "the scale came down far enough to train";
  const std::vector<Outcome> ranks = many_ranks(s, pattern);
  for (int r = 0; r < s.ranks; ++r) {
    expect_same(reference, ranks[static_cast<size_t>(r)], "rank " + std::to_string(r));
  }
}

TEST(DataParallel, ANonFiniteLossOnOneRankSkipsTheStepOnEveryRank) {
  // Rank 1's replica alone holds a NaN weight: its loss is NaN, the ranks' loss sum is too, and every rank
  // skips the step, keeping its parameters.
  const RunShape s{.precision = MixedPrecision::fp32, .ranks = 2, .micro = 1};
  std::vector<StepResult> results(2);
  std::vector<std::vector<float>> before(2), after(2);
  dist::run_ranks(2, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    const size_t r = static_cast<size_t>(c.rank());
    if (r == 1) {
      m->params()[m->parameter("ln_f.weight").offset] = NAN;
      m->refresh_weight_copies();
    }
    Trainer trainer(*m, settings_of(s), DataParallel{.communicator = &c});
    before[r].assign(m->params(), m->params() + m->parameter_count());
    results[r] = trainer.step(rank_batches(pattern(0, 2, nullptr), c.rank(), 2, 1, B, T));
    after[r].assign(m->params(), m->params() + m->parameter_count());
  });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r].skipped) << "rank " << r;
    EXPECT_EQ(results[r].skip_reason, results[0].skip_reason);
    EXPECT_NE(results[r].skip_reason.find("non-finite loss"), std::string::npos) << results[r].skip_reason;
    EXPECT_TRUE(same_bits(before[r], after[r])) << "rank " << r << " kept its parameters";
  }
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

TEST(DataParallel, ShardedLoaderTrainsAsOneLoaderAndStandsWhereItWould) {
  // 20 windows of T + 1 tokens, shuffled; 2 ranks x 2 micro-batches of 2 windows a step: an epoch ends
  // inside the third step, so positions cross into epoch 1.
  const TokenShardFile shard;
  std::mutex mutex;
  std::vector<std::unique_ptr<io::DataLoader>> loaders;
  auto source = [&](int, int, io::DataLoader** loader) -> BatchSource {
    std::lock_guard lock(mutex);
    loaders.push_back(std::make_unique<io::DataLoader>(
        std::vector{shard.path()}, io::DataLoaderOptions{B, T, true, 9, tiny_config().vocab_size}));
    io::DataLoader* l = loaders.back().get();
    *loader = l;
    return [l](int32_t* tokens, int32_t* targets) {
      l->next_batch(std::span<int32_t>(tokens, B * T), std::span<int32_t>(targets, B * T));
    };
  };
  const RunShape s{.precision = MixedPrecision::fp8, .ranks = 2, .micro = 2, .shard = true};
  const Outcome reference = one_rank(s, source);
  EXPECT_EQ(reference.positions.back().epoch, 1);
  const std::vector<Outcome> ranks = many_ranks(s, source);
  for (int r = 0; r < s.ranks; ++r)
    expect_same(reference, ranks[static_cast<size_t>(r)], "rank " + std::to_string(r));
}

TEST(DataParallel, ALoaderResumedOnAnotherNumberOfRanksReadsWhatOneLoaderWould) {
  // Two steps on 2 ranks x 2 micro-batches, then the position is kept; 4 ranks x 1 micro-batch resume from
  // it. Together the 4 ranks read, in rank order, the micro-batches one loader reads next.
  const TokenShardFile shard;
  const io::DataLoaderOptions options{B, T, true, 9, tiny_config().vocab_size};
  io::DataLoader one({shard.path()}, options);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  io::LoaderPosition kept;
  std::vector<io::LoaderPosition> seen(2);
  for (int r = 0; r < 2; ++r) {
    io::DataLoader loader({shard.path()}, options);
    const BatchSource mine = rank_batches(
        [&](int32_t* x, int32_t* y) {
          loader.next_batch(std::span<int32_t>(x, B * T), std::span<int32_t>(y, B * T));
        },
        r, 2, 2, B, T);
    for (int i = 0; i < 2 * 2; ++i) mine(tokens.data(), targets.data());
    seen[static_cast<size_t>(r)] = loader.position();
  }
  EXPECT_EQ(seen[0], seen[1]);
  for (int i = 0; i < 2 * 2 * 2; ++i) one.next_batch(std::span<int32_t>(tokens), std::span<int32_t>(targets));
  EXPECT_EQ(seen[0], one.position()) << "after two steps every rank's loader stands where one loader does";
  kept = seen[0];
  for (int r = 0; r < 4; ++r) {
    io::DataLoader loader({shard.path()}, options);
    loader.seek(kept);
    const BatchSource mine = rank_batches(
        [&](int32_t* x, int32_t* y) {
          loader.next_batch(std::span<int32_t>(x, B * T), std::span<int32_t>(y, B * T));
        },
        r, 4, 1, B, T);
    std::vector<int32_t> rank_tokens(B * T), rank_targets(B * T);
    mine(rank_tokens.data(), rank_targets.data());
    one.next_batch(std::span<int32_t>(tokens), std::span<int32_t>(targets));
    EXPECT_EQ(rank_tokens, tokens) << "rank " << r << " of 4";
    EXPECT_EQ(rank_targets, targets) << "rank " << r << " of 4";
  }
}

TEST(DataParallel, AWorldOfOneIsTrainingAsBefore) {
  // A communicator of one rank, and no communicator at all, against the plain trainer: the same bits.
  const RunShape s{.precision = MixedPrecision::fp8, .ranks = 1, .micro = 2};
  auto plain = [&](DataParallel parallel) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s), parallel);
    const BatchSource data = pattern(0, 1, nullptr);
    std::vector<float> losses;
    for (int i = 0; i < kSteps; ++i) losses.push_back(trainer.step(data).loss);
    losses.insert(losses.end(), m->params(), m->params() + m->parameter_count());
    record_scaling(*m, losses);
    return losses;
  };
  const std::vector<float> before = [&] {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s));
    const BatchSource data = pattern(0, 1, nullptr);
    std::vector<float> losses;
    for (int i = 0; i < kSteps; ++i) losses.push_back(trainer.step(data).loss);
    losses.insert(losses.end(), m->params(), m->params() + m->parameter_count());
    record_scaling(*m, losses);
    return losses;
  }();
  EXPECT_TRUE(same_bits(before, plain(DataParallel{})));
  std::vector<float> alone;
  dist::run_ranks(1, [&](dist::Communicator& c) { alone = plain(DataParallel{.communicator = &c}); });
  EXPECT_TRUE(same_bits(before, alone)) << first_difference(before, alone);
}

TEST(DataParallel, RefusesWhatItCannotDoYet) {
  auto backend = make_cpu_backend();
  const RunShape s;
  std::unique_ptr<Model> m = model_of(s, *backend);
  auto trainer = [&](DataParallel parallel) { Trainer t(*m, settings_of(s), parallel); };
  EXPECT_THROW(trainer(DataParallel{.shard_optimizer_state = true}), Error) << "a shard needs its ranks";
  EXPECT_THROW(trainer(DataParallel{.emulated_ranks = 0}), Error);
}

}  // namespace
}  // namespace octet
