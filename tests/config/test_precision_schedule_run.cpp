// Precision schedules as `octet train` runs them: a switch of mode within a run equals the manual way (a run
// checkpointed in one mode and resumed from that checkpoint in the next) bit for bit on the CPU, a resume in
// the middle of a schedule continues in the right phase exactly, and each switch is said, recorded in
// metrics.jsonl and the precision map.
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "process.h"
#include "train_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::run_octet;

class PrecisionScheduleRun : public TrainFixture {
 protected:
  // `octet train CONFIG` into RUN_DIR = root_/name, with `extra` arguments; must succeed.
  testing::ProcessResult train(const fs::path& config, const std::string& name,
                               std::vector<std::string> extra) {
    std::vector<std::string> args = {"train", config.string(), "--set",
                                     "logging.run_dir=" + (root_ / name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    testing::ProcessResult r = run_octet(args);
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.err;
    return r;
  }
  // The loss of every step of a run, by step (rows with a loss; validation and event rows have none).
  std::map<int, std::string> losses(const std::string& name) {
    std::map<int, std::string> out;
    std::istringstream lines(read(root_ / name / "metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      const size_t loss = line.find("\"loss\":"), step = line.find("\"step\":");
      if (loss == std::string::npos || step == std::string::npos) continue;
      out[std::stoi(line.substr(step + 7))] = line.substr(loss + 7, line.find(',', loss) - loss - 7);
    }
    return out;
  }
  std::string optimizer_file(const std::string& name, int step, const std::string& file = "optimizer.safetensors") {
    char dir[32];
    std::snprintf(dir, sizeof dir, "step_%06d", step);
    const fs::path path = root_ / name / "checkpoints" / dir / file;
    EXPECT_TRUE(fs::exists(path)) << path;
    return read(path);
  }
};

// bf16 for 3 steps, then fp8: the scheduled run, and the manual way (a bf16 run that saves at step 3, and an
// fp8 run resumed from that checkpoint), give the same losses and the same final weights and moments.
TEST_F(PrecisionScheduleRun, ASwitchEqualsACheckpointResumedInTheNextMode) {
  const testing::ProcessResult scheduled =
      train(write_config("bf16", 8), "scheduled",
            {"--set", "train.precision_phases=[{ mode = \"bf16\", steps = 3 }, { mode = \"fp8\" }]"});
  EXPECT_NE(scheduled.out.find("precision schedule: bf16 for steps 1-3, fp8 for steps 4-8\n"),
            std::string::npos)
      << scheduled.out;
  EXPECT_NE(scheduled.out.find("step 4: precision bf16 -> fp8 (precision schedule)\nFP8 training enabled: "),
            std::string::npos)
      << scheduled.out;
  train(write_config("bf16", 8), "bf16", {"--set", "checkpoint.every=3"});
  const fs::path checkpoint = root_ / "bf16" / "checkpoints" / "step_000003";
  train(write_config("fp8", 8), "fp8", {"--resume-from", checkpoint.string()});

  const std::map<int, std::string> got = losses("scheduled"), bf16 = losses("bf16"), fp8 = losses("fp8");
  ASSERT_EQ(got.size(), 8u);
  for (int step = 1; step <= 8; ++step) {
    EXPECT_EQ(got.at(step), step <= 3 ? bf16.at(step) : fp8.at(step)) << "step " << step;
  }
  EXPECT_NE(got.at(4), bf16.at(4)) << "the steps after the switch train in fp8, not bf16";
  EXPECT_TRUE(optimizer_file("scheduled", 8) == optimizer_file("fp8", 8))
      << "the final master weights and AdamW moments agree bit for bit";

  const std::string metrics = read(root_ / "scheduled" / "metrics.jsonl");
  EXPECT_NE(metrics.find("{\"event\":\"precision_switch\",\"from\":\"bf16\",\"step\":3,\"to\":\"fp8\"}\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("\"mode\":\"bf16\""), std::string::npos);
  EXPECT_NE(metrics.find("\"mode\":\"fp8\""), std::string::npos);
  EXPECT_NE(read(root_ / "scheduled" / "precision_map.json").find("\"forward\": \"fp8\""), std::string::npos)
      << "the precision map is the fp8 phase's";
  // The telemetry records the switch as it records a resume in another mode.
  const testing::ProcessResult inspect = run_octet({"inspect", (root_ / "scheduled").string()});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("from step 4: mode fp8 (bf16 before): 4 of 5 layers with a GEMM in FP8"),
            std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("step 3 mode_change: mode fp8 from step 4 (bf16 before): precision schedule"),
            std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("recipe delayed"), std::string::npos)
      << "the fp8 phase's recipe: " << inspect.out;
}

// bf16, fp8, bf16: an uninterrupted run that saves after every step, and runs branched from its checkpoints
// at a switch and in the middle of the fp8 phase (whose FP8 scaling state must carry over), agree exactly.
TEST_F(PrecisionScheduleRun, AResumeContinuesInItsPhaseExactly) {
  const fs::path config = write_config("fp8", 9);
  const std::vector<std::string> schedule = {
      "--set",
      "train.precision_phases=[{ mode = \"bf16\", steps = 3 }, { mode = \"fp8\", steps = 3 }, "
      "{ mode = \"bf16\" }]"};
  std::vector<std::string> whole = schedule;
  whole.insert(whole.end(), {"--set", "checkpoint.every=1", "--set", "checkpoint.keep_last=20"});
  const testing::ProcessResult first = train(config, "whole", whole);
  EXPECT_NE(first.out.find("step 7: precision fp8 -> bf16 (precision schedule)"), std::string::npos)
      << first.out;
  const std::map<int, std::string> expected = losses("whole");
  ASSERT_EQ(expected.size(), 9u);
  for (const int from : {3, 5, 6}) {
    const std::string name = "from" + std::to_string(from);
    std::vector<std::string> branch = schedule;
    char dir[32];
    std::snprintf(dir, sizeof dir, "step_%06d", from);
    branch.insert(branch.end(), {"--resume-from", (root_ / "whole" / "checkpoints" / dir).string()});
    const testing::ProcessResult r = train(config, name, branch);
    const std::map<int, std::string> got = losses(name);
    for (int step = from + 1; step <= 9; ++step)
      EXPECT_EQ(got.at(step), expected.at(step)) << "resumed at " << from << ", step " << step;
    EXPECT_TRUE(optimizer_file(name, 9) == optimizer_file("whole", 9)) << "resumed at " << from;
    EXPECT_EQ(r.out.find("step " + std::to_string(from + 1) + ": precision"), std::string::npos)
        << "the run starts in its step's mode, switching nothing: " << r.out;
  }
}

// The same on two ranks whose optimizer state is sharded (ZeRO-1): every rank switches at the same step,
// the moments gathered from both shards and each rank's shard put back.
TEST_F(PrecisionScheduleRun, TwoRanksSwitchAsACheckpointResumedInTheNextMode) {
  const std::vector<std::string> ranks = {"--ranks", "2"};
  std::vector<std::string> scheduled = ranks;
  scheduled.insert(scheduled.end(),
                   {"--set", "train.precision_phases=[{ mode = \"bf16\", steps = 3 }, { mode = \"fp8\" }]"});
  const testing::ProcessResult r = train(write_config("bf16", 6), "scheduled", scheduled);
  EXPECT_NE(r.out.find("optimizer state sharded over 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 4: precision bf16 -> fp8 (precision schedule)"), std::string::npos) << r.out;
  std::vector<std::string> bf16 = ranks;
  bf16.insert(bf16.end(), {"--set", "checkpoint.every=3"});
  train(write_config("bf16", 6), "bf16", bf16);
  std::vector<std::string> fp8 = ranks;
  fp8.insert(fp8.end(), {"--resume-from", (root_ / "bf16" / "checkpoints" / "step_000003").string()});
  train(write_config("fp8", 6), "fp8", fp8);
  const std::map<int, std::string> got = losses("scheduled"), first = losses("bf16"), then = losses("fp8");
  ASSERT_EQ(got.size(), 6u);
  for (int step = 1; step <= 6; ++step)
    EXPECT_EQ(got.at(step), step <= 3 ? first.at(step) : then.at(step)) << "step " << step;
  // Checkpoints of shards: the master weights and each rank's shard of the moments.
  for (const char* file : {"parameters.safetensors", "optimizer-00000-of-00002.bin", "optimizer-00001-of-00002.bin"})
    EXPECT_TRUE(optimizer_file("scheduled", 6, file) == optimizer_file("fp8", 6, file)) << file;
}

// fp8 -> bf16 (FP8 state dropped) and fp32 -> bf16 (a backend made anew for attention in BF16) too.
TEST_F(PrecisionScheduleRun, OtherSwitchesEqualTheManualWayToo) {
  for (const auto& [from, to] :
       {std::pair{"fp8", "bf16"}, std::pair{"fp32", "bf16"}, std::pair{"bf16", "fp32"}}) {
    const std::string name = std::string(from) + "_" + to;
    train(
        write_config(from, 5), name,
        {"--set", fmt::format("train.precision_phases=[{{ mode = \"{}\", steps = 2 }}, {{ mode = \"{}\" }}]",
                              from, to)});
    train(write_config(from, 5), name + "_first", {"--set", "checkpoint.every=2"});
    train(write_config(to, 5), name + "_then",
          {"--resume-from", (root_ / (name + "_first") / "checkpoints" / "step_000002").string()});
    const std::map<int, std::string> got = losses(name), first = losses(name + "_first"),
                                     then = losses(name + "_then");
    ASSERT_EQ(got.size(), 5u) << name;
    for (int step = 1; step <= 5; ++step)
      EXPECT_EQ(got.at(step), step <= 2 ? first.at(step) : then.at(step)) << name << ", step " << step;
    EXPECT_TRUE(optimizer_file(name, 5) == optimizer_file(name + "_then", 5)) << name;
  }
}

TEST_F(PrecisionScheduleRun, ABadScheduleIsRefusedBeforeAnythingIsWritten) {
  const testing::ProcessResult r =
      run_octet({"train", write_config("bf16", 8).string(), "--set",
                 "train.precision_phases=[{ mode = \"bf16\", steps = 3 }, { mode = \"fp8\", steps = 3 }]"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("train.precision_phases: the phases' steps add up to 6, but train.steps is 8"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(root_ / "run"));
}

}  // namespace
}  // namespace octet
