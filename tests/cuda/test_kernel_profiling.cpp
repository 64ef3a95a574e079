// [profiling] on the GPU, end to end: a few steps of a tiny GPT-2 trained by run_training with profiling on
// write a kernel trace whose summary lists FP8 GEMM kernels and octet's cast kernels in fp8 mode, and no
// kernel marked FP8 in bf16 mode. Skips without a GPU (or without FP8 tensor cores for the fp8 half).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/backend/cuda_backend.h"
#include "octet/backend/cuda_registration.h"
#include "octet/backend/registry.h"
#include "octet/config/run_config.h"
#include "octet/io/token_shard.h"
#include "octet/telemetry/kernel_trace.h"
#include "octet/train/training_run.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

class KernelProfiling : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    register_cuda_backend();
    root_ = fs::temp_directory_path() / "octet-kernel-profiling";
    fs::remove_all(root_);
    fs::create_directories(root_ / "data");
    std::mt19937 random(7);
    std::vector<int32_t> tokens(20000);
    for (int32_t& t : tokens) t = static_cast<int32_t>(random() % 256);
    io::write_token_shard(root_ / "data" / "train_000000.bin", tokens, io::TokenWidth::uint16);
    io::write_token_shard(root_ / "data" / "val_000000.bin", tokens, io::TokenWidth::uint16);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  // Trains 4 steps in `mode`, profiling steps 2 to 3, and reads the trace back.
  KernelSummary profiled_run(const std::string& mode) {
    const fs::path run_dir = root_ / ("run-" + mode);
    const std::string text =
        "[model]\nvocab_size = 256\nmax_seq_len = 64\nlayers = 2\nheads = 4\nchannels = 128\n"
        "[train]\ndevice = \"cuda\"\nmixed_precision = \"" +
        mode + "\"\nbatch_size = 4\nseq_len = 64\nsteps = 4\n[data]\ndir = \"" + (root_ / "data").string() +
        "\"\neval_every = 0\neval_batches = 1\n[logging]\nrun_dir = \"" + run_dir.string() +
        "\"\n[profiling]\nenabled = true\nstart_step = 2\nend_step = 3\n";
    const RunConfig config = parse_run_config(text, "profiling-test.toml");
    TrainingRunOptions options;
    options.out = stderr;
    options.handle_signals = false;
    const TrainingRunSummary summary = run_training(config, options);
    EXPECT_FALSE(summary.profiling_fell_back) << "CUPTI could not record here (see the warning above)";
    EXPECT_EQ(summary.kernel_trace_dir, run_dir / "profile");
    const fs::path file = find_kernel_trace(run_dir);
    const KernelTrace trace = read_kernel_trace(file);
    for (const fs::path name : {"trace.json", "summary.json"})
      EXPECT_TRUE(fs::exists(run_dir / "profile" / name));
    const KernelSummary s = summarize_kernels(trace);
    // The host's parts of each step, on the clock of the kernels: no kernel of a step starts before the host
    // began the step (the part "step start"), which enqueues them.
    for (const int64_t step : {2, 3}) {
      uint64_t began = 0, first_kernel = UINT64_MAX;
      for (const DeviceActivity& a : trace.activities) {
        if (a.step != step) continue;
        if (a.kind == DeviceActivity::Kind::host && a.name == "step start") began = a.start_ns;
        if (a.kind == DeviceActivity::Kind::kernel) first_kernel = std::min(first_kernel, a.start_ns);
      }
      EXPECT_GT(began, 0u) << "step " << step << " has no host part \"step start\"";
      EXPECT_LE(began, first_kernel) << "step " << step;
    }
    EXPECT_FALSE(s.host_parts.empty());
    if (!s.host_parts.empty()) EXPECT_EQ(s.host_parts[0].name, "step start");
    EXPECT_EQ(s.first_step, 2);
    EXPECT_EQ(s.last_step, 3);
    EXPECT_EQ(s.dropped_records, 0u);
    EXPECT_GT(s.launches, 20);
    EXPECT_GT(s.total_ns, 0u);
    for (const KernelSummaryRow& r : s.rows) {
      std::fprintf(stderr, "  %-10s %5lld %10.3f us  %s\n",
                   std::string(kernel_class_name(r.kernel_class)).c_str(), static_cast<long long>(r.count),
                   static_cast<double>(r.total_ns) / 1e3, kernel_display_name(r.name, 100).c_str());
    }
    return s;
  }

  fs::path root_;
};

TEST_F(KernelProfiling, Fp8RunListsFp8GemmsAndCasts) {
  if (!cuda_device_info(0).fp8_tensor_cores)
    GTEST_SKIP() << "no FP8 tensor cores on " << cuda_device_info(0).name;
  const KernelSummary s = profiled_run("fp8");
  EXPECT_GT(s.fp8_gemm_launches, 0) << "no kernel of the fp8 run was taken for an FP8 GEMM";
  EXPECT_GT(s.fp8_gemm_ns, 0u);
  EXPECT_GT(s.cast_launches, 0) << "none of octet's cast kernels was recorded";
  // Both profiled steps ran the same kernels: the FP8 GEMM launches split evenly.
  EXPECT_EQ(s.fp8_gemm_launches % 2, 0);
}

TEST_F(KernelProfiling, Bf16RunListsNoFp8Kernel) {
  const KernelSummary s = profiled_run("bf16");
  EXPECT_EQ(s.fp8_gemm_launches, 0);
  for (const KernelSummaryRow& r : s.rows) EXPECT_NE(r.kernel_class, KernelClass::fp8_gemm) << r.name;
  EXPECT_EQ(s.cast_launches, 0);
}

}  // namespace
}  // namespace octet
