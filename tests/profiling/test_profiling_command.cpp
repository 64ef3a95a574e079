// [profiling] as a user meets it without a GPU: `octet inspect DIR --kernels` prints a trace's summary as a
// table (text and JSON) and refuses a directory without a trace or with a damaged one (exit code 2); the
// [profiling] keys are validated; a CPU run with profiling on is refused before anything is written.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "octet/config/run_config.h"
#include "octet/telemetry/kernel_trace.h"
#include "parse_errors.h"
#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::error_of;
using testing::ProcessResult;
using testing::run_octet;

DeviceActivity kernel(int64_t step, std::string name, uint64_t start, uint64_t ns) {
  DeviceActivity a;
  a.name = std::move(name);
  a.step = step;
  a.start_ns = start;
  a.end_ns = start + ns;
  a.grid = {132, 1, 1};
  a.block = {128, 1, 1};
  a.stream = 7;
  return a;
}

class InspectKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("octet-inspect-kernels-" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // An fp8 run's two profiled steps: 3 FP8 GEMMs of 2 us, a BF16 GEMM of 2 us, two casts of 1 us and a copy
  // that took no time; total 10 us: FP8 GEMMs 60%, casts 20%.
  KernelTrace fp8_trace() const {
    KernelTrace t;
    t.device = "NVIDIA H100 80GB HBM3 (CUDA device 0, compute capability 9.0)";
    const std::string cast =
        "void octet::cuda::(anonymous namespace)::cast_amax_kernel<false>(octet::cuda::(anonymous "
        "namespace)::KernelParameters)";
    t.activities = {kernel(3, "nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT", 1000, 2000),
                    kernel(3, cast, 4000, 1000),
                    kernel(3, "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT", 5000, 2000),
                    kernel(4, "nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT", 9000, 2000),
                    kernel(4, "nvjet_sm90_qrtst_64x128_128x4_1x2_h_bz_ovscale_NTT", 11000, 2000),
                    kernel(4, cast, 13000, 1000)};
    DeviceActivity copy = kernel(4, "memcpy DtoH", 14000, 0);
    copy.kind = DeviceActivity::Kind::memcpy;
    copy.bytes = 4;
    copy.end_ns = 14000;
    t.activities.push_back(copy);
    return t;
  }

  fs::path root_;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1)
    out.push_back(text.substr(begin, end - begin));
  return out;
}

