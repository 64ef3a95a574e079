// The telemetry store: the schema is exactly the fixed one (src/telemetry/schema.sql), every column of every
// table reads back as written (read here with SQLite directly, not through octet's reader), the writer thread
// writes everything queued before it closes, a resumed run keeps the earlier rows and replaces the later
// ones, and a bad database is one clear error.
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/telemetry/inspect.h"
#include "octet/telemetry/store.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("octet-store-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A read-only view of a database through the SQLite C API: rows as text (NULL as "NULL").
class RawDb {
 public:
  explicit RawDb(const fs::path& p) {
    EXPECT_EQ(sqlite3_open_v2(p.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK) << p;
  }
  ~RawDb() { sqlite3_close(db_); }
  std::vector<std::vector<std::string>> rows(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db_);
    std::vector<std::vector<std::string>> out;
    while (s != nullptr && sqlite3_step(s) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        if (sqlite3_column_type(s, c) == SQLITE_NULL) {
          row.push_back("NULL");
        } else if (sqlite3_column_type(s, c) == SQLITE_FLOAT) {
          row.push_back(std::to_string(sqlite3_column_double(s, c)));
        } else {
          row.push_back(reinterpret_cast<const char*>(sqlite3_column_text(s, c)));
        }
      }
      out.push_back(std::move(row));
    }
    sqlite3_finalize(s);
    return out;
  }
  void execute(const std::string& sql) {
    char* message = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &message), SQLITE_OK)
        << (message ? message : "");
    sqlite3_free(message);
  }

 private:
  sqlite3* db_ = nullptr;
};

using Rows = std::vector<std::vector<std::string>>;

std::string num(double v) {
  return std::to_string(v);
}

TEST(TelemetryStore, SchemaIsExactlyTheFixedOne) {
  TempDir dir;
  { TelemetryStore store(dir.path() / "telemetry.sqlite"); }
  std::ifstream in(fs::path(OCTET_SOURCE_DIR) / "src" / "telemetry" / "schema.sql");
  ASSERT_TRUE(in.good()) << "the fixed schema, src/telemetry/schema.sql";
  std::stringstream sql;
  sql << in.rdbuf();
  // A database made by SQLite from the fixed schema.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "reference.sqlite").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, sql.str().c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(raw);
  sqlite3_close(raw);
  RawDb ours(dir.path() / "telemetry.sqlite");
  RawDb reference(dir.path() / "reference.sqlite");
  const std::string tables = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name";
  ASSERT_EQ(ours.rows(tables), reference.rows(tables));
  EXPECT_EQ(ours.rows(tables).size(), 11u);
  for (const auto& t : reference.rows(tables)) {
    // name, type, not null, default, primary-key position of every column
    const std::string columns =
        "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('" + t[0] + "')";
    EXPECT_EQ(ours.rows(columns), reference.rows(columns)) << t[0];
  }
}

