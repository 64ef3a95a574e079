// Data-parallel training on the CPU, ranks as threads: 2 and 4 ranks, with and without a sharded optimizer
// state (ZeRO stage 1), give the same bits as one rank accumulating the same global batch in every precision
// mode: the losses, gradient norms, parameters, AdamW moments and FP8 scaling state of every rank. The data
// loader's position after each step is the same on every rank and on one rank, so a run resumes on another
// number of ranks where it stopped.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "dist_fixture.h"

namespace octet {
namespace {

using namespace dist_testing;
using testing::pattern_stream;
using testing::tiny_config;

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
        for (const bool shard : {false, true}) {
          out.push_back(
              {.precision = precision, .recipe = recipe, .ranks = ranks, .micro = micro, .shard = shard});
        }
      }
    }
  }
  // Gradients summed in BF16.
  for (const MixedPrecision precision : {MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp8}) {
    for (const int ranks : {2, 4}) {
      out.push_back({.precision = precision,
                     .ranks = ranks,
                     .micro = 2,
                     .shard = ranks == 4,
                     .reduce = dist::GradientReduceType::bf16});
    }
  }
  // Hybrid layouts (dp_shard = 2, dp_replicate = 2): the optimizer state sharded within each pair of ranks,
  // the gradients summed over all four.
  for (const auto& [precision, recipe] : {std::pair{MixedPrecision::fp32, RecipeKind::delayed},
                                          std::pair{MixedPrecision::bf16, RecipeKind::delayed},
                                          std::pair{MixedPrecision::fp8, RecipeKind::delayed},
                                          std::pair{MixedPrecision::fp8, RecipeKind::current}}) {
    for (const int64_t micro : {int64_t{1}, int64_t{2}}) {
      out.push_back({.precision = precision,
                     .recipe = recipe,
                     .ranks = 4,
                     .micro = micro,
                     .shard = true,
                     .replicate = 2});
    }
  }
  out.push_back({.precision = MixedPrecision::fp8,
                 .ranks = 4,
                 .micro = 2,
                 .shard = true,
                 .replicate = 2,
                 .reduce = dist::GradientReduceType::bf16});
  // A hybrid layout whose FP8 weights travel as codes within each shard group.
  out.push_back({.precision = MixedPrecision::fp8,
                 .ranks = 4,
                 .micro = 1,
                 .shard = true,
                 .replicate = 2,
                 .fp8_gather = true});
  // FP8 with activation checkpointing (a block's forward again in the backward, casting with the scales the
  // first forward took) and with FP8 forward GEMMs run again from their input codes.
  for (const auto& [checkpointing, recompute] :
       {std::pair{ActivationCheckpointing::full, false}, std::pair{ActivationCheckpointing::selective, false},
        std::pair{ActivationCheckpointing::none, true}}) {
    out.push_back({.precision = MixedPrecision::fp8,
                   .ranks = 2,
                   .micro = 2,
                   .shard = true,
                   .checkpointing = checkpointing,
                   .recompute = recompute});
  }
  // The FP8 weights gathered as FP8 codes: each recipe, 2 and 4 ranks (a weight split between ranks), with
  // activation checkpointing, and with a BF16 phase's layers (whose weights still travel in float32).
  for (const RecipeKind recipe : {RecipeKind::delayed, RecipeKind::current, RecipeKind::static_scale}) {
    for (const int ranks : {2, 4}) {
      out.push_back({.precision = MixedPrecision::fp8,
                     .recipe = recipe,
                     .ranks = ranks,
                     .micro = ranks == 2 ? 2 : 1,
                     .shard = true,
                     .fp8_gather = true});
    }
  }
  out.push_back({.precision = MixedPrecision::fp8,
                 .ranks = 2,
                 .micro = 1,
                 .shard = true,
                 .checkpointing = ActivationCheckpointing::full,
                 .fp8_gather = true});
  out.push_back({.precision = MixedPrecision::bf16, .ranks = 2, .micro = 1, .shard = true, .fp8_gather = true});
  // The other architectures: 2 ranks of 2 micro-batches, in float32 and in FP8.
  for (const Architecture architecture : {Architecture::llama, Architecture::moe}) {
    for (const MixedPrecision precision : {MixedPrecision::fp32, MixedPrecision::fp8}) {
      for (const bool shard : {false, true}) {
        out.push_back(
            {.architecture = architecture, .precision = precision, .ranks = 2, .micro = 2, .shard = shard});
      }
      if (precision == MixedPrecision::fp8) {
        out.push_back({.architecture = architecture,
                       .precision = precision,
                       .ranks = 2,
                       .micro = 2,
                       .shard = true,
                       .fp8_gather = true});
      }
    }
  }
  // Weight gradients kept in BF16, which the ranks sum in BF16: with and without a sharded optimizer, its
  // sums reduce-scattered, its FP8 weights gathered as codes; Llama's fused weights.
  for (const MixedPrecision precision : {MixedPrecision::bf16, MixedPrecision::fp8}) {
    for (const int ranks : {2, 4}) {
      for (const bool shard : {false, true}) {
        out.push_back({.precision = precision,
                       .ranks = ranks,
                       .micro = 2,
                       .shard = shard,
                       .fp8_gather = shard && precision == MixedPrecision::fp8,
                       .bf16_weight_gradients = true});
      }
    }
  }
  out.push_back({.architecture = Architecture::llama,
                 .precision = MixedPrecision::fp8,
                 .ranks = 2,
                 .micro = 2,
                 .shard = true,
                 .bf16_weight_gradients = true});
  out.push_back({.precision = MixedPrecision::fp8,
                 .ranks = 2,
                 .micro = 1,
                 .shard = true,
                 .reduce = dist::GradientReduceType::bf16,
                 .bf16_weight_gradients = true});
  // A hybrid layout (2 x 2) and a mixture of experts (every expert's weight gradient kept in BF16).
  out.push_back({.precision = MixedPrecision::fp8,
                 .ranks = 4,
                 .micro = 1,
                 .shard = true,
                 .replicate = 2,
                 .fp8_gather = true,
                 .bf16_weight_gradients = true});
  out.push_back({.architecture = Architecture::moe,
                 .precision = MixedPrecision::fp8,
                 .ranks = 2,
                 .micro = 2,
                 .shard = true,
                 .fp8_gather = true,
                 .bf16_weight_gradients = true});
  // Fully sharded weights: the copies given back after use and gathered again for the backward and each
  // micro-batch's forward. Each recipe, 2 and 4 ranks, a block's forward again in the backward (full
  // checkpointing) or its GEMMs (recompute), Llama, a mixture of experts, BF16 weight gradients and a hybrid
  // layout.
  for (const RecipeKind recipe : {RecipeKind::delayed, RecipeKind::current}) {
    for (const int ranks : {2, 4}) {
      out.push_back({.precision = MixedPrecision::fp8,
                     .recipe = recipe,
                     .ranks = ranks,
                     .micro = ranks == 2 ? 2 : 1,
                     .shard = true,
                     .fp8_gather = true,
                     .reshard = true});
    }
  }
  for (const auto& [checkpointing, recompute] :
       {std::pair{ActivationCheckpointing::full, false}, std::pair{ActivationCheckpointing::none, true}}) {
    out.push_back({.precision = MixedPrecision::fp8,
                   .ranks = 2,
                   .micro = 2,
                   .shard = true,
                   .checkpointing = checkpointing,
                   .recompute = recompute,
                   .fp8_gather = true,
                   .reshard = true});
  }
  for (const Architecture architecture : {Architecture::llama, Architecture::moe}) {
    out.push_back({.architecture = architecture,
                   .precision = MixedPrecision::fp8,
                   .ranks = 2,
                   .micro = 2,
                   .shard = true,
                   .fp8_gather = true,
                   .bf16_weight_gradients = architecture == Architecture::moe,
                   .reshard = true});
  }
  out.push_back({.precision = MixedPrecision::fp8,
                 .ranks = 4,
                 .micro = 1,
                 .shard = true,
                 .replicate = 2,
                 .fp8_gather = true,
                 .reshard = true});
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

