// Thin RAII owners over the SQLite C API for the telemetry store and its readers: a connection and a prepared
// statement, with errors turned into octet::Error that name the database file. Internal to the library.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace octet::telemetry_db {

class Database {
 public:
  enum class Mode { read_only, read_write_create };
  // Throws invalid_input naming `path` when it cannot be opened (or is not an SQLite database).
  Database(const std::filesystem::path& path, Mode mode);
  ~Database();
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  // Runs one or more statements without results.
  void execute(std::string_view sql);
  sqlite3* handle() { return db_; }
  const std::filesystem::path& path() const { return path_; }
  // "PATH: what SQLite said" for messages.
  std::string describe_error(std::string_view doing) const;

 private:
  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
};

class Statement {
 public:
  Statement(Database& db, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // Parameters are 1-based; nullopt binds NULL.
  Statement& bind(int index, int64_t value);
  Statement& bind(int index, double value);
  Statement& bind(int index, std::string_view value);
  Statement& bind(int index, const std::optional<int64_t>& value);
  Statement& bind(int index, const std::optional<double>& value);
  Statement& bind(int index, const std::optional<std::string>& value);
  // Advances to the next row: true while there is one.
  bool step();
  // Runs a statement without results to completion and makes it ready to run again.
  void run();
  void reset();

  bool is_null(int column);
  int64_t integer(int column);
  double real(int column);
  std::string text(int column);
  std::optional<int64_t> optional_integer(int column);
  std::optional<double> optional_real(int column);
  std::optional<std::string> optional_text(int column);

 private:
  Database& db_;
  sqlite3_stmt* statement_ = nullptr;
};

}  // namespace octet::telemetry_db