TEST(TelemetryStore, EveryColumnReadsBackAsWritten) {
  TempDir dir;
  const fs::path file = dir.path() / "telemetry.sqlite";
  {
    TelemetryStore store(file);
    store.add(RunInfoRecord{"mode", "fp8"});
    store.add(RunInfoRecord{"started_at", "2026-01-01T00:00:00Z"});
    store.add(RunInfoRecord{"started_at", "later", true});  // kept: the first value stays
    store.add(StepRecord{7, 2.5, 3e-4, 0.75, 65536.0, false, std::nullopt, 512, 12.5, 40960.0, 12, 3});
    store.add(StepRecord{8, std::nullopt, 2e-4, std::nullopt, 32768.0, true, "non-finite loss (nan)", 512,
                         11.0, 46545.5, 12, 3});
    store.add(ValidationRecord{8, 3.25});
    store.add(TensorRecord{10, "h.0.mlp.c_fc", "activation", 4.5, 99.5, 0.125, 0.0625, 31.5});
    store.add(TensorRecord{10, "h.0.mlp.c_fc", "weight", std::nullopt, std::nullopt, std::nullopt,
                           std::nullopt, std::nullopt});
    store.add(GemmRecord{"h.0.mlp.c_fc", "forward", "fp8", "FP8 by policy", 0});
    store.add(PhaseRecord{10, "forward", 1.5});
    store.add(
        EventRecord{10, "saturation", "h.0.mlp.c_fc", "activation", 0.125, 0.01, "warning: it saturated"});
    store.add(
        EventRecord{std::nullopt, "info", std::nullopt, std::nullopt, std::nullopt, std::nullopt, "note"});
    store.close();
  }
  RawDb db(file);
  EXPECT_EQ(db.rows("SELECT key, value FROM run ORDER BY key"),
            (Rows{{"mode", "fp8"}, {"started_at", "2026-01-01T00:00:00Z"}}));
  EXPECT_EQ(db.rows("SELECT * FROM steps ORDER BY step"),
            (Rows{{"7", num(2.5), num(3e-4), num(0.75), num(65536.0), "0", "NULL", "512", num(12.5),
                   num(40960.0), "12", "3"},
                  {"8", "NULL", num(2e-4), "NULL", num(32768.0), "1", "non-finite loss (nan)", "512",
                   num(11.0), num(46545.5), "12", "3"}}));
  EXPECT_EQ(db.rows("SELECT * FROM validation"), (Rows{{"8", num(3.25)}}));
  EXPECT_EQ(
      db.rows("SELECT * FROM tensor_stats ORDER BY tensor"),
      (Rows{{"10", "h.0.mlp.c_fc", "activation", num(4.5), num(99.5), num(0.125), num(0.0625), num(31.5)},
            {"10", "h.0.mlp.c_fc", "weight", "NULL", "NULL", "NULL", "NULL", "NULL"}}));
  EXPECT_EQ(db.rows("SELECT * FROM gemms"), (Rows{{"h.0.mlp.c_fc", "forward", "fp8", "FP8 by policy", "0"}}));
  EXPECT_EQ(db.rows("SELECT * FROM phases"), (Rows{{"10", "forward", num(1.5)}}));
  EXPECT_EQ(db.rows("SELECT step, kind, layer, tensor, value, threshold, message FROM events ORDER BY id"),
            (Rows{{"10", "saturation", "h.0.mlp.c_fc", "activation", num(0.125), num(0.01),
                   "warning: it saturated"},
                  {"NULL", "info", "NULL", "NULL", "NULL", "NULL", "note"}}));

  // octet's own reader sees the same.
  InspectOptions options;
  options.layer = "h.0.mlp.c_fc";
  const InspectReport r = inspect_run(dir.path(), options);
  EXPECT_EQ(r.run.at("mode"), "fp8");
  EXPECT_EQ(r.steps_recorded, 2);
  EXPECT_EQ(r.last_step, 8);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_FALSE(r.last_loss.has_value());
  EXPECT_EQ(r.last_validation_loss, 3.25);
  ASSERT_EQ(r.saturation.size(), 1u);
  EXPECT_EQ(r.saturation[0].layer, "h.0.mlp.c_fc");
  EXPECT_EQ(r.saturation[0].worst, 0.125);
  EXPECT_EQ(r.saturation[0].step, 10);
  ASSERT_EQ(r.layer_history.size(), 2u);
  EXPECT_EQ(r.layer_history[0].sqnr_db, 31.5);
  EXPECT_EQ(r.events.size(), 2u);
}

TEST(TelemetryStore, TheWriterWritesEverythingQueuedBeforeItCloses) {
  TempDir dir;
  const fs::path file = dir.path() / "telemetry.sqlite";
  constexpr int64_t kSteps = 20000;
  {
    TelemetryStore store(file);
    for (int64_t i = 1; i <= kSteps; ++i) {
      StepRecord s;
      s.step = i;
      s.loss = 1.0 / static_cast<double>(i);
      store.add(s);
      if (i % 1000 == 0) store.add(TensorRecord{i, "h.0.attn.c_attn", "activation", 1.0, 2.0, 0.0, 0.0, {}});
    }
    // No flush or close: the destructor writes what is queued.
  }
  RawDb db(file);
  EXPECT_EQ(db.rows("SELECT COUNT(*), MIN(step), MAX(step) FROM steps"),
            (Rows{{std::to_string(kSteps), "1", std::to_string(kSteps)}}));
  EXPECT_EQ(db.rows("SELECT COUNT(*) FROM tensor_stats"), (Rows{{"20"}}));
}

TEST(TelemetryStore, FlushMakesRowsVisibleToReadersWhileOpen) {
  TempDir dir;
  TelemetryStore store(dir.path() / "telemetry.sqlite");
  store.add(StepRecord{1, 2.0, 1e-3, 1.0, 1.0, false, {}, 32, 1.0, 32000.0, 0, 15});
  store.flush();
  const InspectReport r = inspect_run(dir.path(), {});
  EXPECT_EQ(r.steps_recorded, 1);
}

