// The telemetry store's shadow and recalibration tables: every column reads back as written (NULLs where a
// value is absent, float32 scales exactly), a fresh run empties them, and a resumed run deletes their rows
// after the step it resumes at and remembers the shadow alerts raised up to it.
#include <sqlite3.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/telemetry/store.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using Rows = std::vector<std::vector<std::string>>;

Rows rows(const fs::path& file, const std::string& sql) {
  Rows out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* s = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  while (s != nullptr && sqlite3_step(s) == SQLITE_ROW) {
    std::vector<std::string> row;
    for (int c = 0; c < sqlite3_column_count(s); ++c) {
      const unsigned char* text = sqlite3_column_text(s, c);
      row.emplace_back(text == nullptr ? "NULL" : reinterpret_cast<const char*>(text));
    }
    out.push_back(std::move(row));
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

class ShadowStore : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet-shadow-store-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    file_ = dir_ / "telemetry.sqlite";
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Two checks and a recalibration at steps 2 and 4, and a shadow alert at each.
  void write_run() {
    TelemetryStore store(file_);
    for (const int64_t step : {2, 4}) {
      store.add(ShadowLossRecord{step, 3.5, 3.25, 1.0 / 13.0});
      store.add(ShadowLayerRecord{step, "h.0.mlp.c_fc", 0.875});
      store.add(ShadowLayerRecord{step, "h.0.mlp.c_proj", std::nullopt});
      store.add(RecalibrationRecord{step, "h.0.mlp.c_fc", "activation", 0.001f, 448.0f / 3.0f, 3.0,
                                    "every 2 steps"});
      store.add(
          RecalibrationRecord{step, "h.0.mlp.c_fc", "gradient", 2.0, 2.0, std::nullopt, "every 2 steps"});
      store.add(EventRecord{step, "shadow_cosine", "h.0.mlp.c_fc" + std::to_string(step), "weight_gradient",
                            0.5, 0.9, "warning"});
    }
    store.add(ShadowLossRecord{6, std::nullopt, 3.0, std::nullopt});
    store.close();
  }
  fs::path dir_;
  fs::path file_;
};

TEST_F(ShadowStore, EveryColumnReadsBackAsWritten) {
  write_run();
  // relative_difference compared in SQL with the same float64 quotient (SQLite's text of a REAL is rounded).
  EXPECT_EQ(
      rows(file_,
           "SELECT step, fp8_loss, bf16_loss, relative_difference IS NULL, relative_difference = 1.0 / 13.0 "
           "FROM shadow_loss ORDER BY step"),
      (Rows{{"2", "3.5", "3.25", "0", "1"},
            {"4", "3.5", "3.25", "0", "1"},
            {"6", "NULL", "3.0", "1", "NULL"}}));
  EXPECT_EQ(rows(file_, "SELECT step, layer, cosine FROM shadow ORDER BY step, layer"),
            (Rows{{"2", "h.0.mlp.c_fc", "0.875"},
                  {"2", "h.0.mlp.c_proj", "NULL"},
                  {"4", "h.0.mlp.c_fc", "0.875"},
                  {"4", "h.0.mlp.c_proj", "NULL"}}));
  const Rows r =
      rows(file_,
           "SELECT step, layer, tensor, printf('%.17g', scale_before), printf('%.17g', scale_after), amax, "
           "reason FROM recalibrations WHERE step = 2 ORDER BY tensor");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(static_cast<float>(std::stod(r[0][3])), 0.001f);
  EXPECT_EQ(static_cast<float>(std::stod(r[0][4])), 448.0f / 3.0f);
  EXPECT_EQ(r[0][5], "3.0");
  EXPECT_EQ(r[1][5], "NULL");
  EXPECT_EQ(r[1][6], "every 2 steps");
}

TEST_F(ShadowStore, AResumedRunDeletesLaterRowsAndRemembersItsAlerts) {
  write_run();
  {
    TelemetryStore store(file_, 2);
    const auto& raised = store.resumed().alerts_raised;
    EXPECT_EQ(raised.size(), 1u);
    EXPECT_TRUE(raised.contains({"h.0.mlp.c_fc2", "weight_gradient", "shadow_cosine"}));
    store.close();
  }
  EXPECT_EQ(rows(file_, "SELECT step FROM shadow_loss"), (Rows{{"2"}}));
  EXPECT_EQ(rows(file_, "SELECT DISTINCT step FROM shadow"), (Rows{{"2"}}));
  EXPECT_EQ(rows(file_, "SELECT DISTINCT step FROM recalibrations"), (Rows{{"2"}}));
  // A fresh run in the same directory starts its tables empty.
  { TelemetryStore store(file_); }
  for (const char* table : {"shadow_loss", "shadow", "recalibrations"})
    EXPECT_EQ(rows(file_, std::string("SELECT COUNT(*) FROM ") + table), (Rows{{"0"}})) << table;
}

}  // namespace
}  // namespace octet
