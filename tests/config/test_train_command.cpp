// The training workflow as a user runs it: octet data prepare, octet config show, octet train (run directory,
// metrics, the FP8 startup line, refusals that write nothing, a clean stop on SIGTERM).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::run_octet;

class TrainCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("octet-train-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "text");
    std::vector<std::string> args = {"data",  "prepare", "--tokenizer",
                                     "bytes", "--out",   (root_ / "shards").string()};
    for (int d = 0; d < 40; ++d) {
      const fs::path file = root_ / "text" / ("doc" + std::to_string(100 + d) + ".txt");
      std::ofstream out(file);
      for (int i = 0; i < 60; ++i)
        out << "The quick brown fox " << (d * 7 + i) % 13 << " jumps over the lazy dog.\n";
      args.push_back(file.string());
    }
    const testing::ProcessResult r = run_octet(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_NE(r.out.find("38 train documents"), std::string::npos) << r.out;
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path write_config(const std::string& mode, int steps) {
    const fs::path config = root_ / "run.toml";
    std::ofstream(config)
        << "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 32\n"
        << "[train]\nmixed_precision = \"" << mode << "\"\nbatch_size = 2\nseq_len = 16\nsteps = " << steps
        << "\n[scheduler]\nwarmup_steps = 1\n[data]\ndir = \"" << (root_ / "shards").string()
        << "\"\neval_every = 2\neval_batches = 2\n[logging]\nrun_dir = \"" << (root_ / "run").string()
        << "\"\nlog_every = 1\n";
    return config;
  }

  static std::string read(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  fs::path root_;
};

TEST_F(TrainCommand, Fp8RunWritesItsRecordsAndSaysWhatRanInFp8) {
  const testing::ProcessResult r = run_octet({"train", write_config("fp8", 4).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find(
          "FP8 training enabled: recipe=delayed (hybrid E4M3/E5M2, history 16, margin 0); 4 of 5 linear "
          "layers in FP8; lm_head: excluded by config\n"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step 4/4 | loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 2: validation loss "), std::string::npos) << r.out;
  const std::string metrics = read(root_ / "run" / "metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 4 + 2) << metrics;  // 4 steps, 2 validations
  EXPECT_NE(metrics.find("\"fp8_gemms\":12"), std::string::npos) << metrics;  // 4 layers x 3 GEMMs per step
  EXPECT_NE(read(root_ / "run" / "precision_map.json").find("\"layer\": \"h.0.mlp.c_fc\""),
            std::string::npos);
  EXPECT_NE(read(root_ / "run" / "config.toml").find("mixed_precision = \"fp8\""), std::string::npos);
}

TEST_F(TrainCommand, OtherModesPrintNoFp8Line) {
  const testing::ProcessResult r = run_octet({"train", write_config("bf16", 2).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("FP8 training enabled"), std::string::npos) << r.out;
  EXPECT_NE(read(root_ / "run" / "metrics.jsonl").find("\"fp8_gemms\":0"), std::string::npos);
}

TEST_F(TrainCommand, BadConfigurationOrDataWritesNothing) {
  const fs::path config = write_config("fp8", 2);
  struct Case {
    std::vector<std::string> set;
    std::string message;
  };
  const Case cases[] = {
      {{"train.mixed_precision=FP8"}, "expected one of \"fp32\", \"bf16\", \"fp16\", \"fp8\""},
      {{"train.batchsize=2"}, "did you mean train.batch_size?"},
      {{"train.seq_len=32"}, "train.seq_len (32) is longer than model.max_seq_len (16)"},
      {{"data.dir=" + (root_ / "nowhere").string()}, "nowhere"},
      {{"train.device=cuda"}, "the CUDA backend does not run the model yet"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train", config.string()};
    for (const std::string& s : c.set) args.insert(args.end(), {"--set", s});
    const testing::ProcessResult r = run_octet(args);
    EXPECT_EQ(r.exit_code, 2) << c.set[0] << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(fs::exists(root_ / "run")) << "no run directory after a refused start (" << c.set[0] << ")";
  }
}

TEST_F(TrainCommand, ConfigShowPrintsTheResolvedConfiguration) {
  const testing::ProcessResult r =
      run_octet({"config", "show", write_config("fp16", 3).string(), "--set", "train.steps=7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[train]\nmixed_precision = \"fp16\"\nbatch_size = 2\nseq_len = 16\ngrad_accum_steps "
                       "= 1\nsteps = 7\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[loss_scale]\ninitial_scale = 65536.0\n"), std::string::npos) << r.out;
}

TEST_F(TrainCommand, SigtermStopsAfterTheCurrentStep) {
  const testing::ProcessResult r =
      testing::run_process({"/usr/bin/timeout", "--preserve-status", "-s", "TERM", "2", OCTET_BINARY, "train",
                            write_config("fp32", 100000).string(), "--set", "data.eval_every=0"},
                           "/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("stopped by signal 15 after step "), std::string::npos) << r.out;
}

}  // namespace
}  // namespace octet
