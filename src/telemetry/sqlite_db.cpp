// See sqlite_db.h.
#include "sqlite_db.h"

#include <sqlite3.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::telemetry_db {
namespace {

std::string unreadable(const std::filesystem::path& path, std::string_view reason) {
  return fmt::format("{} is not a readable octet telemetry database: {}", path.string(), reason);
}

// SQLite's messages can quote a corrupt schema's text, line breaks included; an error is one line.
std::string one_line(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return out;
}

// What SQLite said, and the operating system's reason behind an I/O error ("File too large", "No space left
// on device"), which SQLite's own message ("disk I/O error") leaves out. SQLite keeps the reason only for
// some statements (not for a failed COMMIT), so the caller passes errno as the failed call left it too.
std::string sqlite_reason(sqlite3* db, int call_errno = 0) {
  std::string reason = one_line(sqlite3_errmsg(db));
  const int system_errno = sqlite3_system_errno(db) != 0 ? sqlite3_system_errno(db) : call_errno;
  const int code = sqlite3_errcode(db);
  if (system_errno != 0 && (code == SQLITE_IOERR || code == SQLITE_FULL || code == SQLITE_CANTOPEN))
    reason += fmt::format(" ({})", std::strerror(system_errno));
  return reason;
}

// No connection writes it: a writer in WAL mode keeps FILE-wal (and FILE-shm) while it has the database open.
bool quiescent(const std::filesystem::path& path) {
  std::error_code error;
  return !std::filesystem::exists(path.string() + "-wal", error) &&
         !std::filesystem::exists(path.string() + "-shm", error) && !error;
}

// "file:PATH?immutable=1": SQLite reads the file without locking it and without the -shm and -wal files that
// opening a WAL-mode database read-only would otherwise create, so that a reader leaves a finished run's
// directory exactly as it was.
std::string immutable_uri(const std::filesystem::path& path) {
  std::string uri = "file:";
  for (const char c : std::filesystem::absolute(path).string()) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      uri += c;
    } else {
      uri += fmt::format("%{:02X}", u);
    }
  }
  return uri + "?immutable=1";
}

}  // namespace

Database::Database(const std::filesystem::path& path, Mode mode) : path_(path), mode_(mode) {
  int flags = mode == Mode::read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  std::string name = path.string();
  if (mode == Mode::read_only && quiescent(path)) {
    name = immutable_uri(path);
    flags |= SQLITE_OPEN_URI;
  }
  const int rc = sqlite3_open_v2(name.c_str(), &db_, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = db_ != nullptr ? sqlite_reason(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error(ErrorKind::invalid_input, mode == Mode::read_only
                                              ? unreadable(path, message)
                                              : fmt::format("cannot open {}: {}", path.string(), message));
  }
  sqlite3_busy_timeout(db_, 5000);  // a reader (octet inspect) may hold the database for a moment
}

Database::~Database() {
  sqlite3_close(db_);  // statements are finalized by their owners first
}

std::string Database::describe_error(std::string_view doing, int call_errno) const {
  if (read_only()) return unreadable(path_, fmt::format("{} ({})", sqlite_reason(db_, call_errno), doing));
  return fmt::format("{}: {} ({})", path_.string(), sqlite_reason(db_, call_errno), doing);
}

void Database::refuse(std::string_view reason) const {
  throw Error(ErrorKind::invalid_input, unreadable(path_, reason));
}

void Database::execute(std::string_view sql) {
  char* message = nullptr;
  errno = 0;
  const int rc = sqlite3_exec(db_, std::string(sql).c_str(), nullptr, nullptr, &message);
  const int call_errno = errno;
  if (rc != SQLITE_OK) {
    sqlite3_free(message);
    // The statement's first words say what was being done without repeating a whole schema.
    const std::string_view first_line = sql.substr(0, std::min(sql.find('\n'), size_t{40}));
    throw Error(ErrorKind::invalid_input,
                describe_error(fmt::format("running '{}'", first_line), call_errno));
  }
}

Statement::Statement(Database& db, std::string_view sql) : db_(db) {
  if (sqlite3_prepare_v2(db.handle(), sql.data(), static_cast<int>(sql.size()), &statement_, nullptr) !=
      SQLITE_OK) {
    throw Error(ErrorKind::invalid_input, db.describe_error(fmt::format("preparing '{}'", one_line(sql))));
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
  errno = 0;
  const int rc = sqlite3_step(statement_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  const int call_errno = errno;
  throw Error(ErrorKind::invalid_input,
              db_.describe_error(fmt::format("running '{}'", one_line(sqlite3_sql(statement_))), call_errno));
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

void Statement::wrong_type(int column, std::string_view expected) {
  const int type = sqlite3_column_type(statement_, column);
  std::string found;
  switch (type) {
    case SQLITE_INTEGER:
      found = describe_value("integer", fmt::format("{}", sqlite3_column_int64(statement_, column)));
      break;
    case SQLITE_FLOAT:
      found = describe_value("real", fmt::format("{}", sqlite3_column_double(statement_, column)));
      break;
    case SQLITE_TEXT: {
      const int bytes = sqlite3_column_bytes(statement_, column);
      const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(statement_, column));
      found = describe_value("text", t != nullptr ? std::string_view(t, static_cast<size_t>(bytes)) : "");
      break;
    }
    case SQLITE_BLOB:
      found = describe_value("blob", fmt::format("{}", sqlite3_column_bytes(statement_, column)));
      break;
    default:
      found = "NULL";
  }
  const std::string what =
      fmt::format("column '{}' of '{}': expected {}, found {}", sqlite3_column_name(statement_, column),
                  sqlite3_sql(statement_), expected, found);
  if (db_.read_only()) db_.refuse(what);
  throw Error(ErrorKind::invalid_input, fmt::format("{}: {}", db_.path().string(), what));
}

bool Statement::is_null(int column) {
  return sqlite3_column_type(statement_, column) == SQLITE_NULL;
}
int64_t Statement::integer(int column) {
  if (sqlite3_column_type(statement_, column) != SQLITE_INTEGER) wrong_type(column, "an integer");
  return sqlite3_column_int64(statement_, column);
}
double Statement::real(int column) {
  const int type = sqlite3_column_type(statement_, column);
  if (type != SQLITE_INTEGER && type != SQLITE_FLOAT) wrong_type(column, "a number");
  const double v = sqlite3_column_double(statement_, column);
  if (!std::isfinite(v)) wrong_type(column, "a finite number");
  return v;
}
std::string Statement::text(int column) {
  if (sqlite3_column_type(statement_, column) != SQLITE_TEXT) wrong_type(column, "text");
  const int bytes = sqlite3_column_bytes(statement_, column);
  if (bytes > kMaxTextBytes) wrong_type(column, fmt::format("text of at most {} bytes", kMaxTextBytes));
  const unsigned char* t = sqlite3_column_text(statement_, column);
  return t != nullptr ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(bytes))
                      : std::string();
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

std::string describe_value(std::string_view type, std::string_view text) {
  if (type == "null") return "NULL";
  if (type == "blob") return fmt::format("a blob of {} bytes", text);
  if (type != "text") return fmt::format("{} {}", type, text);
  constexpr size_t kShown = 40;
  std::string out = "text '";
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f || c == '\'' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += text.size() > kShown ? "'..." : "'";
  return out;
}

}  // namespace octet::telemetry_db