TEST_F(InspectKernels, PrintsTheSummaryAsATable) {
  write_kernel_trace(root_ / "run" / "profile", fp8_trace());
  const ProcessResult r = run_octet({"inspect", (root_ / "run").string(), "--kernels"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 10u) << r.out;
  EXPECT_EQ(lines[0], "Kernel trace " + (root_ / "run" / "profile" / "kernels.jsonl").string());
  EXPECT_EQ(lines[1],
            "  steps 3 to 4 on NVIDIA H100 80GB HBM3 (CUDA device 0, compute capability 9.0): 7 launches, "
            "0.010 ms of GPU time");
  // kernel (64 wide), count (7), total ms (10), mean us (10), share (7), marker; most time first, ties by
  // name (the copy of no time last).
  EXPECT_EQ(lines[2], "  kernel" + std::string(58, ' ') + "   count   total ms    mean us   share");
  EXPECT_EQ(lines[3], "  nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT" + std::string(13, ' ') +
                          "       2      0.004       2.00     40%  FP8 GEMM");
  EXPECT_EQ(lines[4], "  nvjet_sm90_qrtst_64x128_128x4_1x2_h_bz_ovscale_NTT" + std::string(14, ' ') +
                          "       1      0.002       2.00     20%  FP8 GEMM");
  EXPECT_EQ(lines[5], "  nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT" + std::string(18, ' ') +
                          "       1      0.002       2.00     20%");
  EXPECT_EQ(lines[6], "  cast_amax_kernel<false>" + std::string(41, ' ') +
                          "       2      0.002       1.00     20%  cast");
  EXPECT_EQ(lines[7], "  memcpy DtoH" + std::string(53, ' ') + "       1      0.000       0.00      0%");
  EXPECT_EQ(lines[8], "FP8 GEMM kernels: 3 launches, 60% of GPU time");
  EXPECT_EQ(lines[9], "octet's FP8 casts: 2 launches, 20% of GPU time");
}

TEST_F(InspectKernels, JsonAndTheTraceDirectoryItself) {
  write_kernel_trace(root_ / "trace", fp8_trace());
  const ProcessResult r = run_octet({"inspect", (root_ / "trace").string(), "--kernels", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["trace"], (root_ / "trace" / "kernels.jsonl").string());
  EXPECT_EQ(doc["launches"], 7);
  EXPECT_EQ(doc["fp8_gemm"]["launches"], 3);
  EXPECT_EQ(doc["casts"]["launches"], 2);
  EXPECT_EQ(doc["first_step"], 3);
  EXPECT_EQ(doc["last_step"], 4);
  ASSERT_EQ(doc["kernels"].size(), 5u);
  EXPECT_EQ(doc["kernels"][0]["class"], "fp8_gemm");
  EXPECT_EQ(doc["kernels"][0]["count"], 2);
  EXPECT_EQ(doc["kernels"][3]["class"], "cast");
  EXPECT_EQ(doc["kernels"][3]["mean_us"].get<double>(), 1.0);
  EXPECT_EQ(doc["fp8_gemm"]["share"].get<double>(), 0.6);
}

TEST_F(InspectKernels, PrintsTheHostsPartsAfterTheKernels) {
  KernelTrace t = fp8_trace();
  const auto part = [](int64_t step, const char* name, uint64_t start, uint64_t ns) {
    DeviceActivity a = kernel(step, name, start, ns);
    a.kind = DeviceActivity::Kind::host;
    return a;
  };
  // Steps 3 and 4: the forward 1.5 and 2.5 ms, the gradient norm 0.25 ms each.
  t.activities.push_back(part(3, "forward", 0, 1500000));
  t.activities.push_back(part(3, "gradient norm", 1500000, 250000));
  t.activities.push_back(part(4, "forward", 2000000, 2500000));
  t.activities.push_back(part(4, "gradient norm", 4500000, 250000));
  write_kernel_trace(root_ / "run" / "profile", t);
  const ProcessResult r = run_octet({"inspect", (root_ / "run").string(), "--kernels"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 14u) << r.out;
  // The device's table as without them (PrintsTheSummaryAsATable), then the host's.
  EXPECT_EQ(lines[1],
            "  steps 3 to 4 on NVIDIA H100 80GB HBM3 (CUDA device 0, compute capability 9.0): 7 launches, "
            "0.010 ms of GPU time");
  EXPECT_EQ(lines[9], "octet's FP8 casts: 2 launches, 20% of GPU time");
  EXPECT_EQ(lines[10], "host, the trainer's parts of the steps:");
  EXPECT_EQ(lines[11], "  part" + std::string(60, ' ') + "   count   total ms    mean ms");
  EXPECT_EQ(lines[12], "  forward" + std::string(57, ' ') + "       2      4.000      2.000");
  EXPECT_EQ(lines[13], "  gradient norm" + std::string(51, ' ') + "       2      0.500      0.250");
}

TEST_F(InspectKernels, SaysWhenNoFp8GemmRan) {
  KernelTrace t = fp8_trace();
  t.activities = {kernel(2, "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT", 100, 1000)};
  write_kernel_trace(root_ / "run" / "profile", t);
  const ProcessResult r = run_octet({"inspect", (root_ / "run").string(), "--kernels"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("FP8 GEMM kernels: none ran in the profiled steps (1 launches recorded)\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("FP8 GEMM\n"), std::string::npos) << r.out;
}

TEST_F(InspectKernels, RefusesADirectoryWithoutATraceOrWithADamagedOne) {
  fs::create_directories(root_ / "run");
  ProcessResult r = run_octet({"inspect", (root_ / "run").string(), "--kernels"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("holds no kernel trace"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("profiling.enabled=true"), std::string::npos) << r.err;

  r = run_octet({"inspect", (root_ / "missing").string(), "--kernels"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not a directory"), std::string::npos) << r.err;

  write_kernel_trace(root_ / "run" / "profile", fp8_trace());
  const fs::path file = root_ / "run" / "profile" / "kernels.jsonl";
  const std::string whole = testing::read_file(file.string());
  std::ofstream(file, std::ios::trunc) << whole.substr(0, whole.size() / 2);
  r = run_octet({"inspect", (root_ / "run").string(), "--kernels"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find(file.string() + ":"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  r = run_octet({"inspect", (root_ / "run").string(), "--kernels", "--layer", "h.0.mlp.c_fc"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
}

TEST(ProfilingConfig, KeysAreValidated) {
  EXPECT_EQ(error_of("[train]\nsteps = 10\n[profiling]\nenabled = true\nstart_step = 5\nend_step = 10\n"),
            "");
  EXPECT_NE(error_of("[train]\nsteps = 10\n[profiling]\nstart_step = 5\nend_step = 4\n")
                .find("profiling.start_step (5) is after profiling.end_step (4)"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = 10\n[profiling]\nenabled = true\nend_step = 11\n")
                .find("profiling.end_step (11) is beyond train.steps (10)"),
            std::string::npos);
  // Off, the range need not fit the run: one file serves runs of any length.
  EXPECT_EQ(error_of("[train]\nsteps = 1\n[profiling]\nend_step = 11\n"), "");
  EXPECT_NE(error_of("[profiling]\nstart_step = 0\n").find("profiling.start_step must be at least 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of("[profiling]\nenabled = \"yes\"\n").find("profiling.enabled must be"),
            std::string::npos);
  EXPECT_NE(error_of("[profiling]\nstart = 3\n").find("did you mean profiling.start_step?"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nsteps = 5\n", {"profiling.enabled=true", "profiling.trace_dir=\"\""})
                .find("profiling.trace_dir is empty"),
            std::string::npos);

  RunConfig c = parse_run_config("[logging]\nrun_dir = \"runs/a\"\n", "run.toml");
  EXPECT_FALSE(c.profiling.enabled);
  EXPECT_EQ(c.profiling.start_step, 2);
  EXPECT_EQ(c.profiling.end_step, 2);
  EXPECT_EQ(profiling_trace_dir(c), fs::path("runs/a/profile"));
  c = parse_run_config("[logging]\nrun_dir = \"runs/a\"\n[profiling]\ntrace_dir = \"/tmp/traces/x\"\n",
                       "run.toml");
  EXPECT_EQ(profiling_trace_dir(c), fs::path("/tmp/traces/x"));
  c = parse_run_config("[logging]\nrun_dir = \"runs/a\"\n[profiling]\ntrace_dir = \"kernels/b\"\n",
                       "run.toml");
  EXPECT_EQ(profiling_trace_dir(c), fs::path("runs/a/kernels/b"));
  // The resolved configuration keeps the section.
  EXPECT_NE(to_toml(c).find(
                "[profiling]\nenabled = false\nstart_step = 2\nend_step = 2\ntrace_dir = \"kernels/b\"\n"),
            std::string::npos)
      << to_toml(c);
}

// The CPU backend has no kernels: a run that asks for a kernel trace there is refused before it writes.
TEST_F(InspectKernels, CpuTrainingWithProfilingIsRefused) {
  fs::create_directories(root_ / "text");
  std::vector<std::string> args = {"data", "prepare", "--out", (root_ / "shards").string()};
  for (int d = 0; d < 40; ++d) {
    const fs::path file = root_ / "text" / ("doc" + std::to_string(100 + d) + ".txt");
    std::ofstream out(file);
    for (int i = 0; i < 40; ++i)
      out << "The quick brown fox " << (d * 7 + i) % 13 << " jumps over the lazy dog.\n";
    args.push_back(file.string());
  }
  ProcessResult r = run_octet(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path config = root_ / "run.toml";
  std::ofstream(config)
      << "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 32\n"
      << "[train]\nbatch_size = 2\nseq_len = 16\nsteps = 4\ndevice = \"cpu\"\n[data]\ndir = \""
      << (root_ / "shards").string() << "\"\n[logging]\nrun_dir = \"" << (root_ / "run").string()
      << "\"\n[profiling]\nenabled = true\nstart_step = 2\nend_step = 3\n";
  r = run_octet({"train", config.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("profiling.enabled = true records the GPU's kernels through CUPTI"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("cpu backend"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root_ / "run"));
}

}  // namespace
}  // namespace octet
