// The telemetry store's writer (see store.h): the schema, resuming, and the writer thread.
#include "octet/telemetry/store.h"

#include <fmt/format.h>

#include "octet/check.h"
#include "sqlite_db.h"

namespace octet {
namespace {

using telemetry_db::Database;
using telemetry_db::Statement;

// Exactly the schema of docs/telemetry.md (src/telemetry/schema.sql; a test compares the two).
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS run(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps(step INTEGER PRIMARY KEY, loss REAL, learning_rate REAL, grad_norm REAL,
  loss_scale REAL, skipped INTEGER NOT NULL, skip_reason TEXT, tokens INTEGER, step_ms REAL,
  tokens_per_s REAL, fp8_gemms INTEGER, other_gemms INTEGER);
CREATE TABLE IF NOT EXISTS validation(step INTEGER PRIMARY KEY, loss REAL);
CREATE TABLE IF NOT EXISTS tensor_stats(step INTEGER NOT NULL, layer TEXT NOT NULL, tensor TEXT NOT NULL,
  amax REAL, scale REAL, saturated_fraction REAL, underflow_fraction REAL, sqnr_db REAL,
  PRIMARY KEY(step, layer, tensor));
CREATE TABLE IF NOT EXISTS gemms(layer TEXT NOT NULL, gemm TEXT NOT NULL, mode TEXT NOT NULL, reason TEXT,
  since_step INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS phases(step INTEGER NOT NULL, phase TEXT NOT NULL, ms REAL,
  PRIMARY KEY(step, phase));
CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY, step INTEGER, kind TEXT NOT NULL, layer TEXT,
  tensor TEXT, value REAL, threshold REAL, message TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shadow_loss(step INTEGER PRIMARY KEY, fp8_loss REAL, bf16_loss REAL,
  relative_difference REAL);
CREATE TABLE IF NOT EXISTS shadow(step INTEGER NOT NULL, layer TEXT NOT NULL, cosine REAL,
  PRIMARY KEY(step, layer));
CREATE TABLE IF NOT EXISTS recalibrations(step INTEGER NOT NULL, layer TEXT NOT NULL, tensor TEXT NOT NULL,
  scale_before REAL NOT NULL, scale_after REAL NOT NULL, amax REAL, reason TEXT NOT NULL,
  PRIMARY KEY(step, layer, tensor));
CREATE TABLE IF NOT EXISTS localization(layer TEXT PRIMARY KEY, position INTEGER NOT NULL, choice TEXT NOT NULL,
  reason TEXT NOT NULL, fp8_loss_change REAL, bf16_loss_change REAL, fp8_gradient_cosine REAL,
  bf16_gradient_cosine REAL, bf16_ms REAL, fp8_ms REAL, activation_sqnr_db REAL, weight_sqnr_db REAL,
  gradient_sqnr_db REAL);
)sql";

// A writable database with the telemetry tables in place. These are the connection's first statements, so a
// file that is not an SQLite database fails here, with SQLite's "file is not a database".
struct TelemetryDatabase : Database {
  explicit TelemetryDatabase(const std::filesystem::path& path) : Database(path, Mode::read_write_create) {
    execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;");  // readers never block the writer
    execute(kSchema);
  }
};

}  // namespace

// The connection and the prepared inserts; used by the constructor, then only by the writer thread.
struct TelemetryStore::Writer {
  explicit Writer(const std::filesystem::path& path)
      : db(path),
        run_replace(db, "INSERT OR REPLACE INTO run(key, value) VALUES(?1, ?2)"),
        run_keep(db, "INSERT OR IGNORE INTO run(key, value) VALUES(?1, ?2)"),
        step(db,
             "INSERT OR REPLACE INTO steps(step, loss, learning_rate, grad_norm, loss_scale, skipped, "
             "skip_reason, tokens, step_ms, tokens_per_s, fp8_gemms, other_gemms) "
             "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
        validation(db, "INSERT OR REPLACE INTO validation(step, loss) VALUES(?1, ?2)"),
        tensor(db,
               "INSERT OR REPLACE INTO tensor_stats(step, layer, tensor, amax, scale, saturated_fraction, "
               "underflow_fraction, sqnr_db) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
        gemm(db, "INSERT INTO gemms(layer, gemm, mode, reason, since_step) VALUES(?1, ?2, ?3, ?4, ?5)"),
        phase(db, "INSERT OR REPLACE INTO phases(step, phase, ms) VALUES(?1, ?2, ?3)"),
        event(db,
              "INSERT INTO events(step, kind, layer, tensor, value, threshold, message) "
              "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
        shadow_loss(db,
                    "INSERT OR REPLACE INTO shadow_loss(step, fp8_loss, bf16_loss, relative_difference) "
                    "VALUES(?1, ?2, ?3, ?4)"),
        shadow(db, "INSERT OR REPLACE INTO shadow(step, layer, cosine) VALUES(?1, ?2, ?3)"),
        recalibration(db,
                      "INSERT OR REPLACE INTO recalibrations(step, layer, tensor, scale_before, scale_after, "
                      "amax, reason) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
        localization(db,
                     "INSERT OR REPLACE INTO localization(layer, position, choice, reason, fp8_loss_change, "
                     "bf16_loss_change, fp8_gradient_cosine, bf16_gradient_cosine, bf16_ms, fp8_ms, "
                     "activation_sqnr_db, weight_sqnr_db, gradient_sqnr_db) "
                     "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)") {}

  void write(const RunInfoRecord& r) {
    Statement& s = r.keep_existing ? run_keep : run_replace;
    s.bind(1, std::string_view(r.key)).bind(2, std::string_view(r.value)).run();
  }
  void write(const StepRecord& r) {
    step.bind(1, r.step)
        .bind(2, r.loss)
        .bind(3, r.learning_rate)
        .bind(4, r.grad_norm)
        .bind(5, r.loss_scale)
        .bind(6, static_cast<int64_t>(r.skipped ? 1 : 0))
        .bind(7, r.skip_reason)
        .bind(8, r.tokens)
        .bind(9, r.step_ms)
        .bind(10, r.tokens_per_s)
        .bind(11, r.fp8_gemms)
        .bind(12, r.other_gemms)
        .run();
  }
  void write(const ValidationRecord& r) { validation.bind(1, r.step).bind(2, r.loss).run(); }
  void write(const TensorRecord& r) {
    tensor.bind(1, r.step)
        .bind(2, std::string_view(r.layer))
        .bind(3, std::string_view(r.tensor))
        .bind(4, r.amax)
        .bind(5, r.scale)
        .bind(6, r.saturated_fraction)
        .bind(7, r.underflow_fraction)
        .bind(8, r.sqnr_db)
        .run();
  }
  void write(const GemmRecord& r) {
    gemm.bind(1, std::string_view(r.layer))
        .bind(2, std::string_view(r.gemm))
        .bind(3, std::string_view(r.mode))
        .bind(4, std::string_view(r.reason))
        .bind(5, r.since_step)
        .run();
  }
  void write(const PhaseRecord& r) {
    phase.bind(1, r.step).bind(2, std::string_view(r.phase)).bind(3, r.ms).run();
  }
  void write(const EventRecord& r) {
    event.bind(1, r.step)
        .bind(2, std::string_view(r.kind))
        .bind(3, r.layer)
        .bind(4, r.tensor)
        .bind(5, r.value)
        .bind(6, r.threshold)
        .bind(7, std::string_view(r.message))
        .run();
  }

  void write(const ShadowLossRecord& r) {
    shadow_loss.bind(1, r.step).bind(2, r.fp8_loss).bind(3, r.bf16_loss).bind(4, r.relative_difference).run();
  }
  void write(const ShadowLayerRecord& r) {
    shadow.bind(1, r.step).bind(2, std::string_view(r.layer)).bind(3, r.cosine).run();
  }
  void write(const RecalibrationRecord& r) {
    recalibration.bind(1, r.step)
        .bind(2, std::string_view(r.layer))
        .bind(3, std::string_view(r.tensor))
        .bind(4, r.scale_before)
        .bind(5, r.scale_after)
        .bind(6, r.amax)
        .bind(7, std::string_view(r.reason))
        .run();
  }

  void write(const LocalizationRecord& r) {
    localization.bind(1, std::string_view(r.layer))
        .bind(2, r.position)
        .bind(3, std::string_view(r.choice))
        .bind(4, std::string_view(r.reason))
        .bind(5, r.fp8_loss_change)
        .bind(6, r.bf16_loss_change)
        .bind(7, r.fp8_gradient_cosine)
        .bind(8, r.bf16_gradient_cosine)
        .bind(9, r.bf16_ms)
        .bind(10, r.fp8_ms)
        .bind(11, r.sqnr_db[0])
        .bind(12, r.sqnr_db[1])
        .bind(13, r.sqnr_db[2])
        .run();
  }

  TelemetryDatabase db;
  Statement run_replace, run_keep, step, validation, tensor, gemm, phase, event, shadow_loss, shadow,
      recalibration, localization;
};

TelemetryStore::TelemetryStore(const std::filesystem::path& path, std::optional<int64_t> resume_at)
    : path_(path) {
  writer_ = std::make_unique<Writer>(path);
  Database& db = writer_->db;
  if (!resume_at) {
    // A run that starts afresh in this directory starts its telemetry afresh too.
    db.execute(
        "BEGIN; DELETE FROM run; DELETE FROM steps; DELETE FROM validation; DELETE FROM tensor_stats; "
        "DELETE FROM gemms; DELETE FROM phases; DELETE FROM events; DELETE FROM shadow_loss; "
        "DELETE FROM shadow; DELETE FROM recalibrations; DELETE FROM localization; COMMIT;");
  } else {
    const int64_t k = *resume_at;
    Statement alerts(db,
                     "SELECT DISTINCT layer, tensor, kind FROM events WHERE step <= ?1 AND layer IS NOT NULL "
                     "AND tensor IS NOT NULL AND kind IN ('saturation', 'underflow', 'scale_jump', "
                     "'shadow_loss', 'shadow_cosine')");
    alerts.bind(1, k);
    while (alerts.step()) resumed_.alerts_raised.insert({alerts.text(0), alerts.text(1), alerts.text(2)});
    // A move decided at step k's telemetry applies from step k + 1, which the resumed run redoes.
    Statement moved(
        db,
        "SELECT layer, reason FROM gemms WHERE gemm = 'forward' AND mode = 'bf16' AND since_step > 0 "
        "AND since_step <= ?1 ORDER BY since_step, rowid");
    moved.bind(1, k + 1);
    while (moved.step()) resumed_.layers_in_bf16.emplace_back(moved.text(0), moved.text(1));
    Statement start(db, "SELECT COUNT(*) FROM gemms WHERE since_step = 0");
    resumed_.has_gemms = start.step() && start.integer(0) > 0;
    resumed_.at = k;
    Statement mode(db, "SELECT value FROM run WHERE key = 'mode'");
    if (mode.step()) resumed_.mode = mode.text(0);
    Statement modes(db,
                    "SELECT layer, gemm, mode FROM gemms WHERE since_step <= ?1 ORDER BY since_step, rowid");
    modes.bind(1, k + 1);
    while (modes.step()) resumed_.gemm_modes[{modes.text(0), modes.text(1)}] = modes.text(2);
    db.execute(
        fmt::format("BEGIN; DELETE FROM steps WHERE step > {0}; DELETE FROM validation WHERE step > {0}; "
                    "DELETE FROM tensor_stats WHERE step > {0}; DELETE FROM phases WHERE step > {0}; "
                    "DELETE FROM events WHERE step > {0}; DELETE FROM gemms WHERE since_step > {1}; "
                    "DELETE FROM shadow_loss WHERE step > {0}; DELETE FROM shadow WHERE step > {0}; "
                    "DELETE FROM recalibrations WHERE step > {0}; DELETE FROM localization; COMMIT;",
                    k, k + 1));
  }
  thread_ = std::thread([this] { run_writer(); });
}

TelemetryStore::~TelemetryStore() {
  try {
    close();
  } catch (...) {
    // Destructors never throw; close() reports errors to callers that ask.
  }
}

void TelemetryStore::run_writer() {
  std::vector<TelemetryRecord> batch;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, and everything is written
    batch.clear();
    batch.swap(queue_);
    const bool failed = !error_.empty();
    lock.unlock();
    std::string error;
    if (!failed) {
      try {
        writer_->db.execute("BEGIN");
        for (const TelemetryRecord& r : batch) std::visit([&](const auto& row) { writer_->write(row); }, r);
        writer_->db.execute("COMMIT");
      } catch (const std::exception& e) {
        error = e.what();
        try {
          writer_->db.execute("ROLLBACK");
        } catch (...) {
          // The transaction may already be gone; the first error is the one to report.
        }
      }
    }
    lock.lock();
    if (!error.empty() && error_.empty()) error_ = error;
    written_count_ += batch.size();
    written_.notify_all();
  }
}

void TelemetryStore::throw_if_failed() {
  if (!error_.empty()) {
    throw Error(ErrorKind::training_failed,
                fmt::format("cannot write the telemetry database {}",
                            error_.starts_with(path_.string()) ? error_ : path_.string() + ": " + error_));
  }
}

void TelemetryStore::add(TelemetryRecord record) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    OCTET_CHECK(!stopping_, "an open telemetry store ({})", path_.string());
    throw_if_failed();
    queue_.push_back(std::move(record));
    ++queued_;
  }
  wake_.notify_one();
}

void TelemetryStore::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = queued_;
  written_.wait(lock, [&] { return written_count_ >= target; });
  throw_if_failed();
}

void TelemetryStore::close() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
  writer_.reset();  // finalizes the statements and closes the connection (checkpointing the WAL)
  std::lock_guard<std::mutex> lock(mutex_);
  throw_if_failed();
}

}  // namespace octet
