// The gradient norm of several ranks without a sharded optimizer state (Trainer::gradient_sum_of_squares):
// every rank holds every summed gradient, and squares its shard of them alone, the ranks' sums added in rank
// order. Watched at the backend: each rank's squares cover its shard, and together every gradient once.
#include <vector>

#include "dist_fixture.h"
#include "forwarding_backend.h"

namespace octet::dist_testing {
namespace {

// The CPU backend, counting the elements it takes sums of squares over.
class SquaresWatch final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string_view name() const override { return "cpu"; }
  double sum_of_squares(const ConstTensorView& x) override {
    squared_ += x.numel();
    return ForwardingBackend::sum_of_squares(x);
  }
  int64_t squared() const { return squared_; }

 private:
  int64_t squared_ = 0;
};

TEST(GradientNorm, EachRankSquaresItsShardOfTheSummedGradients) {
  for (const int ranks : {2, 4}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    std::vector<int64_t> squared(static_cast<size_t>(ranks));
    std::vector<float> norms(static_cast<size_t>(ranks));
    int64_t parameters = 0;
    dist::run_ranks(ranks, [&](dist::Communicator& c) {
      auto cpu = make_cpu_backend();
      SquaresWatch watch(*cpu);
      std::unique_ptr<Model> m =
          make_model(tiny_config(), watch,
                     PrecisionPolicy(mode(MixedPrecision::fp8), tiny_config(), B * T * ranks), B, T);
      m->init_weights(5);
      Trainer trainer(*m, settings_of(RunShape{.precision = MixedPrecision::fp8, .ranks = ranks}),
                      DataParallel{.communicator = &c});
      const BatchSource data =
          rank_batches(pattern_stream(5, B, T, tiny_config().vocab_size), c.rank(), c.size(), 1, B, T);
      const int64_t before = watch.squared();
      const StepResult r = trainer.step(data);
      squared[static_cast<size_t>(c.rank())] = watch.squared() - before;
      norms[static_cast<size_t>(c.rank())] = r.grad_norm;
      if (c.rank() == 0) parameters = m->parameter_count();
    });
    int64_t total = 0;
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(squared[static_cast<size_t>(r)], dist::shard_range(parameters, r, ranks).size())
          << "rank " << r;
      total += squared[static_cast<size_t>(r)];
      EXPECT_EQ(norms[static_cast<size_t>(r)], norms[0]) << "rank " << r;
    }
    EXPECT_EQ(total, parameters);
    EXPECT_TRUE(std::isfinite(norms[0]) && norms[0] > 0.0f);
  }
}

}  // namespace
}  // namespace octet::dist_testing
