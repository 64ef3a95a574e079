// The host's parts of a step in a [profiling] trace (TrainSettings::host_part_began, StepProfiling): a
// data-parallel trainer names each part of its step as it begins, and the profiled steps' trace holds them as
// host records beside the device's, in order, each ending where the next begins. The profiler here is a
// stand-in with a clock of its own (the CPU backend has no kernels to record).
#include <filesystem>
#include <string>
#include <vector>

#include "dist_fixture.h"
#include "kernel_profiling.h"
#include "octet/telemetry/kernel_trace.h"

namespace octet::dist_testing {
namespace {

namespace fs = std::filesystem;

// Records no device work; its clock moves on 1000 ns at each reading.
class StandInProfiler final : public KernelProfiler {
 public:
  void start() override {}
  std::vector<DeviceActivity> collect() override { return {}; }
  void stop() override {}
  uint64_t now_ns() const override { return now_ += 1000; }

 private:
  mutable uint64_t now_ = 1'000'000;
};

class StandInFactory final : public BackendFactory {
 public:
  std::string_view name() const override { return "stand-in"; }
  int device_count() const override { return 1; }
  BackendDevice device(int) const override { return {}; }
  std::string describe_device(int) const override { return "a stand-in device"; }
  bool supports_recipe(RecipeKind) const override { return true; }
  bool attention_on_tensor_cores(int64_t, int64_t) const override { return false; }
  std::string attention_kernels(int64_t, int64_t, int64_t, int64_t, AttentionKernelChoice) const override {
    return "none";
  }
  std::unique_ptr<Backend> make(const BackendOptions&) const override { return make_cpu_backend(); }
  std::unique_ptr<KernelProfiler> make_kernel_profiler() const override {
    return std::make_unique<StandInProfiler>();
  }
};

TEST(HostParts, AProfiledStepsTraceHoldsTheTrainersPartsInOrder) {
  constexpr int kRanks = 2;
  constexpr int64_t kMicro = 2;
  const fs::path dir = fs::temp_directory_path() / "octet-host-parts";
  fs::remove_all(dir);
  RunConfig config;
  config.run_dir = dir;
  config.profiling.enabled = true;
  config.profiling.start_step = 2;
  config.profiling.end_step = 3;
  const StandInFactory factory;
  dist::run_ranks(kRanks, [&](dist::Communicator& c) {
    auto cpu = make_cpu_backend();
    std::unique_ptr<Model> m =
        make_model(tiny_config(), *cpu,
                   PrecisionPolicy(mode(MixedPrecision::fp8), tiny_config(), B * T * kMicro * kRanks), B, T);
    m->init_weights(5);
    // Rank 0 records for the run, as in `octet train`.
    StepProfiling profiling(
        config, factory, "a stand-in device", c.rank() == 0,
        {.say = [](const std::string&) {}, .fallback = [](int64_t, const std::string&) {}});
    TrainSettings settings =
        settings_of(RunShape{.precision = MixedPrecision::fp8, .ranks = kRanks, .micro = kMicro});
    settings.host_part_began = [&profiling](std::string_view part) { profiling.host_part(part); };
    Trainer trainer(*m, settings, DataParallel{.communicator = &c});
    const BatchSource data =
        rank_batches(pattern_stream(5, B, T, tiny_config().vocab_size), c.rank(), c.size(), kMicro, B, T);
    for (int64_t step = 1; step <= 4; ++step) {
      profiling.before_step(step, *cpu);
      trainer.step(data);
      profiling.after_step(step, *cpu);
    }
  });
  const KernelTrace trace = read_kernel_trace(dir / "profile" / "kernels.jsonl");
  const std::vector<std::string> step = {
      "step start", "data",         "forward",  "backward",     "step scaling",  "data",          "forward",
      "backward",   "step scaling", "loss sum", "step scaling", "gradient sums", "gradient norm", "update"};
  ASSERT_EQ(trace.activities.size(), 2 * step.size()) << "steps 2 and 3 only, host parts only";
  uint64_t last_end = 0;
  for (size_t i = 0; i < trace.activities.size(); ++i) {
    const DeviceActivity& a = trace.activities[i];
    SCOPED_TRACE(::testing::Message() << "record " << i << ": " << a.name);
    EXPECT_EQ(a.kind, DeviceActivity::Kind::host);
    EXPECT_EQ(a.step, i < step.size() ? 2 : 3);
    EXPECT_EQ(a.name, step[i % step.size()]);
    // Each part ends where the next begins (one reading of the clock), and has a length.
    if (i % step.size() != 0) EXPECT_EQ(a.start_ns, last_end);
    EXPECT_GT(a.end_ns, a.start_ns);
    last_end = a.end_ns;
  }
  const KernelSummary s = summarize_kernels(trace);
  EXPECT_EQ(s.launches, 0);
  ASSERT_EQ(s.host_parts.size(), 9u);  // the names, each once, in the order they first began
  EXPECT_EQ(s.host_parts[0].name, "step start");
  EXPECT_EQ(s.host_parts[1].count, 4);  // data: 2 micro-batches in each of 2 steps
  EXPECT_EQ(s.host_parts[4].count, 6);  // step scaling: after each micro-batch, and at the end
  fs::remove_all(dir);
}

}  // namespace
}  // namespace octet::dist_testing
