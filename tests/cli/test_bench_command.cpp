// `octet bench` as a user runs it: bad arguments are refused with exit code 2 and one line, `bench gemm`
// without a GPU says so and exits 2 (with one, it reports the memory bandwidth as text and as JSON), and
// `bench train` on a tiny configuration on the CPU backend reports every field with sane numbers, as text and
// as JSON, the precision of every linear layer's GEMMs included.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_output.h"
#include "octet/backend/registry.h"
#include "process.h"
#ifdef OCTET_HAVE_CUDA
#include "octet/backend/cuda_registration.h"
#endif

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

// The CUDA backend as the `octet` binary sees it: registered in a CUDA build, null in a build without CUDA.
const BackendFactory* cuda_backend() {
#ifdef OCTET_HAVE_CUDA
  register_cuda_backend();
#endif
  return find_backend("cuda");
}

// GPUs the `octet` binary can use.
int visible_gpus() {
  const BackendFactory* cuda = cuda_backend();
  return cuda != nullptr ? cuda->device_count() : 0;
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
  EXPECT_TRUE(
      is_usage_error(run_octet({"bench", "gemm", "--shapes", "16,16,16", "--gemm-algorithms", "fastest"}),
                     {"--gemm-algorithms 'fastest' is not valid", "\"heuristic\" or \"timed\""}));
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
  if (visible_gpus() > 0) GTEST_SKIP() << "a CUDA GPU is visible: tests/cuda/test_gpu_bench.cpp runs it";
  const ProcessResult r = run_octet({"bench", "gemm", "--shapes", "64,64,64"});
  EXPECT_TRUE(
      is_usage_error(r, {"octet bench gemm: error:",
                         cuda_backend() != nullptr ? "no CUDA GPU is visible" : "built without CUDA"}));
}

