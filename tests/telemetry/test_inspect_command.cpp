// Telemetry through the command line, as a user runs it: octet train writes telemetry.sqlite, octet inspect
// reads it (text and JSON), a resumed run appends to it, fp8.on_alert = "stop" ends the run with a checkpoint
// and exit code 3, "warn" says each alert once, and a bad run directory is exit code 2 with one line.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <nlohmann/json.hpp>

#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ProcessResult;
using testing::run_octet;

class InspectCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("octet-inspect-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "text");
    std::vector<std::string> args = {"data", "prepare", "--out", (root_ / "shards").string()};
    for (int d = 0; d < 40; ++d) {
      const fs::path file = root_ / "text" / ("doc" + std::to_string(100 + d) + ".txt");
      std::ofstream out(file);
      for (int i = 0; i < 60; ++i)
        out << "The quick brown fox " << (d * 7 + i) % 13 << " jumps over the lazy dog.\n";
      args.push_back(file.string());
    }
    const ProcessResult r = run_octet(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path run_dir() const { return root_ / "run"; }

  fs::path write_config(int steps, const std::string& extra = "") {
    const fs::path config = root_ / "run.toml";
    std::ofstream(config)
        << "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 32\n"
        << "[train]\nmixed_precision = \"fp8\"\nbatch_size = 2\nseq_len = 16\nsteps = " << steps
        << "\n[scheduler]\nwarmup_steps = 1\n[data]\ndir = \"" << (root_ / "shards").string()
        << "\"\neval_every = 2\neval_batches = 2\n[logging]\nrun_dir = \"" << run_dir().string()
        << "\"\nlog_every = 1\n[telemetry]\ninterval = 2\n"
        << extra;
    return config;
  }

  json inspect_json(const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"inspect", run_dir().string(), "--json"};
    args.insert(args.end(), more.begin(), more.end());
    const ProcessResult r = run_octet(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json();
  }

  fs::path root_;
};

// Static scaling with a huge scale: LayerNorm outputs (|x| ~ 1) times 10^4 saturate E4M3 at every step.
const std::string kSaturating = "[fp8]\nrecipe = \"static\"\nstatic_scale = 1e4\n";

int64_t count(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(InspectCommand, TrainWritesTelemetryThatInspectReads) {
  const ProcessResult train = run_octet({"train", write_config(6).string()});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  ASSERT_TRUE(fs::exists(run_dir() / "telemetry.sqlite"));
  const json j = inspect_json();
  EXPECT_EQ(j["run"]["mode"], "fp8");
  EXPECT_EQ(j["run"]["device"], "cpu");
  EXPECT_EQ(j["run"]["name"], "run");
  EXPECT_EQ(j["run"]["telemetry_interval"], "2");
  EXPECT_EQ(j["run"]["recipe"], "delayed (history 16, max, margin 0)");
  EXPECT_FALSE(j["run"].contains("config")) << "the long values stay in the database";
  EXPECT_EQ(j["steps"]["recorded"], 6);
  EXPECT_EQ(j["steps"]["last"], 6);
  EXPECT_EQ(j["steps"]["skipped"], 0);
  EXPECT_EQ(j["steps"]["telemetry_steps"], 3);
  EXPECT_EQ(j["steps"]["fp8_gemms_first"], 12);  // 4 layers x 3 GEMMs
  EXPECT_TRUE(j["steps"]["last_validation_loss"].is_number());
  EXPECT_TRUE(j["layer"].is_null());
  for (const char* key :
       {"database", "run", "steps", "saturation", "underflow", "precision_changes", "events"})
    EXPECT_TRUE(j.contains(key)) << key;

  const json layer = inspect_json({"--layer", "h.0.mlp.c_fc"});
  ASSERT_EQ(layer["layer"]["history"].size(), 9u);  // 3 telemetry steps x 3 tensors
  const json& first = layer["layer"]["history"][0];
  EXPECT_EQ(first["step"], 2);
  EXPECT_EQ(first["tensor"], "activation");
  EXPECT_GT(first["amax"].get<double>(), 0.0);
  EXPECT_GT(first["scale"].get<double>(), 0.0);
  EXPECT_TRUE(first["sqnr_db"].is_null()) << "SQNR is off by default";
  EXPECT_EQ(layer["layer"]["gemms"].size(), 3u);

  // The phases of every telemetry step (2, 4, 6): data, forward, backward and optimizer, each timed.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((run_dir() / "telemetry.sqlite").c_str(), &db, SQLITE_OPEN_READONLY, nullptr),
            SQLITE_OK);
  sqlite3_stmt* statement = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT step, phase, ms FROM phases ORDER BY step, phase", -1, &statement,
                               nullptr),
            SQLITE_OK);
  std::set<std::pair<int64_t, std::string>> phases;
  while (sqlite3_step(statement) == SQLITE_ROW) {
    phases.emplace(sqlite3_column_int64(statement, 0),
                   reinterpret_cast<const char*>(sqlite3_column_text(statement, 1)));
    EXPECT_GE(sqlite3_column_double(statement, 2), 0.0);
  }
  sqlite3_finalize(statement);
  sqlite3_close(db);
  std::set<std::pair<int64_t, std::string>> expected;
  for (int64_t step : {2, 4, 6}) {
    for (const char* phase : {"backward", "data", "forward", "optimizer"}) expected.emplace(step, phase);
  }
  EXPECT_EQ(phases, expected);

  const ProcessResult text = run_octet({"inspect", run_dir().string(), "--layer", "h.0.mlp.c_fc"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* part : {"mode fp8, device cpu", "steps: 6 recorded", "Most saturated", "Most underflowed",
                           "Precision changes:", "Events (", "Layer h.0.mlp.c_fc:"})
    EXPECT_NE(text.out.find(part), std::string::npos) << part << "\n" << text.out;
}