TEST(DataParallel, GradientsSummedInBf16AreNotTheFloat32Sum) {
  // The equality above for BF16 sums would hold vacuously if the option changed nothing.
  const RunShape float32{.precision = MixedPrecision::fp32, .ranks = 2, .micro = 2};
  RunShape bf16 = float32;
  bf16.reduce = dist::GradientReduceType::bf16;
  const std::vector<Outcome> a = many_ranks(float32, pattern), b = many_ranks(bf16, pattern);
  EXPECT_EQ(a[0].losses[0], b[0].losses[0]) << "the first forward is the same";
  EXPECT_NE(a[0].losses[1], b[0].losses[1]) << "the first update is not";
  EXPECT_TRUE(std::isfinite(b[0].losses.back()));
}

TEST(DataParallel, LossScalingSkipsTheSameStepsOnEveryRank) {
  // fp16 from a loss scale so large that the gradients overflow: the first step is skipped and the scale
  // backs off, on every rank as on one.
  // Sharded, each rank checks its own shard of the gradients, and the ranks still name the same tensor.
  // A hybrid layout's shard groups search their shards alike.
  for (const auto& [shard, replicate] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{true, 2}}) {
    const RunShape s{.precision = MixedPrecision::fp16,
                     .ranks = 4,
                     .micro = 1,
                     .shard = shard,
                     .replicate = replicate,
                     .initial_loss_scale = 0x1p24f};
    const Outcome reference = one_rank(s, pattern);
    EXPECT_EQ(reference.skipped.front(), 1);
    EXPECT_NE(reference.skip_reasons.front().find("non-finite gradient in "), std::string::npos)
        << reference.skip_reasons.front();
    EXPECT_EQ(reference.skipped.back(), 0) << "the scale came down far enough to train";
    const std::vector<Outcome> ranks = many_ranks(s, pattern);
    for (int r = 0; r < s.ranks; ++r) {
      expect_same(reference, ranks[static_cast<size_t>(r)], name_of(s) + " rank " + std::to_string(r));
    }
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

TEST(DataParallel, AnExpertNoTokenOfARankReachesMovesItsScalingAsOnTheOtherRanks) {
  // Tokens of 2 or 6 ids: the router leaves some experts without a token on some rank in some steps, so
  // that rank casts nothing for them while another rank does. Every rank must still move their scaling
  // state with the step's amax over the ranks, as one rank accumulating the whole batch does (a rank that
  // skipped the update kept other scales from then on: 2 ranks of tokens of 2 ids differed from the second
  // step, 4 ranks of 6 ids in two ranks' scaling states).
  for (const int ids : {2, 6}) {
    for (const int ranks : {2, 4}) {
      const RunShape s{.architecture = Architecture::moe,
                       .precision = MixedPrecision::fp8,
                       .recipe = RecipeKind::delayed,
                       .ranks = ranks,
                       .micro = 2};
      auto few_ids = [ids](int, int, io::DataLoader**) -> BatchSource {
        auto rng = std::make_shared<std::mt19937_64>(9);
        return [rng, ids](int32_t* tokens, int32_t* targets) {
          for (int64_t i = 0; i < B * T; ++i) {
            tokens[i] = static_cast<int32_t>((*rng)() % static_cast<uint64_t>(ids));
            targets[i] = static_cast<int32_t>((*rng)() % static_cast<uint64_t>(ids));
          }
        };
      };
      const Outcome reference = one_rank(s, few_ids);
      const std::vector<Outcome> outcomes = many_ranks(s, few_ids);
      for (int r = 0; r < ranks; ++r) {
        expect_same(reference, outcomes[static_cast<size_t>(r)],
                    std::to_string(ids) + " ids, rank " + std::to_string(r) + " of " + std::to_string(ranks));
      }
    }
  }
}

// The parts of params() that a rank's FP8 weight gathers leave stale and whose host pages it gave back
// (Buffer::release): the whole pages inside the stale ranges, adjacent ranges taken as one, the buffer's
// last page included where a range reaches its end (the parameter buffer begins on a page). Touching them
// is a fault.
std::vector<Backend::Range> given_back(Model& m, const Trainer& trainer) {
  const auto page = static_cast<int64_t>(sysconf(_SC_PAGESIZE)) / int64_t{sizeof(float)};
  std::vector<Backend::Range> ranges = trainer.stale_master_ranges();
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<Backend::Range> merged;
  for (const Backend::Range& range : ranges) {
    if (!merged.empty() && merged.back().offset + merged.back().count == range.offset) {
      merged.back().count += range.count;
    } else {
      merged.push_back(range);
    }
  }
  std::vector<Backend::Range> pages;
  for (const Backend::Range& range : merged) {
    const int64_t end = range.offset + range.count;
    const int64_t first = std::min((range.offset + page - 1) / page * page, end);
    const int64_t last = end == m.parameter_count() ? end : std::max(end / page * page, first);
    if (last > first) pages.push_back({first, last - first});
  }
  return pages;
}

// params() with the parts given back read as NaN.
std::vector<float> readable_params(Model& m, const std::vector<Backend::Range>& gone) {
  std::vector<float> out(static_cast<size_t>(m.parameter_count()), NAN);
  int64_t at = 0;
  for (const Backend::Range& g : gone) {
    std::copy(m.params() + at, m.params() + g.offset, out.begin() + at);
    at = g.offset + g.count;
  }
  std::copy(m.params() + at, m.params() + m.parameter_count(), out.begin() + at);
  return out;
}

TEST(DataParallel, TheStaleMastersOfWeightsGatheredAsCodesAreNeverRead) {
  // With FP8 weight gathers, a rank leaves the float32 masters of the weights gathered as codes stale outside
  // its part of them, and gives back the memory of the host pages that lie wholly inside those ranges
  // (given_back): a touch of them would be a fault. Every rank fills the rest of the ranges with NaN after
  // each step: training must keep the bits of one rank, so nothing reads them, and gather_master_weights
  // (before the outcome is recorded) makes them whole again.
  for (const Architecture architecture : {Architecture::gpt2, Architecture::llama, Architecture::moe}) {
    for (const int ranks : {2, 4}) {
      const RunShape s{.architecture = architecture,
                       .precision = MixedPrecision::fp8,
                       .ranks = ranks,
                       .micro = 1,
                       .shard = true,
                       .fp8_gather = true};
      std::vector<int64_t> poisoned(static_cast<size_t>(ranks), 0);
      std::vector<int64_t> paged(static_cast<size_t>(ranks), 0);
      std::vector<std::string> wrong;
      std::mutex lock;
      const std::vector<Outcome> outcomes = many_ranks(s, pattern, [&](Model& m, Trainer& trainer) {
        const auto r = static_cast<size_t>(trainer.parallel().communicator->rank());
        const std::vector<Backend::Range> gone = given_back(m, trainer);
        int64_t whole = 0;
        for (const Backend::Range& g : gone) whole += g.count;
        for (const Backend::Range& range : trainer.stale_master_ranges()) {
          // The range less the pages given back that meet it (which may begin in a range before it).
          int64_t begin = range.offset;
          const int64_t end = range.offset + range.count;
          for (const Backend::Range& g : gone) {
            if (g.offset + g.count <= begin || g.offset >= end) continue;
            const int64_t stop = std::max(begin, g.offset);
            std::fill(m.params() + begin, m.params() + stop, NAN);
            poisoned[r] += stop - begin;
            begin = g.offset + g.count;
          }
          if (begin < end) {
            std::fill(m.params() + begin, m.params() + end, NAN);
            poisoned[r] += end - begin;
          }
        }
        paged[r] = whole;
        if (trainer.released_master_bytes() != static_cast<size_t>(whole) * sizeof(float)) {
          const std::lock_guard<std::mutex> hold(lock);
          wrong.push_back(fmt::format("rank {}: {} bytes given back, {} expected", r,
                                      trainer.released_master_bytes(), whole * int64_t{sizeof(float)}));
        }
      });
      const Outcome reference = one_rank(s, pattern);
      EXPECT_TRUE(wrong.empty()) << name_of(s) << ": " << (wrong.empty() ? "" : wrong.front());
      for (int r = 0; r < ranks; ++r) {
        EXPECT_GT(poisoned[static_cast<size_t>(r)], 0) << name_of(s) << " rank " << r;
        EXPECT_GT(paged[static_cast<size_t>(r)], 0) << name_of(s) << " rank " << r;
        expect_same(reference, outcomes[static_cast<size_t>(r)], name_of(s) + " rank " + std::to_string(r));
      }
    }
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
  EXPECT_THROW(trainer(DataParallel{.emulated_ranks = 0}), Error);
}

}  // namespace
}  // namespace octet

