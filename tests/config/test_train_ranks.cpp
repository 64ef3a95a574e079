// `octet train --ranks N` as a user runs it: N processes of one data-parallel run on this machine, joined
// over TCP (dist/socket_group.h), the path `--gpus N` takes with NCCL for the tensors. Rank 0 alone prints
// and writes; the run repeats exactly and resumes exactly; it starts where one rank would (the first step's
// loss is one rank's over the same global batch); 4 ranks in a hybrid layout (2 x 2) say so, save the first
// shard group's shards and resume exactly; a rank that dies stops the run naming it; ranks started with
// different configurations are refused before anything is written.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "process.h"
#include "train_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::run_octet;

class TrainRanks : public TrainFixture {
 protected:
  // Starts `octet args` in the background with `env` added, standard output and error into files.
  pid_t start(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
              const fs::path& out, const fs::path& err) {
    std::vector<std::string> all = {OCTET_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) std::_Exit(126);
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::_Exit(127);
    }
    return pid;
  }

  // The exit status of `pid`, waiting at most `limit`; nothing when it did not end in time (it is killed).
  static std::optional<int> wait_for(pid_t pid, std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return std::nullopt;
  }

  static int free_port() {
    // Ports apart per test and per process, in a range the kernel does not hand out for outgoing connections.
    return 20000 + static_cast<int>(::getpid() % 5000) * 2;
  }
};

