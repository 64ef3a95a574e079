// Thin RAII owners over the SQLite C API for the telemetry store and its readers: a connection and a prepared
// statement, with errors turned into octet::Error that name the database file. Internal to the library.
//
// A read-only connection is a reader's (octet inspect, octet report): every error it raises, from SQLite or
// from a value of the wrong type, says "FILE is not a readable octet telemetry database: ...". The column
// accessors check the stored type before they convert, so that text or a blob where a number belongs, or a
// number that is not finite, is refused instead of being read as 0.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

struct sqlite3;
struct sqlite3_stmt;

namespace octet::telemetry_db {

// The longest text a column accessor copies (the resolved configuration is the longest octet writes).
inline constexpr int64_t kMaxTextBytes = 4 << 20;

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
  bool read_only() const { return mode_ == Mode::read_only; }
  // "PATH: what SQLite said (the OS's reason, where there is one) (doing)" for messages; for a read-only
  // connection "PATH is not a readable octet telemetry database: ...". call_errno: errno as the failed call
  // left it.
  std::string describe_error(std::string_view doing, int call_errno = 0) const;
  // Throws invalid_input: "PATH is not a readable octet telemetry database: `reason`" (any mode).
  [[noreturn]] void refuse(std::string_view reason) const;

 private:
  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
  Mode mode_;
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

  // Checked accessors: integer() wants an integer, real() a finite integer or real, text() text of at most
  // kMaxTextBytes; anything else (NULL included) throws invalid_input naming the column. The optional_ forms
  // take NULL as nullopt.
  bool is_null(int column);
  int64_t integer(int column);
  double real(int column);
  std::string text(int column);
  std::optional<int64_t> optional_integer(int column);
  std::optional<double> optional_real(int column);
  std::optional<std::string> optional_text(int column);

 private:
  [[noreturn]] void wrong_type(int column, std::string_view expected);

  Database& db_;
  sqlite3_stmt* statement_ = nullptr;
};

// A stored value as a message shows it: text 'abc' (quoted, control characters escaped, long text cut
// short), integer 7, real inf, a blob of 12 bytes, NULL.
std::string describe_value(std::string_view type, std::string_view text);

}  // namespace octet::telemetry_db
