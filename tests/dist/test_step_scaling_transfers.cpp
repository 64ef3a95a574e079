// The once-a-step FP8 scaling of several ranks (src/train/step_scaling.h), watched at the backend: how often
// a data-parallel step reads the layers' scaling states from the backend and sends them back. On a GPU
// each is a copy of every FP8 layer's record that the host waits for, at the end of the backward.
#include <cmath>
#include <vector>

#include "dist_fixture.h"
#include "forwarding_backend.h"

namespace octet::dist_testing {
namespace {

// The CPU backend, counting the reads and sends of scaling states (each call moves a list of layers).
class ScalingWatch final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string_view name() const override { return "cpu"; }

  void fetch_scaling(std::span<Fp8LinearState* const> states) override {
    ForwardingBackend::fetch_scaling(states);
    ++fetches_;
  }
  void publish_scaling(std::span<const Fp8LinearState* const> states) override {
    ForwardingBackend::publish_scaling(states);
    ++publishes_;
  }
  int64_t fetches() const { return fetches_; }
  int64_t publishes() const { return publishes_; }

 private:
  int64_t fetches_ = 0, publishes_ = 0;
};

struct Transfers {
  std::vector<int64_t> fetches, publishes;  // of each step
  std::vector<float> losses;
};

// GPT-2 in fp8 under delayed scaling on `ranks` ranks (threads), `micro` micro-batches a rank and step.
Transfers watched(int ranks, int64_t micro, int steps) {
  std::vector<Transfers> runs(static_cast<size_t>(ranks));
  const RunShape shape{.precision = MixedPrecision::fp8, .ranks = ranks, .micro = micro};
  dist::run_ranks(ranks, [&](dist::Communicator& c) {
    Transfers& run = runs[static_cast<size_t>(c.rank())];
    auto cpu = make_cpu_backend();
    ScalingWatch watch(*cpu);
    std::unique_ptr<Model> m =
        make_model(tiny_config(), watch,
                   PrecisionPolicy(mode(MixedPrecision::fp8), tiny_config(), B * T * micro * ranks), B, T);
    m->init_weights(5);
    Trainer trainer(*m, settings_of(shape), DataParallel{.communicator = &c});
    const BatchSource data =
        rank_batches(pattern_stream(5, B, T, tiny_config().vocab_size), c.rank(), c.size(), micro, B, T);
    for (int i = 0; i < steps; ++i) {
      const int64_t fetched = watch.fetches(), published = watch.publishes();
      run.losses.push_back(trainer.step(data).loss);
      run.fetches.push_back(watch.fetches() - fetched);
      run.publishes.push_back(watch.publishes() - published);
    }
  });
  for (int r = 1; r < ranks; ++r) {
    EXPECT_TRUE(same_bits(runs[0].losses, runs[static_cast<size_t>(r)].losses)) << "rank " << r;
  }
  return runs[0];
}

TEST(StepScalingTransfers, AStepSendsTheStatesOnceAfterItsLastMicroBatch) {
  constexpr int kSteps = 3;
  for (const int64_t micro : {1, 3}) {
    const Transfers t = watched(2, micro, kSteps);
    for (int i = 0; i < kSteps; ++i) {
      SCOPED_TRACE(::testing::Message() << micro << " micro-batches, step " << i + 1);
      ASSERT_TRUE(std::isfinite(t.losses[static_cast<size_t>(i)]));
      // Read at the step's start and after each micro-batch; sent back after each micro-batch but the last
      // (the next one casts with the step's first scales), and once more, updated, at the step's end.
      EXPECT_EQ(t.fetches[static_cast<size_t>(i)], 1 + micro);
      EXPECT_EQ(t.publishes[static_cast<size_t>(i)], micro);
    }
  }
}

}  // namespace
}  // namespace octet::dist_testing
