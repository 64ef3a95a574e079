// What octet inspect and octet report refuse: a telemetry.sqlite with text where numbers belong, non-finite
// numbers, negative counts, fractions above 1, steps beyond any real run, unknown tensor or GEMM names, a
// broken precision map, missing tables or columns, more rows than a reader takes, or a truncated file. Each
// is one invalid_input error (exit code 2) naming the file, the table and column, and what was expected;
// the database is left as it was and no page is written. The readers in-process; test_telemetry_fuzz runs
// thousands of random cases, also through the binary.
#include <filesystem>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/telemetry/inspect.h"
#include "octet/telemetry/report.h"
#include "telemetry_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

struct Planted {
  const char* sql;
  std::vector<const char*> message;  // each must be in the error
};

class ReaderRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet-refusals-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    file_ = testing::write_small_telemetry(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Both readers refuse the database with one line holding every fragment, and leave it as it was.
  void expect_refused(const std::vector<const char*>& fragments, const std::string& what) {
    const std::string before = testing::file_bytes(file_);
    for (int reader = 0; reader < 2; ++reader) {
      const char* name = reader == 0 ? "inspect" : "report";
      try {
        if (reader == 0) {
          inspect_run(dir_, {});
        } else {
          telemetry::write_report({dir_, std::nullopt, {}});
        }
        ADD_FAILURE() << name << " read " << what << " without an error";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_EQ(e.kind(), ErrorKind::invalid_input) << name << ": " << m;
        EXPECT_EQ(m.find('\n'), std::string::npos) << name << ": " << m;
        EXPECT_NE(m.find(file_.string() + " is not a readable octet telemetry database: "), std::string::npos)
            << name << ": " << m;
        for (const char* f : fragments)
          EXPECT_NE(m.find(f), std::string::npos) << name << ": " << m << "\nwanted: " << f;
      }
    }
    EXPECT_FALSE(fs::exists(dir_ / "report.html")) << what;
    EXPECT_EQ(testing::file_bytes(file_), before) << what << ": the database changed";
  }

  fs::path dir_;
  fs::path file_;
};

TEST_F(ReaderRefusals, TheSmallDatabaseReadsAsWritten) {
  const InspectReport r = inspect_run(dir_, {});
  EXPECT_EQ(r.steps_recorded, 8);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.first_fp8_gemms, 6);
  EXPECT_EQ(r.last_fp8_gemms, 3);
  ASSERT_EQ(r.saturation.size(), 2u);
  EXPECT_DOUBLE_EQ(r.saturation[0].worst, 0.02);
  const telemetry::ReportSummary s = telemetry::write_report({dir_, std::nullopt, {}});
  EXPECT_EQ(s.loss_points, 8);
  EXPECT_EQ(s.validation_points, 4);
  EXPECT_EQ(s.events, 3);
}

