// The run directory's safety as `octet train` users meet it: a run never silently replaces another, a refused
// start or resume leaves the directory byte for byte as it was, one run directory has one writer, lines reach
// their files as they are written, run files get the usual mode, a run branches from any checkpoint, and the
// exit codes let a scheduler tell a stopped run, a bad run directory and a failed write apart.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "process.h"
#include "train_fixture.h"
#include "files.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::ProcessResult;
using testing::run_octet;

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  return testing::directory_snapshot(dir);
}

int count_lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// `octet` in the background, standard output and error going to files that the test reads while it runs.
class Background {
 public:
  // file_size_limit: RLIMIT_FSIZE of the child, with SIGXFSZ ignored, so that a write beyond it fails with
  // EFBIG as on a full disk.
  Background(const std::vector<std::string>& args, const fs::path& out, const fs::path& err,
             rlim_t file_size_limit = RLIM_INFINITY) {
    std::vector<std::string> argv = {OCTET_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> pointers;
      for (std::string& a : argv) pointers.push_back(a.data());
      pointers.push_back(nullptr);
      if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) ::_exit(126);
      if (file_size_limit != RLIM_INFINITY) {
        ::signal(SIGXFSZ, SIG_IGN);
        const rlimit limit{file_size_limit, file_size_limit};
        ::setrlimit(RLIMIT_FSIZE, &limit);
      }
      ::execv(pointers[0], pointers.data());
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  pid_t pid() const { return pid_; }
  void send(int signal) const { ::kill(pid_, signal); }
  // The exit status, or 128 + the signal that ended it (as a shell reports it).
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
};

// Waits (at most a minute) until `done` holds.
bool eventually(const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < give_up) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

class RunDirectory : public TrainFixture {
 protected:
  fs::path run_dir() const { return root_ / "run"; }
  // `octet train` of the fp32 test configuration with `steps` steps and more arguments.
  std::vector<std::string> train(int steps, const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"train", write_config("fp32", steps).string()};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
  // The number of step lines (not validation lines) in RUN_DIR/metrics.jsonl.
  int metrics_steps() const { return metrics_steps(run_dir()); }
  static int metrics_steps(const fs::path& dir) {
    std::istringstream lines(read(dir / "metrics.jsonl"));
    int n = 0;
    for (std::string line; std::getline(lines, line);) n += line.find("\"loss\":") != std::string::npos;
    return n;
  }
};

void expect_one_line_refusal(const ProcessResult& r, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << what << ": " << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << what << ": " << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << what << ": " << r.err;
  EXPECT_EQ(r.out, "") << what;
}

TEST_F(RunDirectory, AnExistingRunIsRefusedAndLeftAsItWas) {
  ASSERT_EQ(run_octet(train(2)).exit_code, 0);
  const auto before = snapshot(run_dir());
  const ProcessResult again = run_octet(train(2));
  expect_one_line_refusal(again, "a second run without --resume");
  for (const std::string& said : {run_dir().string(), std::string("--resume"), std::string("--overwrite"),
                                  std::string("logging.run_dir")}) {
    EXPECT_NE(again.err.find(said), std::string::npos) << again.err << " should say " << said;
  }
  EXPECT_EQ(snapshot(run_dir()), before) << "nothing written, nothing deleted";

  // Any one of octet's records makes a run: each alone is enough for the refusal.
  for (const char* name :
       {"config.toml", "metrics.jsonl", "telemetry.sqlite", "checkpoints/step_000007/state.json"}) {
    const fs::path other = root_ / "other";
    fs::remove_all(other);
    fs::create_directories((other / name).parent_path());
    std::ofstream(other / name) << "x";
    const ProcessResult r = run_octet(train(2, {"--set", "logging.run_dir=" + other.string()}));
    expect_one_line_refusal(r, name);
    EXPECT_EQ(read(other / name), "x") << name;
  }
  const ProcessResult both = run_octet(train(2, {"--resume", "--overwrite"}));
  expect_one_line_refusal(both, "--resume with --overwrite");
  EXPECT_EQ(snapshot(run_dir()), before);
}

TEST_F(RunDirectory, OverwriteRemovesOnlyOctetsFilesOfTheOldRun) {
  ASSERT_EQ(run_octet(train(6, {"--set", "checkpoint.every=2", "--set", "checkpoint.keep_last=5"})).exit_code,
            0);
  std::ofstream(run_dir() / "notes.txt") << "mine";
  fs::create_directories(run_dir() / "plots");
  std::ofstream(run_dir() / "plots" / "loss.png") << "png";
  const ProcessResult r = run_octet(train(2, {"--overwrite"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("--overwrite: removed the previous run's config.toml, precision_map.json, metrics.jsonl, "
                 "telemetry.sqlite, checkpoints/ from " +
                 run_dir().string()),
      std::string::npos)
      << r.out;
  EXPECT_EQ(read(run_dir() / "notes.txt"), "mine");
  EXPECT_EQ(read(run_dir() / "plots" / "loss.png"), "png");
  EXPECT_EQ(metrics_steps(), 2) << "the old run's metrics are gone";
  std::vector<std::string> checkpoints;
  for (const auto& e : fs::directory_iterator(run_dir() / "checkpoints"))
    checkpoints.push_back(e.path().filename().string());
  EXPECT_EQ(checkpoints, std::vector<std::string>{"step_000002"}) << "only the new run's checkpoint";
  const ProcessResult eval = run_octet({"eval", run_dir().string()});
  EXPECT_NE(eval.out.find("(step 2, fp32)"), std::string::npos) << eval.out << eval.err;
}

TEST_F(RunDirectory, ARefusedResumeWritesNothing) {
  ASSERT_EQ(run_octet(train(4, {"--set", "checkpoint.every=2"})).exit_code, 0);
  const fs::path latest = run_dir() / "checkpoints" / "step_000004";
  const std::string optimizer = read(latest / "optimizer.safetensors");
  const std::string state = read(latest / "state.json");
  struct Damage {
    std::string what;
    std::function<void()> apply;
  };
  const Damage damages[] = {
      {"a truncated optimizer.safetensors",
       [&] { fs::resize_file(latest / "optimizer.safetensors", optimizer.size() / 2); }},
      // Well-formed, so that the checkpoint is still the latest, but of another model.
      {"a state.json of another model",
       [&] {
         std::string damaged = state;
         const size_t key = damaged.find("\"n_embd\"");
         ASSERT_NE(key, std::string::npos) << state;
         const size_t value = damaged.find("32", key);
         ASSERT_NE(value, std::string::npos) << state;
         damaged.replace(value, 2, "48");
         std::ofstream(latest / "state.json", std::ios::binary) << damaged;
       }},
      // Damaged so that the checkpoint no longer counts as complete: the run must not continue silently from
      // the older step_000002.
      {"a state.json that does not parse", [&] { std::ofstream(latest / "state.json") << "{\"step\": 4,"; }},
      {"a missing model.safetensors", [&] { fs::rename(latest / "model.safetensors", root_ / "model"); }},
  };
  for (const Damage& d : damages) {
    if (fs::exists(root_ / "model")) fs::rename(root_ / "model", latest / "model.safetensors");
    std::ofstream(latest / "optimizer.safetensors", std::ios::binary) << optimizer;
    std::ofstream(latest / "state.json", std::ios::binary) << state;
    d.apply();
    const auto before = snapshot(run_dir());
    // A different precision mode, so that a precision map written too early would differ.
    const ProcessResult r = run_octet(
        train(6, {"--resume", "--set", "train.mixed_precision=bf16", "--set", "checkpoint.every=2"}));
    expect_one_line_refusal(r, d.what);
    EXPECT_NE(r.err.find(latest.string()), std::string::npos) << r.err;
    EXPECT_EQ(snapshot(run_dir()), before) << d.what << ": the run directory is byte for byte as it was";
  }
}

TEST_F(RunDirectory, OneRunDirectoryHasOneWriter) {
  Background first(train(1000000, {"--set", "data.eval_every=0", "--set", "logging.log_every=1000"}),
                   root_ / "first.out", root_ / "first.err");
  ASSERT_TRUE(eventually([&] { return metrics_steps() >= 2; })) << read(root_ / "first.err");
  const std::string owner = "pid " + std::to_string(first.pid()) + " on host ";
  for (const std::vector<std::string>& how : {std::vector<std::string>{}, {"--resume"}, {"--overwrite"}}) {
    const std::string name = how.empty() ? "no flag" : how[0];
    const ProcessResult second = run_octet(train(10, how));
    expect_one_line_refusal(second, name);
    EXPECT_NE(second.err.find(owner), std::string::npos) << name << ": " << second.err;
    EXPECT_NE(second.err.find("in use by another octet run"), std::string::npos) << second.err;
  }
  // Killed without a chance to clean up, the owner leaves no lock behind that blocks the next run.
  first.send(SIGKILL);
  EXPECT_EQ(first.wait(), 128 + SIGKILL);
  const ProcessResult next = run_octet(train(2, {"--overwrite"}));
  EXPECT_EQ(next.exit_code, 0) << next.err;
  EXPECT_NE(read(run_dir() / "octet.lock").find("pid "), std::string::npos);
}

TEST_F(RunDirectory, LinesReachTheirFilesAsTheyAreWritten) {
  // Standard output is a file, as under nohup or a scheduler.
  Background run(train(1000000, {"--set", "data.eval_every=0"}), root_ / "out.txt", root_ / "err.txt");
  ASSERT_TRUE(eventually([&] { return metrics_steps() >= 3; })) << read(root_ / "err.txt");
  run.send(SIGSTOP);
  const int steps = metrics_steps();
  const std::string out = read(root_ / "out.txt");
  run.send(SIGKILL);
  EXPECT_EQ(run.wait(), 128 + SIGKILL);
  EXPECT_NE(out.find("training on the CPU backend"), std::string::npos) << out;
  EXPECT_NE(out.find("; run directory " + run_dir().string() + "\n"), std::string::npos) << out;
  // The progress line of a step follows its metrics line: all but perhaps the last are out already.
  for (int step = 1; step < steps; ++step) {
    EXPECT_NE(out.find("step " + std::to_string(step) + "/1000000 | loss "), std::string::npos)
        << "step " << step << " of " << steps << " in metrics.jsonl:\n"
        << out;
  }
  // kill -9 loses no step whose line was written: every line is whole.
  const std::string metrics = read(run_dir() / "metrics.jsonl");
  EXPECT_GE(metrics_steps(), steps);
  EXPECT_EQ(metrics.back(), '\n');
}

TEST_F(RunDirectory, RunFilesGetTheUsualMode) {
  const mode_t old = ::umask(022);
  const ProcessResult r = run_octet(train(2));
  ::umask(old);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"config.toml", "precision_map.json", "metrics.jsonl"}) {
    struct stat st {};
    ASSERT_EQ(::stat((run_dir() / name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0644u) << name << " is created as any file is: 0666 minus the umask";
  }
}

TEST_F(RunDirectory, ResumeFromBranchesFromAnyCheckpoint) {
  const std::vector<std::string> keep = {"--set", "checkpoint.every=2", "--set", "checkpoint.keep_last=5",
                                         "--set", "data.eval_every=0"};
  ASSERT_EQ(run_octet(train(6, keep)).exit_code, 0);
  const fs::path step2 = run_dir() / "checkpoints" / "step_000002";
  const fs::path branch = root_ / "branch";
  std::vector<std::string> args = keep;
  args.insert(args.end(), {"--resume-from", step2.string(), "--set", "logging.run_dir=" + branch.string()});
  const ProcessResult r = run_octet(train(6, args));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("branched from " + step2.string() + " at step 2 "), std::string::npos) << r.out;
  const auto original = step_losses(read(run_dir() / "metrics.jsonl"));
  const auto branched = step_losses(read(branch / "metrics.jsonl"));
  EXPECT_EQ(branched,
            (std::map<int, std::string>{
                {3, original.at(3)}, {4, original.at(4)}, {5, original.at(5)}, {6, original.at(6)}}))
      << "the branch continues exactly where the checkpoint was";

  // Into a run directory that holds a run: refused, unless the checkpoint is that run's latest (--resume).
  const auto before = snapshot(run_dir());
  args = keep;
  args.insert(args.end(), {"--resume-from", step2.string()});
  expect_one_line_refusal(run_octet(train(8, args)),
                          "--resume-from an older checkpoint of the run directory");
  args.push_back("--overwrite");
  expect_one_line_refusal(run_octet(train(8, args)), "--overwrite would remove the checkpoint");
  EXPECT_EQ(snapshot(run_dir()), before);
  const ProcessResult nowhere = run_octet(train(8, {"--resume-from", (root_ / "nowhere").string()}));
  expect_one_line_refusal(nowhere, "--resume-from a path that is no checkpoint");
  EXPECT_NE(nowhere.err.find("--resume-from: " + (root_ / "nowhere").string() + " is neither a checkpoint"),
            std::string::npos)
      << nowhere.err;
  EXPECT_EQ(snapshot(run_dir()), before);
  args = keep;
  args.insert(args.end(), {"--resume-from", (run_dir() / "checkpoints" / "step_000006").string()});
  const ProcessResult same = run_octet(train(8, args));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_NE(same.out.find("resumed from "), std::string::npos) << same.out;
  EXPECT_EQ(metrics_steps(), 8);
}

TEST_F(RunDirectory, AResumeAfterAlertsMovedLayersToBf16ContinuesExactly) {
  // Saturating FP8 casts raise alerts at the telemetry steps, and fp8.on_alert moves those layers to BF16.
  const std::vector<std::string> args = {
      "--set", "train.mixed_precision=fp8", "--set", "fp8.recipe=static",    "--set", "fp8.static_scale=1e4",
      "--set", "fp8.on_alert=bf16_layer",   "--set", "telemetry.interval=2", "--set", "checkpoint.every=2",
      "--set", "checkpoint.keep_last=5",    "--set", "data.eval_every=0"};
  const ProcessResult whole = run_octet(train(8, args));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_NE(whole.out.find("BF16"), std::string::npos) << whole.out << "(no layer moved to BF16)";
  const auto expected = step_losses(read(run_dir() / "metrics.jsonl"));
  fs::remove_all(run_dir() / "checkpoints" / "step_000006");
  fs::remove_all(run_dir() / "checkpoints" / "step_000008");
  std::vector<std::string> again = args;
  again.push_back("--resume");
  const ProcessResult resumed = run_octet(train(8, again));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from "), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("; 0 of 5 linear layers in FP8;"), std::string::npos)
      << resumed.out << "(the startup line counts the layers the alerts moved before step 4 as BF16)";
  EXPECT_EQ(resumed.out.find("FP8 scaling state starts fresh"), std::string::npos)
      << resumed.out << "(the layers without FP8 state in the checkpoint are the ones in BF16)";
  EXPECT_EQ(step_losses(read(run_dir() / "metrics.jsonl")), expected)
      << "the resumed steps equal the uninterrupted run's";
}

TEST_F(RunDirectory, SignalsEndTheRunWith128PlusTheSignal) {
  for (const int signal : {SIGINT, SIGTERM}) {
    const fs::path dir = root_ / ("run-" + std::to_string(signal));
    Background run(train(1000000, {"--set", "logging.run_dir=" + dir.string(), "--set", "data.eval_every=0",
                                   "--set", "logging.log_every=1000"}),
                   root_ / "out.txt", root_ / "err.txt");
    ASSERT_TRUE(eventually([&] { return metrics_steps(dir) >= 2; }));
    run.send(signal);
    EXPECT_EQ(run.wait(), 128 + signal) << read(root_ / "err.txt");
    const std::string out = read(root_ / "out.txt");
    EXPECT_NE(out.find("stopped by signal " + std::to_string(signal)), std::string::npos) << out;
    EXPECT_NE(out.find("saved checkpoint "), std::string::npos) << out;
  }
}

TEST_F(RunDirectory, UnusableRunDirectoriesAreOneClearLine) {
  std::ofstream(root_ / "a-file") << "x";
  fs::create_symlink(root_ / "loop", root_ / "loop");
  fs::create_directories(root_ / "odd" / "metrics.jsonl");
  fs::create_directories(root_ / "odd-checkpoints");
  std::ofstream(root_ / "odd-checkpoints" / "checkpoints") << "x";
  struct Case {
    std::string run_dir;
    std::string says;
  };
  const Case cases[] = {
      {"", "logging.run_dir is empty"},
      {(root_ / "a-file").string(), "is not a directory"},
      {(root_ / "a-file" / "run").string(), "is not a directory"},
      {(root_ / "loop").string(), "symbolic links"},
      {(root_ / "loop" / "run").string(), "symbolic links"},
      {(root_ / "odd").string(), "metrics.jsonl is a directory"},
      {(root_ / "odd-checkpoints").string(), "checkpoints is not a regular file"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_octet(train(2, {"--set", "logging.run_dir=" + c.run_dir}));
    expect_one_line_refusal(r, "logging.run_dir=" + c.run_dir);
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
  }
  EXPECT_TRUE(fs::is_empty(root_ / "odd" / "metrics.jsonl"));
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(root_ / "locked");
    fs::permissions(root_ / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    const ProcessResult r =
        run_octet(train(2, {"--set", "logging.run_dir=" + (root_ / "locked" / "run").string()}));
    expect_one_line_refusal(r, "a run directory that cannot be created");
    EXPECT_NE(r.err.find("is not writable"), std::string::npos) << r.err;
    fs::permissions(root_ / "locked", fs::perms::owner_all);
  }
}

TEST_F(RunDirectory, AModelTooLargeToAllocateIsRefused) {
  const ProcessResult r =
      run_octet(train(2, {"--set", "model.channels=1048576", "--set", "model.heads=1024"}));
  expect_one_line_refusal(r, "a model that cannot be allocated");
  EXPECT_NE(r.err.find("memory"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(RunDirectory, AFailedCheckpointSaveEndsTheRunWithExitCode3) {
  const std::vector<std::string> quiet = {"--set", "telemetry.enabled=false", "--set", "data.eval_every=0",
                                          "--set", "checkpoint.every=2"};
  ASSERT_EQ(run_octet(train(2, quiet)).exit_code, 0);
  const fs::path kept = run_dir() / "checkpoints" / "step_000002";
  const auto before = snapshot(kept);
  // Every file may grow to 64 KiB, as on a disk that is almost full: the run's small files are written,
  // the checkpoint's model.safetensors (about 88 KB) is not.
  std::vector<std::string> args = quiet;
  args.push_back("--resume");
  Background resumed(train(4, args), root_ / "out.txt", root_ / "err.txt", 64 * 1024);
  EXPECT_EQ(resumed.wait(), 3);
  const std::string err = read(root_ / "err.txt");
  EXPECT_EQ(count_lines(err), 1) << err;
  EXPECT_NE(err.find("cannot save the checkpoint of step 4"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(EFBIG)), std::string::npos) << err;
  EXPECT_NE(err.find("the last complete checkpoint, " + kept.string() + ", is kept"), std::string::npos)
      << err;
  EXPECT_EQ(snapshot(kept), before);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run_dir() / "checkpoints")) left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"step_000002"}) << "no partial checkpoint left behind";
}

TEST_F(RunDirectory, AFailedMetricsWriteEndsTheRunWithExitCode3) {
  // metrics.jsonl grows by about 300 bytes a step: at 8 KiB the file size limit stops it within 30 steps.
  Background run(train(1000, {"--set", "telemetry.enabled=false", "--set", "data.eval_every=0"}),
                 root_ / "out.txt", root_ / "err.txt", 8 * 1024);
  EXPECT_EQ(run.wait(), 3) << "the same code as a failed checkpoint save";
  const std::string err = read(root_ / "err.txt");
  EXPECT_EQ(count_lines(err), 1) << err;
  EXPECT_NE(err.find("cannot write " + (run_dir() / "metrics.jsonl").string() + ": " + std::strerror(EFBIG)),
            std::string::npos)
      << err;
}

TEST_F(RunDirectory, CountsOutOfRangeAreRefused) {
  ASSERT_EQ(run_octet(train(2)).exit_code, 0);
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::string run = run_dir().string();
  const Case cases[] = {
      {{"eval", run, "--batches", "99999999999999999999999"},
       "--batches 99999999999999999999999 is out of range"},
      {{"eval", run, "--batches", "18446744073709551617"},
       "is out of range; give an integer from 0 to 2147483647"},
      {{"eval", run, "--batches", "-1"}, "--batches -1 is out of range"},
      {{"eval", run, "--batches", "1.5"}, "--batches '1.5' is not a whole number"},
      {{"eval", run, "--batches", "2e3"}, "not a whole number; give an integer from 0 to 2147483647"},
      {{"generate", run, "--prompt", "a", "--max-tokens", "18446744073709551616"},
       "--max-tokens 18446744073709551616 is out of range; give an integer from 0 to 2147483647"},
      {{"generate", run, "--prompt", "a", "--max-tokens", "ten"}, "--max-tokens 'ten' is not a whole number"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_octet(c.args);
    expect_one_line_refusal(r, c.args[2] + " " + c.args.back());
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
  }
  const ProcessResult ok = run_octet({"generate", run, "--prompt", "a", "--max-tokens", "+3"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
}  // namespace octet