namespace octet {
namespace {

using namespace dist_testing;

// FP8 weight gathers really send the FP8 weights as codes: a rank's float32 masters of those weights stay
// stale outside its shard until gather_master_weights (the equalities above would hold vacuously if the
// option gathered float32 as before), and the gather moves a quarter of their float32 bytes. The whole
// masters reach rank 0's host from the shards while the memory given back stays given back.
TEST(ShardedDataParallel, Fp8GathersSendCodesAndLeaveTheMastersOutsideTheShardStale) {
  const RunShape s{.precision = MixedPrecision::fp8, .ranks = 2, .micro = 1, .shard = true, .fp8_gather = true};
  struct Seen {
    std::vector<float> before, after, host;
    GatherVolume volume;
    int64_t shard_begin = 0, shard_end = 0;
  };
  std::vector<Seen> seen(2);
  int64_t count = 0;
  dist::run_ranks(2, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s),
                    DataParallel{.communicator = &c, .shard_optimizer_state = true, .fp8_weight_gather = true});
    const BatchSource data = rank_batches(pattern(c.rank(), 2, nullptr), c.rank(), 2, 1, B, T);
    trainer.step(data);
    Seen& mine = seen[static_cast<size_t>(c.rank())];
    // The stale masters whose pages were given back read as NaN here: stale too.
    mine.before = readable_params(*m, given_back(*m, trainer));
    const size_t released = trainer.released_master_bytes();
    EXPECT_GT(released, 0u) << "rank " << c.rank();
    // The masters to the host, gathered from the shards (as a checkpoint takes them), without mapping the
    // pages given back: rank 1 keeps none.
    mine.host = trainer.master_weights(c.rank() == 0);
    EXPECT_EQ(trainer.released_master_bytes(), released) << "rank " << c.rank();
    EXPECT_EQ(mine.host.empty(), c.rank() != 0);
    trainer.gather_master_weights();
    EXPECT_EQ(trainer.released_master_bytes(), 0u) << "rank " << c.rank();
    mine.after.assign(m->params(), m->params() + m->parameter_count());
    mine.volume = trainer.parameter_gather_volume();
    mine.shard_begin = trainer.optimizer().shard().begin;
    mine.shard_end = trainer.optimizer().shard().end;
    if (c.rank() == 0) count = m->parameter_count();
  });
  for (int r = 0; r < 2; ++r) {
    const Seen& x = seen[static_cast<size_t>(r)];
    int64_t stale = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (x.before[static_cast<size_t>(i)] == x.after[static_cast<size_t>(i)]) continue;  // NaN: given back
      ++stale;
      EXPECT_TRUE(i < x.shard_begin || i >= x.shard_end) << "rank " << r << " element " << i << " of its shard";
    }
    EXPECT_GT(stale, 0) << "rank " << r << ": the FP8 weights outside its shard travelled as codes";
    EXPECT_EQ(x.after, seen[0].after) << "rank " << r;
    if (r == 0) {
      EXPECT_EQ(x.host, x.after) << "the masters gathered to the host are the whole masters";
    }
    EXPECT_GT(x.volume.fp8_weights, 0);
    EXPECT_GT(x.volume.fp8_bytes, 0);
    EXPECT_EQ(x.volume.fp8_bytes + x.volume.float32_bytes / 4, count)
        << "every parameter travels once, as a code or a float32 value";
  }
}

}  // namespace
}  // namespace octet
