// `octet train` on the tiny corpus of TrainFixture (one GPT-2 block, 4 of 5 linear layers in FP8) with
// --set options, and reading the run's telemetry.sqlite back row by row.
#pragma once

#include <sqlite3.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "process.h"
#include "train_fixture.h"

namespace octet {

class ShadowFixture : public TrainFixture {
 protected:
  // `octet train` of the fixture's fp8 configuration for `steps` steps, with each of `sets` as --set.
  testing::ProcessResult train(int steps, const std::vector<std::string>& sets,
                               const std::vector<std::string>& more = {}) {
    const std::filesystem::path config = write_config("fp8", steps);
    std::vector<std::string> args = {"train", config.string()};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    args.insert(args.end(), more.begin(), more.end());
    return testing::run_octet(args);
  }

  // The rows of `sql` over RUN_DIR/telemetry.sqlite, every value as text ("NULL" for NULL).
  std::vector<std::vector<std::string>> query(const std::string& sql) const {
    std::vector<std::vector<std::string>> rows;
    sqlite3* db = nullptr;
    const std::string path = (root_ / "run" / "telemetry.sqlite").string();
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << path;
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db) << ": " << sql;
    while (s != nullptr && sqlite3_step(s) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(s); ++c) {
        const unsigned char* text = sqlite3_column_text(s, c);
        row.emplace_back(text == nullptr ? "NULL" : reinterpret_cast<const char*>(text));
      }
      rows.push_back(std::move(row));
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return rows;
  }
  // A single number from `sql`.
  double number(const std::string& sql) const {
    const auto rows = query(sql);
    EXPECT_EQ(rows.size(), 1u) << sql;
    return rows.empty() ? NAN : std::stod(rows[0][0]);
  }
};

}  // namespace octet
