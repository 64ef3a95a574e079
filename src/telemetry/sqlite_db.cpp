// See sqlite_db.h.
#include "sqlite_db.h"

#include <sqlite3.h>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::telemetry_db {

Database::Database(const std::filesystem::path& path, Mode mode) : path_(path) {
  const int flags =
      mode == Mode::read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  const int rc = sqlite3_open_v2(path.string().c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(ErrorKind::invalid_input, fmt::format("cannot open {}: {}", path.string(), message));
  }
  sqlite3_busy_timeout(db_, 5000);  // a reader (octet inspect) may hold the database for a moment
}

Database::~Database() {
  sqlite3_close(db_);  // statements are finalized by their owners first
}

std::string Database::describe_error(std::string_view doing) const {
  return fmt::format("{}: {} failed: {}", path_.string(), doing, sqlite3_errmsg(db_));
}

void Database::execute(std::string_view sql) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &message);
  if (rc != SQLITE_OK) {
    const std::string text = message != nullptr ? message : sqlite3_errstr(rc);
    sqlite3_free(message);
    throw Error(ErrorKind::invalid_input, fmt::format("{}: {}", path_.string(), text));
  }
}

Statement::Statement(Database& db, std::string_view sql) : db_(db) {
  if (sqlite3_prepare_v2(db.handle(), sql.data(), static_cast<int>(sql.size()), &statement_, nullptr) !=
      SQLITE_OK) {
    throw Error(ErrorKind::invalid_input, db.describe_error(fmt::format("preparing '{}'", sql)));
  }
}

Statement::~Statement() {
  sqlite3_finalize(statement_);
}

Statement& Statement::bind(int index, int64_t value) {
  sqlite3_bind_int64(statement_, index, value);
  return *this;
}
Statement& Statement::bind(int index, double value) {
  sqlite3_bind_double(statement_, index, value);
  return *this;
}
Statement& Statement::bind(int index, std::string_view value) {
  sqlite3_bind_text(statement_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  return *this;
}
Statement& Statement::bind(int index, const std::optional<int64_t>& value) {
  if (!value) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  return bind(index, *value);
}
Statement& Statement::bind(int index, const std::optional<double>& value) {
  if (!value) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  return bind(index, *value);
}
Statement& Statement::bind(int index, const std::optional<std::string>& value) {
  if (!value) {
    sqlite3_bind_null(statement_, index);
    return *this;
  }
  return bind(index, std::string_view(*value));
}

bool Statement::step() {
  const int rc = sqlite3_step(statement_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw Error(ErrorKind::invalid_input, db_.describe_error(fmt::format("'{}'", sqlite3_sql(statement_))));
}

void Statement::run() {
  while (step()) {
  }
  reset();
}

void Statement::reset() {
  sqlite3_reset(statement_);
  sqlite3_clear_bindings(statement_);
}

bool Statement::is_null(int column) {
  return sqlite3_column_type(statement_, column) == SQLITE_NULL;
}
int64_t Statement::integer(int column) {
  return sqlite3_column_int64(statement_, column);
}
double Statement::real(int column) {
  return sqlite3_column_double(statement_, column);
}
std::string Statement::text(int column) {
  const unsigned char* t = sqlite3_column_text(statement_, column);
  return t != nullptr ? std::string(reinterpret_cast<const char*>(t)) : std::string();
}
std::optional<int64_t> Statement::optional_integer(int column) {
  if (is_null(column)) return std::nullopt;
  return integer(column);
}
std::optional<double> Statement::optional_real(int column) {
  if (is_null(column)) return std::nullopt;
  return real(column);
}
std::optional<std::string> Statement::optional_text(int column) {
  if (is_null(column)) return std::nullopt;
  return text(column);
}

}  // namespace octet::telemetry_db
