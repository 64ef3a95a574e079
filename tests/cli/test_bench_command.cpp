// `octet bench` as a user runs it: bad arguments are refused with exit code 2 and one line, `bench gemm`
// without a GPU says so and exits 2, and `bench train` on a tiny configuration on the CPU backend reports
// every field with sane numbers, as text and as JSON.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_output.h"
#include "octet/backend/cuda_backend.h"
#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_octet;

::testing::AssertionResult is_usage_error(const ProcessResult& r, const std::vector<std::string>& mentions) {
  if (r.exit_code != 2)
    return ::testing::AssertionFailure() << "exit code " << r.exit_code << ", stderr: " << r.err;
  if (!r.out.empty()) return ::testing::AssertionFailure() << "standard output not empty: " << r.out;
  const std::vector<std::string_view> lines = testing::split_lines(r.err);
  if (lines.size() != 1 || lines[0].empty())
    return ::testing::AssertionFailure() << "standard error is not one line: '" << r.err << "'";
  for (const std::string& m : mentions) {
    if (r.err.find(m) == std::string::npos)
      return ::testing::AssertionFailure() << "the error line does not mention '" << m << "': " << r.err;
  }
  return ::testing::AssertionSuccess();
}

// A two-layer model small enough for a few steps on the CPU backend in milliseconds.
class BenchTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = fs::temp_directory_path() /
              ("octet-bench-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
               ".toml");
    std::ofstream(config_) << "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 2\nheads = 2\n"
                              "channels = 32\n[train]\nmixed_precision = \"fp8\"\ndevice = \"cpu\"\n"
                              "batch_size = 2\nseq_len = 16\nsteps = 10\n";
  }
  void TearDown() override { fs::remove(config_); }
  fs::path config_;
};

// The number after "NAME: " at the start of a line of `text`; NaN when there is no such line.
double field(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + ": ";
  const size_t at = ("\n" + text).find(key);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(text.c_str() + at + key.size() - 1, nullptr);
}

TEST(BenchCommand, BadShapesAreRefused) {
  for (const char* shape : {"1,2", "1,2,3,4", "0,16,16", "-1,16,16", "16,16,16x", "a,b,c", "16,,16", ""}) {
    SCOPED_TRACE(shape);
    EXPECT_TRUE(is_usage_error(run_octet({"bench", "gemm", "--shapes", shape}),
                               {"octet bench gemm: error:", "--shapes", "M,N,K"}));
  }
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "gemm", "--shapes", "16,16,16", "--iterations", "0"}),
                             {"--iterations"}));
  EXPECT_TRUE(
      is_usage_error(run_octet({"bench", "gemm", "--set", "train.batch_size=4"}), {"--set", "--config"}));
}

TEST(BenchCommand, MissingOrBadConfigIsRefused) {
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "train"}), {"octet bench train: error:", "CONFIG"}));
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "train", "/nonexistent/octet-bench.toml"}),
                             {"/nonexistent/octet-bench.toml"}));
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "gemm", "--config", "/nonexistent/octet-bench.toml"}),
                             {"/nonexistent/octet-bench.toml"}));
}

TEST(BenchCommand, BenchWithoutASubcommandIsAUsageError) {
  const ProcessResult r = run_octet({"bench"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("gemm"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train"), std::string::npos) << r.err;
}

TEST(BenchCommand, GemmWithoutAGpuSaysSo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA GPU is visible: tests/cuda/test_gpu_bench.cpp runs it";
  const ProcessResult r = run_octet({"bench", "gemm", "--shapes", "64,64,64"});
  EXPECT_TRUE(is_usage_error(r, {"octet bench gemm: error:",
                                 cuda_backend_built() ? "no CUDA GPU is visible" : "built without CUDA"}));
}

TEST_F(BenchTrain, ReportsEveryFieldWithSaneNumbers) {
  const ProcessResult r =
      run_octet({"bench", "train", config_.string(), "--steps", "3", "--warmup", "1", "--phase-steps", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("training on the CPU backend"), std::string::npos) << r.out;
  EXPECT_GT(field(r.out, "tokens/s"), 0.0) << r.out;
  EXPECT_GT(field(r.out, "ms/step"), 0.0) << r.out;
  EXPECT_GT(field(r.out, "model FLOPs/token"), 0.0) << r.out;
  EXPECT_GT(field(r.out, "loss"), 0.0) << r.out;
  EXPECT_NE(r.out.find("\ntokens per step: 32 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nsteps: 3 timed after 1 warm-up"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nMFU: not computed: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\ndevice memory: not measured: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nGEMMs per step: 24 FP8, 3 other"), std::string::npos) << r.out;
  for (const char* phase : {"data", "forward", "backward", "optimizer", "total"}) {
    EXPECT_NE(r.out.find(std::string("\n  ") + phase + " "), std::string::npos) << phase << "\n" << r.out;
  }
}

TEST_F(BenchTrain, JsonParsesAndHoldsTheMeasurements) {
  const ProcessResult r = run_octet({"bench", "train", config_.string(), "--steps", "2", "--warmup", "0",
                                     "--phase-steps", "1", "--json", "--set", "train.mixed_precision=bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // standard output is the JSON object alone
  EXPECT_EQ(j.at("benchmark"), "train");
  EXPECT_EQ(j.at("mode"), "bf16");
  EXPECT_EQ(j.at("device").at("backend"), "cpu");
  EXPECT_EQ(j.at("data"), "random");
  EXPECT_EQ(j.at("steps"), 2);
  EXPECT_EQ(j.at("tokens_per_step"), 32);
  EXPECT_EQ(j.at("skipped_steps"), 0);
  EXPECT_GT(j.at("tokens_per_second").get<double>(), 0.0);
  EXPECT_GT(j.at("ms_per_step").get<double>(), 0.0);
  // 6 N + 12 L C T with N every parameter but the 16 x 32 position embedding.
  const double N = j.at("flop_parameters").get<double>();
  EXPECT_EQ(N, j.at("parameters").get<double>() - 16 * 32);
  EXPECT_DOUBLE_EQ(j.at("flops_per_token").get<double>(), 6 * N + 12.0 * 2 * 32 * 16);
  EXPECT_TRUE(j.at("mfu_bf16").is_null());
  EXPECT_TRUE(j.at("device_memory_bytes").is_null());
  EXPECT_EQ(j.at("fp8_gemms_per_step"), 0);
  const nlohmann::json& phases = j.at("phases");
  EXPECT_EQ(phases.at("steps"), 1);
  EXPECT_GT(phases.at("forward_ms").get<double>(), 0.0);
  EXPECT_GT(phases.at("backward_ms").get<double>(), 0.0);
  EXPECT_GT(phases.at("optimizer_ms").get<double>(), 0.0);
  EXPECT_GE(phases.at("data_ms").get<double>(), 0.0);
  const double sum = phases.at("data_ms").get<double>() + phases.at("forward_ms").get<double>() +
                     phases.at("backward_ms").get<double>() + phases.at("optimizer_ms").get<double>();
  EXPECT_NEAR(phases.at("total_ms").get<double>(), sum, 1e-9 * sum);
}

TEST_F(BenchTrain, ConfigDataNeedsADataDirectory) {
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "train", config_.string(), "--data"}), {"data.dir"}));
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "train", config_.string(), "--steps", "0"}), {"--steps"}));
}

}  // namespace
}  // namespace octet