TEST_F(ReaderRefusals, GarbageValuesAreRefusedWithTheTableColumnAndWhatWasExpected) {
  const Planted cases[] = {
      {"UPDATE steps SET loss = 'abc' WHERE step = 5",
       {"table steps, column loss, row 5: expected a finite number or NULL, found text 'abc'"}},
      {"UPDATE steps SET fp8_gemms = -3 WHERE step = 7",
       {"table steps, column fp8_gemms", "found integer -3"}},
      {"UPDATE steps SET tokens = 2.5 WHERE step = 2", {"table steps, column tokens", "an integer from 0"}},
      {"UPDATE steps SET skipped = 7 WHERE step = 1",
       {"table steps, column skipped", "an integer from 0 to 1"}},
      {"UPDATE steps SET step_ms = -1e999 WHERE step = 1", {"column step_ms", "found real -inf"}},
      {"UPDATE steps SET learning_rate = x'0102' WHERE step = 4",
       {"column learning_rate", "a blob of 2 bytes"}},
      {"UPDATE steps SET step = 9000000000000000000 WHERE step = 8",
       {"table steps, column step", "an integer from 0 to 1000000000000",
        "found integer 9000000000000000000"}},
      {"UPDATE validation SET loss = 1e999", {"table validation, column loss", "found real inf"}},
      {"UPDATE tensor_stats SET amax = 1e999 WHERE rowid = 2", {"table tensor_stats, column amax, row 2"}},
      {"UPDATE tensor_stats SET saturated_fraction = 1.5 WHERE rowid = 3",
       {"column saturated_fraction", "a number from 0 to 1 or NULL, found real 1.5"}},
      {"UPDATE tensor_stats SET underflow_fraction = 'NaN' WHERE rowid = 1",
       {"column underflow_fraction", "found text 'NaN'"}},
      {"UPDATE tensor_stats SET tensor = 'bias' WHERE rowid = 1",
       {"column tensor", "one of 'activation', 'weight', 'gradient'", "found text 'bias'"}},
      {"UPDATE tensor_stats SET layer = x'41' WHERE rowid = 1", {"column layer", "found a blob of 1 bytes"}},
      {"UPDATE tensor_stats SET step = -4 WHERE rowid = 1",
       {"table tensor_stats, column step", "found integer -4"}},
      {"UPDATE gemms SET mode = 'fp4' WHERE rowid = 1", {"table gemms, column mode", "found text 'fp4'"}},
      {"UPDATE gemms SET since_step = 'soon' WHERE rowid = 2", {"table gemms, column since_step"}},
      {"UPDATE phases SET ms = 'slow' WHERE rowid = 1", {"table phases, column ms"}},
      {"UPDATE events SET value = 1e999 WHERE rowid = 2", {"table events, column value", "found real inf"}},
      {"UPDATE events SET message = x'00ff' WHERE rowid = 1",
       {"table events, column message", "a blob of 2 bytes"}},
      {"UPDATE events SET kind = zeroblob(3) WHERE rowid = 1",
       {"table events, column kind", "a blob of 3 bytes"}},
      {"UPDATE run SET value = '[[[' WHERE key = 'precision_map'",
       {"table run, key precision_map: expected a JSON array of objects"}},
      {"UPDATE run SET value = '[{\"layer\": \"a\", \"scales\": {\"weight\": [1]}}]' WHERE key = "
       "'precision_map'",
       {"table run, key precision_map: expected a JSON array of objects"}},
      // The tables of later versions, checked where present.
      {"INSERT INTO shadow VALUES(2, 'h.0.mlp.c_fc', 1.5)",
       {"table shadow, column cosine", "found real 1.5"}},
      {"INSERT INTO shadow_loss VALUES(2, 5.5, 5.4, -0.01)",
       {"table shadow_loss, column relative_difference"}},
      {"INSERT INTO recalibrations VALUES(2, 'h.0.mlp.c_fc', 'weight', 'one', 1.0, 2.0, 'every 2 steps')",
       {"table recalibrations, column scale_before", "found text 'one'"}},
      {"INSERT INTO localization(layer, position, choice, reason) VALUES('h.0.mlp.c_fc', 0, 'fp4', 'r')",
       {"table localization, column choice", "found text 'fp4'"}},
      {"INSERT INTO localization(layer, position, choice, reason, bf16_ms) VALUES('h.0.mlp.c_fc', 0, 'fp8', "
       "'r', "
       "-1)",
       {"table localization, column bf16_ms"}},
      {"UPDATE run SET value = printf('%.*c', 5000000, 'x') WHERE key = 'config'",
       {"table run, column value", "text of at most"}},
      {"UPDATE events SET message = 'line one' || char(10) || 'line two' || char(27) WHERE rowid = 1; "
       "UPDATE events SET threshold = 'x' WHERE rowid = 1",
       {"table events, column threshold"}},
  };
  for (const Planted& p : cases) {
    SetUp();
    ASSERT_EQ(testing::execute_sql(file_, p.sql), "") << p.sql;
    expect_refused(p.message, p.sql);
  }
}

TEST_F(ReaderRefusals, MissingTablesColumnsAndTooManyRowsAreRefused) {
  const Planted cases[] = {
      {"DROP TABLE phases", {"it has no table 'phases'"}},
      {"DROP TABLE steps", {"it has no table 'steps'"}},
      {"ALTER TABLE tensor_stats DROP COLUMN underflow_fraction",
       {"table tensor_stats has no column 'underflow_fraction'"}},
      {"ALTER TABLE events RENAME COLUMN message TO text", {"table events has no column 'message'"}},
      {"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1001) "
       "INSERT INTO run(key, value) SELECT 'key' || i, 'v' FROM n",
       {"table run has 1007 rows, more than a reader takes (1000)"}},
      {"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2100) "
       "INSERT INTO gemms(layer, gemm, mode, since_step) SELECT 'layer' || i, 'forward', 'fp8', 0 FROM n",
       {"name 2103 layers, more than a reader takes (2048)"}},
  };
  for (const Planted& p : cases) {
    SetUp();
    ASSERT_EQ(testing::execute_sql(file_, p.sql), "") << p.sql;
    expect_refused(p.message, p.sql);
  }
}

TEST_F(ReaderRefusals, ATruncatedFileIsRefused) {
  const std::string bytes = testing::file_bytes(file_);
  ASSERT_GT(bytes.size(), 4096u * 3);
  for (const size_t size : {bytes.size() / 2, size_t{4096} * 2, size_t{100}}) {
    SetUp();
    fs::resize_file(file_, size);
    expect_refused({}, "a file cut to " + std::to_string(size) + " bytes");
  }
}

}  // namespace
}  // namespace octet