TEST_F(InspectCommand, SqnrIsRecordedWhenAskedFor) {
  ASSERT_EQ(run_octet({"train", write_config(2, "sqnr = true\n").string()}).exit_code, 0);
  const json layer = inspect_json({"--layer", "h.0.attn.c_attn"});
  for (const json& h : layer["layer"]["history"]) {
    ASSERT_TRUE(h["sqnr_db"].is_number()) << h.dump();
    EXPECT_GT(h["sqnr_db"].get<double>(), 10.0) << "E4M3/E5M2 keep more than 10 dB";
  }
}

TEST_F(InspectCommand, AResumedRunAppendsToTheSameDatabase) {
  ASSERT_EQ(
      run_octet({"train", write_config(6, "[checkpoint]\nevery = 2\nkeep_last = 5\n").string()}).exit_code,
      0);
  const std::string started = inspect_json()["run"]["started_at"];
  // Resume from step 2: steps 3 to 6 are done again and their rows replaced.
  fs::remove_all(run_dir() / "checkpoints" / "step_000004");
  fs::remove_all(run_dir() / "checkpoints" / "step_000006");
  const ProcessResult resumed =
      run_octet({"train", write_config(6, "[checkpoint]\nevery = 2\nkeep_last = 5\n").string(), "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const json j = inspect_json();
  EXPECT_EQ(j["steps"]["recorded"], 6);
  EXPECT_EQ(j["steps"]["telemetry_steps"], 3);
  EXPECT_EQ(j["run"]["started_at"], started) << "the run's start is kept";
  int64_t infos = 0;
  for (const json& e : j["events"]) infos += e["kind"] == "info" && e["step"] == 2;
  EXPECT_EQ(infos, 1) << j["events"].dump(2);
}

// A bf16 run continued in fp8 from its checkpoint: the report and inspect describe the run as it runs now
// (its latest segment: 4 of its 5 layers in FP8, the LM head excluded), and say that it changed mode.
TEST_F(InspectCommand, ARunResumedInAnotherModeIsDescribedByItsLatestSegment) {
  const std::string config = write_config(8, "[checkpoint]\nevery = 4\nkeep_last = 5\n").string();
  ASSERT_EQ(run_octet({"train", config, "--set", "train.mixed_precision=bf16"}).exit_code, 0);
  fs::remove_all(run_dir() / "checkpoints" / "step_000008");
  const ProcessResult resumed = run_octet({"train", config, "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;

  const ProcessResult report = run_octet({"report", run_dir().string()});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_NE(report.out.find("4 of 5 layers in FP8"), std::string::npos) << report.out;
  const std::string page = testing::read_file((run_dir() / "report.html").string());
  EXPECT_NE(page.find("mode fp8 from step 5 (bf16 before)"), std::string::npos);

  const json j = inspect_json();
  ASSERT_EQ(j["mode_changes"].size(), 1u) << j.dump(2);
  EXPECT_EQ(j["mode_changes"][0]["step"], 5);
  EXPECT_EQ(j["mode_changes"][0]["mode"], "fp8");
  EXPECT_EQ(j["mode_changes"][0]["before"], "bf16");
  EXPECT_EQ(j["steps"]["fp8_gemms_first"], 0);
  EXPECT_EQ(j["steps"]["fp8_gemms_last"], 12);
  int64_t fp8_from_5 = 0;
  for (const json& g : j["precision_changes"]) fp8_from_5 += g["since_step"] == 5 && g["mode"] == "fp8";
  EXPECT_EQ(fp8_from_5, 12) << j["precision_changes"].dump(2);
  const ProcessResult text = run_octet({"inspect", run_dir().string()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("from step 5: mode fp8 (bf16 before): 4 of 5 layers with a GEMM in FP8"),
            std::string::npos)
      << text.out;

  // Resumed again from the same checkpoint: the change is there once, not twice.
  fs::remove_all(run_dir() / "checkpoints" / "step_000008");
  ASSERT_EQ(run_octet({"train", config, "--resume"}).exit_code, 0);
  EXPECT_EQ(inspect_json()["mode_changes"].size(), 1u);
}

// A full disk while training: the store cannot write telemetry.sqlite (RLIMIT_FSIZE, with SIGXFSZ ignored so
// that the write fails with EFBIG instead of killing the process). The run ends with exit code 3 and one line
// naming the file and the reason, at the step after the failed write.
TEST_F(InspectCommand, AFullDiskStopsTheRunWithExitCode3NamingTheFileAndTheReason) {
  const std::string config = write_config(40, "[checkpoint]\nevery = 1000\n").string();
  // 256 KiB: above what creating the database writes.
  const ProcessResult r = testing::run_octet_limited({"train", config}, {120, 256 * 1024});
  const std::string& error = r.err;
  ASSERT_EQ(r.term_signal, 0) << "ended by signal " << r.term_signal << ": " << error;
  EXPECT_EQ(r.exit_code, 3) << error;
  EXPECT_EQ(count(error, "\n"), 1) << error;
  EXPECT_NE(error.find("cannot write the telemetry database " + (run_dir() / "telemetry.sqlite").string()),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("File too large"), std::string::npos) << "the operating system's reason: " << error;
}

TEST_F(InspectCommand, StopAlertSavesACheckpointAndExitsWith3) {
  const ProcessResult r =
      run_octet({"train", write_config(6, kSaturating + "on_alert = \"stop\"\n").string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("training stopped at step 2 by an FP8 saturation alert"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "\n"), 1) << r.err;
  EXPECT_NE(r.out.find("saved checkpoint"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(run_dir() / "checkpoints" / "step_000002" / "state.json"));
  const json j = inspect_json();
  EXPECT_EQ(j["steps"]["recorded"], 2);
  int64_t stops = 0;
  for (const json& e : j["events"]) stops += e["kind"] == "stop";
  EXPECT_EQ(stops, 1);
}

TEST_F(InspectCommand, WarnSaysEachAlertOnceAndTrainingGoesOn) {
  const ProcessResult r = run_octet({"train", write_config(6, kSaturating).string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = inspect_json();
  int64_t saturation_events = 0;
  std::set<std::pair<std::string, std::string>> seen;
  for (const json& e : j["events"]) {
    if (e["kind"] != "saturation") continue;
    ++saturation_events;
    EXPECT_TRUE(seen.insert({e["layer"].get<std::string>(), e["tensor"].get<std::string>()}).second)
        << "repeated: " << e.dump();
    EXPECT_EQ(e["step"], 2) << "these tensors saturate from the start";
  }
  EXPECT_GT(saturation_events, 0);
  EXPECT_EQ(count(r.out, "warning: FP8 saturation alert"), saturation_events) << r.out;
  EXPECT_NE(r.out.find("training goes on in FP8 (fp8.on_alert = \"warn\")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 6/6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FP8 alert(s) in this run: see `octet inspect"), std::string::npos) << r.out;
  EXPECT_GT(j["saturation"][0]["worst"].get<double>(), 0.5);
}

TEST_F(InspectCommand, DisabledTelemetryWritesNoDatabase) {
  ASSERT_EQ(run_octet({"train", write_config(2, "enabled = false\n").string()}).exit_code, 0);
  EXPECT_FALSE(fs::exists(run_dir() / "telemetry.sqlite"));
  const ProcessResult r = run_octet({"inspect", run_dir().string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("telemetry.enabled = false"), std::string::npos) << r.err;
}

TEST_F(InspectCommand, ABadRunDirectoryIsExitCode2WithOneLine) {
  ASSERT_EQ(run_octet({"train", write_config(2).string()}).exit_code, 0);
  fs::create_directories(root_ / "empty");
  fs::create_directories(root_ / "corrupt");
  std::ofstream(root_ / "corrupt" / "telemetry.sqlite") << std::string(8192, '?');
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"inspect", (root_ / "missing").string()}, "is not a directory"},
      {{"inspect", (root_ / "empty").string()}, "has no telemetry.sqlite"},
      {{"inspect", (root_ / "corrupt").string(), "--json"}, "is not a readable octet telemetry database"},
      {{"inspect", run_dir().string(), "--layer", "h.9.mlp.c_fc"}, "no FP8 telemetry for this layer"},
      {{"inspect", run_dir().string(), "--top", "0"}, "--top must be at least 1"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run_octet(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args[1] << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace octet
