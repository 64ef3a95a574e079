// The training workflow as a user runs it: octet data prepare, octet config show, octet train (run directory,
// metrics, the FP8 startup line, refusals that write nothing, a clean stop on SIGTERM).
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "process.h"
#include "train_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::run_octet;

class TrainCommand : public TrainFixture {};

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
      {{"train.attention=flash"}, "expected one of \"auto\", \"cudnn\", \"octet\""},
      {{"train.device=cpu", "train.attention=cudnn"}, "train.attention = \"cudnn\" runs on the GPU only"},
      // Refused on every machine: without a GPU (no CUDA GPU is visible, or built without CUDA) and with
      // one (block scaling is not on the CUDA backend yet).
      {{"train.device=cuda", "train.mixed_precision=fp8", "fp8.recipe=block"}, "CUDA"},
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
  EXPECT_EQ(r.exit_code, 128 + 15) << r.err << "a stopped run tells a scheduler it was stopped";
  EXPECT_NE(r.out.find("stopped by signal 15 after step "), std::string::npos) << r.out;
}

TEST_F(TrainCommand, ResumeAfterSigtermContinuesTheRunExactly) {
  const fs::path config =
      write_config("fp8", 3000);  // long enough (a few seconds) for the stop to land partway
  const std::vector<std::string> quiet = {"--set", "data.eval_every=0", "--set", "logging.log_every=100"};
  // The uninterrupted run, in its own directory.
  std::vector<std::string> whole = {"train", config.string(), "--set",
                                    "logging.run_dir=" + (root_ / "whole").string()};
  whole.insert(whole.end(), quiet.begin(), quiet.end());
  ASSERT_EQ(run_octet(whole).exit_code, 0);
  // The same run stopped by SIGTERM partway (a checkpoint is saved), then resumed.
  std::vector<std::string> first = {
      "/usr/bin/timeout", "--preserve-status", "-s", "TERM", "1", OCTET_BINARY, "train", config.string()};
  first.insert(first.end(), quiet.begin(), quiet.end());
  const testing::ProcessResult stopped = testing::run_process(first, "/dev/null");
  ASSERT_EQ(stopped.exit_code, 128 + 15) << stopped.err;
  ASSERT_NE(stopped.out.find("stopped by signal 15"), std::string::npos)
      << stopped.out << "(the run ended too early)";
  std::vector<std::string> again = {"train", config.string(), "--resume"};
  again.insert(again.end(), quiet.begin(), quiet.end());
  const testing::ProcessResult resumed = run_octet(again);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from "), std::string::npos) << resumed.out;

  const auto expected = step_losses(read(root_ / "whole" / "metrics.jsonl"));
  const auto got = step_losses(read(root_ / "run" / "metrics.jsonl"));
  ASSERT_EQ(expected.size(), 3000u);
  EXPECT_EQ(got, expected)
      << "every step's loss, before and after the resume, equals the uninterrupted run's";
}

// A checkpoint and run directory saved before model.arch existed (no arch in the saved configuration) load as
// GPT-2: the run resumes exactly, and eval reads the checkpoint.
TEST_F(TrainCommand, ACheckpointWithoutModelArchResumesAsGpt2) {
  const fs::path config = write_config("fp32", 6);
  const std::vector<std::string> quiet = {"--set", "data.eval_every=0", "--set", "checkpoint.every=3"};
  std::vector<std::string> whole = {"train", config.string(), "--set",
                                    "logging.run_dir=" + (root_ / "whole").string()};
  whole.insert(whole.end(), quiet.begin(), quiet.end());
  ASSERT_EQ(run_octet(whole).exit_code, 0);
  std::vector<std::string> first = {"train", config.string()};
  first.insert(first.end(), quiet.begin(), quiet.end());
  ASSERT_EQ(run_octet(first).exit_code, 0);

  // Back to the files of a run from before the key: step 3 is the newest checkpoint, and neither its
  // state.json nor the run's config.toml names an architecture.
  const fs::path checkpoints = root_ / "run" / "checkpoints";
  fs::remove_all(checkpoints / "step_000006");
  const auto drop = [](const fs::path& file, const std::string& line) {
    std::string text = read(file);
    const size_t at = text.find(line);
    ASSERT_NE(at, std::string::npos) << file << " should hold " << line;
    text.erase(at, line.size());
    ASSERT_EQ(text.find("arch"), std::string::npos) << text;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
  };
  drop(checkpoints / "step_000003" / "state.json", R"(arch = \"gpt2\"\n)");
  drop(root_ / "run" / "config.toml", "arch = \"gpt2\"\n");

  const testing::ProcessResult eval = run_octet({"eval", (checkpoints / "step_000003").string()});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("(step 3, fp32): validation loss "), std::string::npos) << eval.out;

  std::vector<std::string> again = {"train", config.string(), "--resume"};
  again.insert(again.end(), quiet.begin(), quiet.end());
  const testing::ProcessResult resumed = run_octet(again);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from "), std::string::npos) << resumed.out;
  const auto expected = step_losses(read(root_ / "whole" / "metrics.jsonl"));
  ASSERT_EQ(expected.size(), 6u);
  EXPECT_EQ(step_losses(read(root_ / "run" / "metrics.jsonl")), expected)
      << "every step's loss, before and after the resume, equals the uninterrupted run's";
}

TEST_F(TrainCommand, EvalAndGenerateUseTheCheckpoint) {
  const testing::ProcessResult trained = run_octet({"train", write_config("bf16", 6).string()});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const size_t at = trained.out.find("step 6: validation loss ");
  ASSERT_NE(at, std::string::npos) << trained.out;
  const std::string loss = trained.out.substr(at + 24, 6);
  const testing::ProcessResult eval = run_octet({"eval", (root_ / "run").string()});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("(step 6, bf16): validation loss " + loss), std::string::npos)
      << eval.out << " should repeat the run's last validation loss " << loss;

  const std::vector<std::string> generate = {
      "generate", (root_ / "run").string(), "--prompt", "The quick", "--max-tokens", "12", "--seed", "3"};
  const testing::ProcessResult a = run_octet(generate), b = run_octet(generate);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out.rfind("The quick", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), std::string("The quick\n").size());
  EXPECT_EQ(a.out, b.out) << "the seed reproduces the sample";

  const testing::ProcessResult none = run_octet({"eval", (root_ / "nothing-here").string()});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("neither a checkpoint"), std::string::npos) << none.err;
}

TEST_F(TrainCommand, ResumeWithoutACheckpointIsRefused) {
  const testing::ProcessResult r = run_octet({"train", write_config("fp32", 2).string(), "--resume"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--resume: no complete checkpoint in "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace octet
