// A small but complete telemetry.sqlite written by the real store (every table with rows, NULLs where the
// store writes them, an alert, a layer moved to BF16), for the tests of what the readers accept and refuse.
#pragma once

#include <filesystem>
#include <string>

namespace octet::testing {

// Writes RUN_DIR/telemetry.sqlite (RUN_DIR is created) and returns its path.
std::filesystem::path write_small_telemetry(const std::filesystem::path& run_dir);

// Runs SQL on a database with the SQLite C API; returns SQLite's message, or "" when it succeeded.
std::string execute_sql(const std::filesystem::path& database, const std::string& sql);

// The bytes of a file ("" when it cannot be read).
std::string file_bytes(const std::filesystem::path& file);

}  // namespace octet::testing
