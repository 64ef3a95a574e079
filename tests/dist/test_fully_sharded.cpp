// Fully sharded weights (DataParallel::reshard_after_forward, src/train/parameter_gather.h): what each rank
// holds of the weight copies made from gathered FP8 codes, watched at the backend, how often it gathers them
// again, and that the training stays the training of one rank.
#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "dist_fixture.h"
#include "forwarding_backend.h"

namespace octet::dist_testing {
namespace {

// The CPU backend, watching which weight copies hold FP8 codes (made by prepare_weight or from gathered
// codes, and not given back since), the most held at once, and how many were made from gathered codes.
class CopyWatch final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string_view name() const override { return "cpu"; }

  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override {
    ForwardingBackend::prepare_weight(copy, weight, OC, C, exec);
    if (exec.forward == GemmMode::fp8) hold(&copy);
  }
  void weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) override {
    ForwardingBackend::weight_copies_from_codes(parts, codes);
    for (const WeightPart& p : parts) {
      hold(p.copy);
      ++made_;
    }
  }
  void release_weight_copies(std::span<const WeightPart> parts) override {
    ForwardingBackend::release_weight_copies(parts);
    for (const WeightPart& p : parts) {
      EXPECT_EQ(held_.erase(p.copy), 1u) << "a copy given back that held nothing";
    }
  }
  // From now on, the most held at once counts from what is held now.
  void reset_peak() { peak_ = held_.size(); }
  size_t held() const { return held_.size(); }
  size_t peak() const { return peak_; }
  int64_t made() const { return made_; }

 private:
  void hold(std::unique_ptr<WeightCopy>* copy) {
    held_.insert(copy);
    peak_ = std::max(peak_, held_.size());
  }
  std::set<std::unique_ptr<WeightCopy>*> held_;
  size_t peak_ = 0;
  int64_t made_ = 0;
};

// A Llama of 4 blocks, every linear layer in FP8 (the head too): each block's 4 weights and the head's
// gathered as codes.
std::unique_ptr<Model> four_blocks(Backend& backend, int ranks, int64_t micro) {
  ModelConfig c = testing::tiny_llama_config();
  c.layers = 4;
  PrecisionSettings p = mode(MixedPrecision::fp8);
  p.lm_head = true;
  std::unique_ptr<Model> m = make_model(c, backend, PrecisionPolicy(p, c, B * T * micro * ranks), B, T);
  m->init_weights(5);
  return m;
}

struct WatchedRun {
  std::vector<float> losses;
  std::vector<float> params;
  size_t copies = 0;       // the weight copies gathered as codes
  size_t largest_run = 0;  // of them in one run of the forward
  size_t last_run = 0;     // of them in the last run (the head's)
  size_t peak = 0;         // held at once, after the trainer was made
  std::vector<size_t> held_after_step;
  int64_t made = 0;  // from gathered codes
};

WatchedRun watched(bool reshard, int ranks, int64_t micro, int buffers, int steps) {
  std::vector<WatchedRun> runs(static_cast<size_t>(ranks));
  dist::run_ranks(ranks, [&](dist::Communicator& c) {
    WatchedRun& run = runs[static_cast<size_t>(c.rank())];
    auto cpu = make_cpu_backend();
    CopyWatch watch(*cpu);
    std::unique_ptr<Model> m = four_blocks(watch, ranks, micro);
    TrainSettings settings =
        settings_of(RunShape{.precision = MixedPrecision::fp8, .ranks = ranks, .micro = micro});
    Trainer trainer(*m, settings,
                    DataParallel{.communicator = &c,
                                 .shard_optimizer_state = true,
                                 .reduce_scatter = true,
                                 .fp8_weight_gather = true,
                                 .gather_buffers = buffers,
                                 .reshard_after_forward = reshard});
    // The copies per run of the forward.
    const std::vector<int64_t> bounds = m->forward_parameter_bounds();
    std::map<size_t, size_t> per_run;
    for (const Model::WeightCopySlot& s : m->weight_copy_slots()) {
      const auto run_of =
          static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), s.offset) - bounds.begin());
      ++per_run[run_of];
      ++run.copies;
    }
    for (const auto& [r, n] : per_run) run.largest_run = std::max(run.largest_run, n);
    run.last_run = per_run.rbegin()->second;
    watch.reset_peak();
    const BatchSource data =
        rank_batches(pattern_stream(5, B, T, tiny_config().vocab_size), c.rank(), c.size(), micro, B, T);
    for (int i = 0; i < steps; ++i) {
      run.losses.push_back(trainer.step(data).loss);
      run.held_after_step.push_back(watch.held());
    }
    run.peak = watch.peak();
    run.made = watch.made();
    trainer.gather_master_weights();
    run.params.assign(m->params(), m->params() + m->parameter_count());
  });
  for (int r = 1; r < ranks; ++r) {
    EXPECT_TRUE(same_bits(runs[0].params, runs[static_cast<size_t>(r)].params)) << "rank " << r;
  }
  return runs[0];
}

TEST(FullyShardedWeights, EachRankHoldsTheCopiesOfARunOrTwoAndGathersThemAgainForEveryPass) {
  constexpr int kRanks = 2, kWatchedSteps = 3;
  constexpr int64_t kMicro = 2;
  for (const int buffers : {1, 2}) {
    const WatchedRun whole = watched(false, kRanks, kMicro, buffers, kWatchedSteps);
    const WatchedRun sharded = watched(true, kRanks, kMicro, buffers, kWatchedSteps);
    ASSERT_EQ(whole.copies, 4u * 4u + 1u) << "4 blocks of 4 FP8 weights and the head";
    EXPECT_EQ(whole.largest_run, 4u);
    EXPECT_EQ(whole.last_run, 1u);
    // Without resharding every copy is held throughout, and made once a step (the first step's from the
    // whole weights).
    EXPECT_EQ(whole.peak, whole.copies);
    EXPECT_EQ(whole.made, static_cast<int64_t>(whole.copies) * (kWatchedSteps - 1));
    // Resharded: the copies of one run at a time (the last run's kept through the forward for the
    // backward), none between steps, and each pass gathers what it reads: every run for each forward, every
    // run but the last for each backward.
    EXPECT_LE(sharded.peak, sharded.largest_run + sharded.last_run) << buffers << " buffers";
    EXPECT_LT(sharded.peak, sharded.copies);
    for (const size_t held : sharded.held_after_step) EXPECT_EQ(held, 0u);
    EXPECT_EQ(sharded.made,
              kWatchedSteps * kMicro * static_cast<int64_t>(2 * sharded.copies - sharded.last_run));
    // The same training, bit for bit.
    EXPECT_TRUE(same_bits(whole.losses, sharded.losses)) << first_difference(whole.losses, sharded.losses);
    EXPECT_TRUE(same_bits(whole.params, sharded.params)) << first_difference(whole.params, sharded.params);
    for (const float loss : sharded.losses) EXPECT_TRUE(std::isfinite(loss));
  }
}

TEST(FullyShardedWeights, NeedFp8WeightGathers) {
  dist::run_ranks(2, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = four_blocks(*backend, 2, 1);
    try {
      Trainer trainer(*m, settings_of(RunShape{.precision = MixedPrecision::fp8}),
                      DataParallel{.communicator = &c,
                                   .shard_optimizer_state = true,
                                   .fp8_weight_gather = false,
                                   .reshard_after_forward = true});
      ADD_FAILURE() << "a trainer resharding weights gathered in float32";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
      EXPECT_NE(std::string(e.what()).find("distributed.fp8_weight_gather = true"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace octet::dist_testing