TEST(TelemetryStore, AResumedRunKeepsEarlierRowsAndReplacesLaterOnes) {
  TempDir dir;
  const fs::path file = dir.path() / "telemetry.sqlite";
  {
    TelemetryStore store(file);
    store.add(RunInfoRecord{"started_at", "first", true});
    for (int64_t i = 1; i <= 10; ++i)
      store.add(StepRecord{i, 1.0, 1e-3, 1.0, 1.0, false, {}, 32, 1.0, 1.0, 12, 3});
    store.add(TensorRecord{4, "h.0.mlp.c_fc", "activation", 1.0, 1.0, 0.5, 0.0, {}});
    store.add(TensorRecord{8, "h.0.mlp.c_fc", "activation", 1.0, 1.0, 0.5, 0.0, {}});
    store.add(GemmRecord{"h.0.mlp.c_fc", "forward", "fp8", "FP8 by policy", 0});
    store.add(EventRecord{4, "saturation", "h.0.mlp.c_fc", "activation", 0.5, 0.01, "alert at 4"});
    store.add(GemmRecord{"h.0.mlp.c_fc", "forward", "bf16", "moved at 4", 5});
    store.add(EventRecord{8, "saturation", "h.0.attn.c_proj", "gradient", 0.5, 0.01, "alert at 8"});
    store.add(GemmRecord{"h.0.attn.c_proj", "forward", "bf16", "moved at 8", 9});
    store.add(ValidationRecord{4, 2.0});
    store.add(ValidationRecord{8, 1.5});
  }
  {
    TelemetryStore store(file, 6);  // the checkpoint holds 6 steps
    const TelemetryResume& resumed = store.resumed();
    EXPECT_TRUE(resumed.has_gemms);
    EXPECT_EQ(resumed.alerts_raised.size(), 1u);
    EXPECT_EQ(resumed.alerts_raised.count({"h.0.mlp.c_fc", "activation", "saturation"}), 1u);
    ASSERT_EQ(resumed.layers_in_bf16.size(), 1u);
    EXPECT_EQ(resumed.layers_in_bf16[0],
              std::make_pair(std::string("h.0.mlp.c_fc"), std::string("moved at 4")));
    store.add(RunInfoRecord{"started_at", "second", true});
    for (int64_t i = 7; i <= 8; ++i)
      store.add(StepRecord{i, 9.0, 1e-3, 1.0, 1.0, false, {}, 32, 1.0, 1.0, 9, 6});
  }
  RawDb db(file);
  EXPECT_EQ(db.rows("SELECT value FROM run WHERE key = 'started_at'"), (Rows{{"first"}}));
  EXPECT_EQ(db.rows("SELECT step, loss FROM steps WHERE step > 5 ORDER BY step"),
            (Rows{{"6", num(1.0)}, {"7", num(9.0)}, {"8", num(9.0)}}));
  EXPECT_EQ(db.rows("SELECT COUNT(*) FROM steps"), (Rows{{"8"}}));
  EXPECT_EQ(db.rows("SELECT step FROM tensor_stats"), (Rows{{"4"}}));
  EXPECT_EQ(db.rows("SELECT message FROM events"), (Rows{{"alert at 4"}}));
  EXPECT_EQ(db.rows("SELECT reason FROM gemms ORDER BY rowid"), (Rows{{"FP8 by policy"}, {"moved at 4"}}));
  EXPECT_EQ(db.rows("SELECT step FROM validation"), (Rows{{"4"}}));

  // A run that starts afresh in the same directory starts its telemetry afresh.
  { TelemetryStore store(file); }
  EXPECT_EQ(db.rows("SELECT COUNT(*) FROM steps"), (Rows{{"0"}}));
}

TEST(TelemetryStore, ABadDatabaseIsOneClearError) {
  TempDir dir;
  const fs::path garbage = dir.path() / "telemetry.sqlite";
  std::ofstream(garbage) << std::string(4096, 'x');
  try {
    TelemetryStore store(garbage);
    FAIL() << "a file that is not a database was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
    EXPECT_NE(std::string(e.what()).find(garbage.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a database"), std::string::npos) << e.what();
  }
  try {
    TelemetryStore store(dir.path() / "no" / "such" / "dir" / "telemetry.sqlite");
    FAIL() << "a database in a missing directory was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
  try {
    inspect_run(dir.path(), {});
    FAIL() << "inspect accepted a corrupt database";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
    EXPECT_NE(std::string(e.what()).find("is not a readable octet telemetry database"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace octet