TEST(BenchCommand, GemmHelpDescribesTheBandwidthMeasurement) {
  const ProcessResult r = run_octet({"bench", "gemm", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("memory bandwidth"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device-to-device copy"), std::string::npos) << r.out;
}

// On a GPU: the bandwidth after the table, and as `memory_bandwidth` in the JSON, positive and finite.
TEST(BenchCommand, GemmReportsTheMemoryBandwidth) {
  if (visible_gpus() == 0) GTEST_SKIP() << "no CUDA GPU";
  const ProcessResult text = run_octet({"bench", "gemm", "--shapes", "64,64,64", "--iterations", "1"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  const double copy_gbs = field(text.out, "memory bandwidth");
  EXPECT_TRUE(std::isfinite(copy_gbs) && copy_gbs > 0.0) << text.out;
  EXPECT_NE(text.out.find(" GB/s read "), std::string::npos) << text.out;

  const ProcessResult r = run_octet({"bench", "gemm", "--shapes", "64,64,64", "--iterations", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& bandwidth = j.at("memory_bandwidth");
  ASSERT_FALSE(bandwidth.contains("skipped")) << bandwidth.dump();
  for (const char* key : {"copy_gbs", "read_gbs", "copy_median_ms", "read_median_ms"}) {
    const double v = bandwidth.at(key).get<double>();
    EXPECT_TRUE(std::isfinite(v) && v > 0.0) << key << " = " << v;
  }
  EXPECT_GE(bandwidth.at("bytes").get<double>(), double(1 << 20));
  EXPECT_EQ(bandwidth.at("repeats"), 10);
  EXPECT_EQ(j.at("gemm_algorithms"), "heuristic") << "the default without --config";

  const ProcessResult timed = run_octet(
      {"bench", "gemm", "--shapes", "64,64,64", "--iterations", "1", "--gemm-algorithms", "timed", "--json"});
  ASSERT_EQ(timed.exit_code, 0) << timed.err;
  EXPECT_EQ(nlohmann::json::parse(timed.out).at("gemm_algorithms"), "timed");
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
  EXPECT_EQ(j.at("vocab_size"), 256);
  EXPECT_EQ(j.at("padded_vocab"), 256);
  EXPECT_TRUE(j.at("fp8").is_null());
  // One group per kind of linear layer, both blocks in it, every GEMM in BF16.
  const nlohmann::json& linears = j.at("linear_gemms");
  ASSERT_EQ(linears.size(), 5u) << linears.dump();
  EXPECT_EQ(linears[0].at("linear"), "attn.c_attn");
  EXPECT_EQ(linears[0].at("in_features"), 32);
  EXPECT_EQ(linears[0].at("out_features"), 96);
  EXPECT_EQ(linears[4].at("linear"), "lm_head");
  EXPECT_EQ(linears[4].at("out_features"), 256);
  for (const nlohmann::json& g : linears) {
    EXPECT_EQ(g.at("layers"), g.at("linear") == "lm_head" ? 1 : 2) << g.dump();
    for (const char* gemm : {"forward", "input_gradient", "weight_gradient"}) EXPECT_EQ(g.at(gemm), "bf16");
  }
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

TEST_F(BenchTrain, JsonSaysWhichGemmsRunInFp8) {
  const ProcessResult r =
      run_octet({"bench", "train", config_.string(), "--steps", "1", "--warmup", "0", "--phase-steps", "0",
                 "--json", "--set", "fp8.exclude=[\"h.1.mlp.c_proj\"]", "--set", "fp8.recompute_qkv=true",
                 "--set", "fp8.recompute_weight_transposes=true"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("mode"), "fp8");
  const nlohmann::json& fp8 = j.at("fp8");
  EXPECT_EQ(fp8.at("recipe"), "delayed");
  EXPECT_EQ(fp8.at("formats"), "hybrid");
  EXPECT_EQ(fp8.at("fast_accumulation_forward"), true);
  EXPECT_EQ(fp8.at("fast_accumulation_backward"), false);
  EXPECT_EQ(fp8.at("recompute"), nlohmann::json::array({"qkv", "weight_transposes"}));
  // Every block linear in FP8 but the excluded one, which gets a group of its own; the LM head in BF16.
  struct Group {
    const char* linear;
    int64_t layers;
    const char* mode;
  };
  const Group expected[] = {{"attn.c_attn", 2, "fp8"}, {"attn.c_proj", 2, "fp8"}, {"mlp.c_fc", 2, "fp8"},
                            {"mlp.c_proj", 1, "fp8"},  {"mlp.c_proj", 1, "bf16"}, {"lm_head", 1, "bf16"}};
  const nlohmann::json& groups = j.at("linear_gemms");
  ASSERT_EQ(groups.size(), std::size(expected)) << groups.dump();
  int64_t fp8_gemms = 0, other_gemms = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const nlohmann::json& g = groups[i];
    SCOPED_TRACE(g.dump());
    EXPECT_EQ(g.at("linear"), expected[i].linear);
    EXPECT_EQ(g.at("layers"), expected[i].layers);
    for (const char* gemm : {"forward", "input_gradient", "weight_gradient"}) {
      EXPECT_EQ(g.at(gemm), expected[i].mode);
      (g.at(gemm) == "fp8" ? fp8_gemms : other_gemms) += g.at("layers").get<int64_t>();
    }
  }
  EXPECT_EQ(fp8_gemms, j.at("fp8_gemms_per_step"));
  EXPECT_EQ(other_gemms, j.at("other_gemms_per_step"));
}

// Every mode but fp32 asks for attention on BF16 tensor cores; the device line says whether it got them.
TEST_F(BenchTrain, SaysWhereAttentionRunsOnTheGpu) {
  if (visible_gpus() == 0) GTEST_SKIP() << "no CUDA GPU";
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "bench",         "train", config_.string(), "--steps",          "1", "--warmup", "0",
        "--phase-steps", "0",     "--set",          "train.device=cuda"};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult r = run_octet(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out + r.err;
  };
  const std::string tensor_cores = run({});  // head size 16
  EXPECT_NE(tensor_cores.find("attention on BF16 tensor cores"), std::string::npos) << tensor_cores;
  const std::string float32 = run({"--set", "model.heads=4"});  // head size 8
  EXPECT_NE(float32.find("WARNING: attention in float32"), std::string::npos) << float32;
  EXPECT_NE(float32.find("head size 8"), std::string::npos) << float32;
  const std::string fp32 = run({"--set", "train.mixed_precision=fp32"});
  EXPECT_EQ(fp32.find("attention"), std::string::npos) << fp32;
}

TEST_F(BenchTrain, ConfigDataNeedsADataDirectory) {
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "train", config_.string(), "--data"}), {"data.dir"}));
  EXPECT_TRUE(is_usage_error(run_octet({"bench", "train", config_.string(), "--steps", "0"}), {"--steps"}));
}

}  // namespace
}  // namespace octet