TEST_F(TrainRanks, TwoRanksTrainOneRunThatRankZeroWritesAndThatRepeatsExactly) {
  const fs::path config = write_config("fp8", 4);
  const testing::ProcessResult r = run_octet(
      {"train", config.string(), "--ranks", "2", "--set", "distributed.sharded_gradient_sums=reduce_scatter"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rank 0 of 2 (octet train --gpus/--ranks): data parallel, each rank 1 micro-batch(es) of "
                       "the step's 2; gradients summed in float32 over the ranks' sockets; optimizer state "
                       "sharded over 2 ranks (ZeRO-1), each receiving the sums of its shard's gradients "
                       "(reduce-scatter)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("rank 1 of 2 (octet train --gpus/--ranks): "), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("rank 1 of"), std::string::npos) << "rank 1 prints no progress:\n" << r.out;
  // FP8 weight gathers leave the masters outside a rank's shard stale, and their whole pages go.
  const size_t masters = r.out.find("float32 masters: ");
  ASSERT_NE(masters, std::string::npos) << r.out;
  const std::string line = r.out.substr(masters, r.out.find('\n', masters) - masters);
  EXPECT_NE(line.find("stale outside this rank's shard (weights gathered as FP8 codes), "), std::string::npos)
      << line;
  EXPECT_NE(line.find(" KiB of it given back"), std::string::npos) << line;
  EXPECT_EQ(line.find(", 0.0 KiB of it given back"), std::string::npos) << line;
  const std::string metrics = read(root_ / "run" / "metrics.jsonl");
  const auto losses = step_losses(metrics);
  ASSERT_EQ(losses.size(), 4u) << metrics;
  // Each step trains on both ranks' micro-batches: 2 ranks x 2 sequences x 16 tokens.
  EXPECT_NE(metrics.find("\"tokens\":64,"), std::string::npos) << metrics;
  // What rank 0 sent for each step's gradient sums: its reduce-scatter's bytes, the gradients outside its
  // shard, the same every step.
  EXPECT_NE(metrics.find("\"gradient_bytes_sent\":"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("\"gradient_bytes_sent\":0,"), std::string::npos) << metrics;
  EXPECT_TRUE(fs::exists(root_ / "run" / "checkpoints" / "step_000004" / "model.safetensors"));

  const testing::ProcessResult again =
      run_octet({"train", config.string(), "--ranks", "2", "--set", "distributed.sharded_gradient_sums=reduce_scatter",
                 "--set", "logging.run_dir=" + (root_ / "again").string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(step_losses(read(root_ / "again" / "metrics.jsonl")), losses);
}

// The trainer of an FP8 run on two ranks gives back the masters its gathers leave stale as it is made, so a
// run that starts from a checkpoint's weights (--init-from) maps them back before it loads the weights: a
// write to a page given back would end the rank with a fault.
TEST_F(TrainRanks, AnFp8RunOfTwoRanksStartsFromACheckpointsWeights) {
  const fs::path config = write_config("fp8", 2);
  const testing::ProcessResult first = run_octet({"train", config.string(), "--ranks", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const testing::ProcessResult from = run_octet({"train", config.string(), "--ranks", "2", "--init-from",
                                                 (root_ / "run" / "checkpoints" / "step_000002").string(),
                                                 "--set", "logging.run_dir=" + (root_ / "from").string()});
  ASSERT_EQ(from.exit_code, 0) << from.err;
  EXPECT_NE(from.out.find(" KiB of it given back"), std::string::npos) << from.out;
  const auto a = step_losses(read(root_ / "run" / "metrics.jsonl"));
  const auto b = step_losses(read(root_ / "from" / "metrics.jsonl"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(a.at(1), b.at(1)) << "the second run starts from the first run's trained weights";
}

TEST_F(TrainRanks, FullyShardedFp8RanksValidateTogetherTrainAsRanksHoldingEveryCopyAndResumeExactly) {
  // Fully sharded weights gather the codes in every forward, a validation's too: every rank runs it (were
  // rank 0 alone to validate, the ranks would wait for each other's gathers forever; each run is bounded).
  // Four blocks: more than the gathers started after the update hold (two), so a validation gathers too.
  const fs::path config = write_config("fp8", 4);
  const auto train = [&](const std::string& dir, bool reshard, const std::vector<std::string>& more) {
    std::vector<std::string> args = {
        "train",   config.string(),
        "--ranks", "2",
        "--set",   "model.layers=4",
        "--set",   "checkpoint.every=2",
        "--set",   "logging.run_dir=" + (root_ / dir).string(),
        "--set",   std::string("distributed.reshard_after_forward=") + (reshard ? "true" : "false")};
    args.insert(args.end(), more.begin(), more.end());
    const pid_t pid = start(args, {}, root_ / (dir + ".out"), root_ / (dir + ".err"));
    const std::optional<int> status = wait_for(pid, std::chrono::seconds(120));
    EXPECT_TRUE(status.has_value()) << dir << ": still running after 2 minutes";
    EXPECT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << dir << ": " << read(root_ / (dir + ".err"));
    return read(root_ / dir / "metrics.jsonl");
  };
  const std::string held = train("held", false, {});
  const std::string sharded = train("sharded", true, {});
  EXPECT_NE(read(root_ / "sharded.out").find("fully sharded"), std::string::npos)
      << read(root_ / "sharded.out");
  EXPECT_EQ(step_losses(sharded), step_losses(held));
  ASSERT_EQ(step_losses(sharded).size(), 4u);
  // The validation losses too (metrics lines with val_loss), at steps 2 and 4.
  const auto validations = [](const std::string& metrics) {
    std::vector<std::string> out;
    std::istringstream lines(metrics);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("\"val_loss\"") != std::string::npos) out.push_back(line);
    }
    return out;
  };
  EXPECT_EQ(validations(sharded).size(), 2u) << sharded;
  EXPECT_EQ(validations(sharded), validations(held));
  const std::string resumed =
      train("resumed", true, {"--resume-from", (root_ / "sharded" / "checkpoints" / "step_000002").string()});
  auto expected = step_losses(sharded);
  expected.erase(expected.begin(), expected.find(3));
  EXPECT_EQ(step_losses(resumed), expected) << "steps 3 and 4 after the resume equal the uninterrupted run's";
  // A new run from those weights (--init-from: the copies remade from whole weights, each rank's own codes
  // taken from them) trains as one that holds every copy.
  const std::vector<std::string> from = {"--init-from",
                                         (root_ / "sharded" / "checkpoints" / "step_000002").string()};
  const std::string sharded_from = train("sharded_from", true, from);
  const std::string held_from = train("held_from", false, from);
  ASSERT_EQ(step_losses(sharded_from).size(), 4u);
  EXPECT_EQ(step_losses(sharded_from), step_losses(held_from));
  EXPECT_NE(step_losses(sharded_from).at(1), step_losses(sharded).at(1)) << "it starts from trained weights";
}

TEST_F(TrainRanks, TheFirstStepIsOneRanksOverTheSameGlobalBatch) {
  // Same weights, same micro-batches: the step's loss is the same sum of the same losses. (Later steps agree
  // to rounding: one rank adds the micro-batches' gradients in another order; the library's data-parallel
  // tests show the exact equality against a rank accumulating as the ranks do.)
  const fs::path config = write_config("fp32", 3);
  const testing::ProcessResult two = run_octet({"train", config.string(), "--ranks", "2"});
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const testing::ProcessResult one =
      run_octet({"train", config.string(), "--set", "train.grad_accum_steps=2", "--set",
                 "logging.run_dir=" + (root_ / "one").string()});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto a = step_losses(read(root_ / "run" / "metrics.jsonl"));
  const auto b = step_losses(read(root_ / "one" / "metrics.jsonl"));
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a.at(1), b.at(1));
  for (int step = 2; step <= 3; ++step) {
    EXPECT_NEAR(std::stod(a.at(step)), std::stod(b.at(step)), 1e-4 * std::stod(b.at(step))) << "step " << step;
  }
}

TEST_F(TrainRanks, AResumedRunOfTwoRanksContinuesExactly) {
  const fs::path config = write_config("bf16", 6);
  const std::vector<std::string> keep = {"--set", "checkpoint.every=3", "--set", "checkpoint.keep_last=3"};
  std::vector<std::string> whole = {"train", config.string(), "--ranks", "2"};
  whole.insert(whole.end(), keep.begin(), keep.end());
  const testing::ProcessResult w = run_octet(whole);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  std::vector<std::string> resumed = {"train",
                                      config.string(),
                                      "--ranks",
                                      "2",
                                      "--resume-from",
                                      (root_ / "run" / "checkpoints" / "step_000003").string(),
                                      "--set",
                                      "logging.run_dir=" + (root_ / "resumed").string()};
  resumed.insert(resumed.end(), keep.begin(), keep.end());
  const testing::ProcessResult r = run_octet(resumed);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto expected = step_losses(read(root_ / "run" / "metrics.jsonl"));
  const auto got = step_losses(read(root_ / "resumed" / "metrics.jsonl"));
  expected.erase(expected.begin(), expected.find(4));
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(got, expected) << "steps 4 to 6 after the resume equal the uninterrupted run's";
  // The optimizer state is sharded over the 2 ranks (the default dp_shard): each wrote its shard.
  const fs::path saved = root_ / "run" / "checkpoints" / "step_000003";
  for (const char* file : {"shards.json", "optimizer-00000-of-00002.bin", "optimizer-00001-of-00002.bin",
                           "parameters.safetensors", "model.safetensors", "state.json"}) {
    EXPECT_TRUE(fs::is_regular_file(saved / file)) << file;
  }
  EXPECT_FALSE(fs::exists(saved / "optimizer.safetensors"));
}

TEST_F(TrainRanks, ACheckpointOfShardsResumesOnOneRankAndIsReadByEvalAndExport) {
  const fs::path config = write_config("bf16", 4);
  const testing::ProcessResult w =
      run_octet({"train", config.string(), "--ranks", "2", "--set", "checkpoint.every=2"});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const fs::path saved = root_ / "run" / "checkpoints" / "step_000002";
  ASSERT_TRUE(fs::is_regular_file(saved / "shards.json"));

  // One rank accumulating both ranks' micro-batches continues the run (to rounding: it accumulates the
  // micro-batches within its GEMMs, where the ranks add two sums; the library's tests show the exact resume).
  const testing::ProcessResult one =
      run_octet({"train", config.string(), "--resume-from", saved.string(), "--set", "train.grad_accum_steps=2",
                 "--set", "logging.run_dir=" + (root_ / "one").string()});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto expected = step_losses(read(root_ / "run" / "metrics.jsonl"));
  const auto got = step_losses(read(root_ / "one" / "metrics.jsonl"));
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [step, loss] : got) {
    EXPECT_NEAR(std::stod(loss), std::stod(expected.at(step)), 1e-3 * std::stod(expected.at(step))) << step;
  }

  const testing::ProcessResult eval = run_octet({"eval", saved.string()});
  EXPECT_EQ(eval.exit_code, 0) << eval.err;
  const fs::path out = root_ / "exported";
  const testing::ProcessResult exported =
      run_octet({"export", saved.string(), "--format", "hf", "--out", out.string()});
  EXPECT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(fs::is_regular_file(out / "model.safetensors")) << exported.out;

  // A shard gone: refused with exit code 2, naming it, and nothing written.
  fs::remove(saved / "optimizer-00001-of-00002.bin");
  const testing::ProcessResult refused =
      run_octet({"train", config.string(), "--resume-from", saved.string(), "--set",
                 "logging.run_dir=" + (root_ / "refused").string()});
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("optimizer-00001-of-00002.bin is missing"), std::string::npos) << refused.err;
  EXPECT_FALSE(fs::exists(root_ / "refused"));
}

TEST_F(TrainRanks, FourRanksInAHybridLayoutSayItSaveTheFirstGroupsShardsAndResumeExactly) {
  const fs::path config = write_config("bf16", 4);
  const std::vector<std::string> hybrid = {"--ranks", "4",
                                           "--set",   "distributed.dp_shard=2",
                                           "--set",   "distributed.dp_replicate=2",
                                           "--set",   "checkpoint.every=2",
                                           "--set",   "checkpoint.keep_last=2"};
  std::vector<std::string> args = {"train", config.string()};
  args.insert(args.end(), hybrid.begin(), hybrid.end());
  const testing::ProcessResult r = run_octet(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("rank 0 of 4 (octet train --gpus/--ranks): data parallel, each rank 1 micro-batch(es) of "
                 "the step's 4; gradients summed in float32 over the ranks' sockets; optimizer state "
                 "sharded over each of 2 groups of 2 ranks (hybrid: dp_shard = 2, dp_replicate = 2) "
                 "(ZeRO-1), each receiving every gradient's sum (all-reduce)"),
      std::string::npos)
      << r.out;
  // The first group's 2 ranks wrote the 2 shards.
  const fs::path saved = root_ / "run" / "checkpoints" / "step_000002";
  for (const char* file : {"shards.json", "optimizer-00000-of-00002.bin", "optimizer-00001-of-00002.bin"}) {
    EXPECT_TRUE(fs::is_regular_file(saved / file)) << file;
  }
  EXPECT_FALSE(fs::exists(saved / "optimizer-00000-of-00004.bin"));

  args = {"train",        config.string(), "--resume-from",
          saved.string(), "--set",         "logging.run_dir=" + (root_ / "resumed").string()};
  args.insert(args.end(), hybrid.begin(), hybrid.end());
  const testing::ProcessResult resumed = run_octet(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto expected = step_losses(read(root_ / "run" / "metrics.jsonl"));
  expected.erase(expected.begin(), expected.find(3));
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(step_losses(read(root_ / "resumed" / "metrics.jsonl")), expected);
}

TEST_F(TrainRanks, ARankThatDiesStopsTheRunNamingIt) {
  const fs::path config = write_config("fp32", 100000);
  const pid_t launcher = start({"train", config.string(), "--ranks", "2", "--set", "data.eval_every=0"},
                               {{"OCTET_DIST_TIMEOUT", "60"}}, root_ / "out.txt", root_ / "err.txt");
  // Once training is under way, rank 1 is killed.
  const fs::path metrics = root_ / "run" / "metrics.jsonl";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until && (!fs::exists(metrics) || fs::file_size(metrics) == 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(metrics) && fs::file_size(metrics) > 0) << read(root_ / "err.txt");
  pid_t rank1 = -1;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string environ = read(entry.path() / "environ");
    const std::string status = read(entry.path() / "status");
    if (status.find("PPid:\t" + std::to_string(launcher) + "\n") == std::string::npos) continue;
    if (environ.find(std::string("OCTET_RANK=1") + '\0') != std::string::npos)
      rank1 = std::stoi(entry.path().filename().string());
  }
  ASSERT_GT(rank1, 0) << "rank 1's process";
  const auto killed = std::chrono::steady_clock::now();
  ::kill(rank1, SIGKILL);
  const std::optional<int> status = wait_for(launcher, std::chrono::seconds(60));
  ASSERT_TRUE(status.has_value()) << "the run did not stop";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + SIGKILL) << *status;
  const std::string err = read(root_ / "err.txt");
  // (", stopping the other ranks" follows where rank 0 had not yet stopped by itself when rank 1's end was seen.)
  EXPECT_NE(err.find("octet: rank 1 was ended by signal 9"), std::string::npos) << err;
  // Rank 0 finds rank 1 gone reading from it or writing to it, whichever it was doing.
  EXPECT_TRUE(err.find("rank 1 closed its connection") != std::string::npos ||
              err.find("rank 1 could not be reached") != std::string::npos)
      << "rank 0 says which rank it lost:\n" << err;
  EXPECT_LT(seconds, 30.0);
}

TEST_F(TrainRanks, RanksStartedWithDifferentConfigurationsAreRefusedBeforeAnythingIsWritten) {
  const fs::path config = write_config("bf16", 3);
  const std::string port = std::to_string(free_port());
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {"train", config.string()};
    if (r == 1) args.insert(args.end(), {"--set", "train.seed=7"});
    ranks.push_back(start(args,
                          {{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                           {"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OCTET_MASTER_PORT", port},
                           {"OCTET_DIST_TIMEOUT", "60"}},
                          root_ / ("out" + std::to_string(r) + ".txt"), root_ / ("err" + std::to_string(r) + ".txt")));
  }
  for (int r = 0; r < 2; ++r) {
    const std::optional<int> status = wait_for(ranks[static_cast<size_t>(r)], std::chrono::seconds(60));
    ASSERT_TRUE(status.has_value()) << "rank " << r << " did not stop";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << "rank " << r << ": " << *status;
    const std::string err = read(root_ / ("err" + std::to_string(r) + ".txt"));
    EXPECT_NE(err.find("rank 1's configuration differs from rank 0's"), std::string::npos) << err;
  }
  EXPECT_FALSE(fs::exists(root_ / "run")) << "nothing is written";
}

TEST_F(TrainRanks, GpusOnTheCpuOrBeyondTheMachineAreRefused) {
  const fs::path config = write_config("bf16", 3);
  const testing::ProcessResult cpu =
      run_octet({"train", config.string(), "--gpus", "2", "--set", "train.device=cpu"});
  EXPECT_EQ(cpu.exit_code, 2);
  EXPECT_NE(cpu.err.find("--gpus 2 trains on GPUs, and train.device = \"cpu\"; use --ranks 2 for CPU ranks"),
            std::string::npos)
      << cpu.err;
  const testing::ProcessResult many = run_octet({"train", config.string(), "--gpus", "4096"});
  EXPECT_EQ(many.exit_code, 2);
  EXPECT_NE(many.err.find("--gpus 4096: this machine shows "), std::string::npos) << many.err;
  // A hybrid layout trains (above), but not with its gradients reduce-scattered: refused before any rank
  // starts, naming both keys.
  const testing::ProcessResult hybrid =
      run_octet({"train", config.string(), "--ranks", "4", "--set", "distributed.dp_shard=2", "--set",
                 "distributed.dp_replicate=2", "--set", "distributed.sharded_gradient_sums=reduce_scatter"});
  EXPECT_EQ(hybrid.exit_code, 2);
  EXPECT_NE(hybrid.err.find("distributed.sharded_gradient_sums = \"reduce_scatter\" is not supported with a "
                            "hybrid layout (distributed.dp_shard = 2 with distributed.dp_replicate = 2)"),
            std::string::npos)
      << hybrid.err;
  EXPECT_EQ(hybrid.err.find("rank 1 of 4"), std::string::npos) << "no rank started:\n" << hybrid.err;
  EXPECT_FALSE(fs::exists(root_ / "run"));
}

}  // namespace
}  // namespace octet
