// `octet inspect`'s queries over a run's telemetry database (see inspect.h).
#include "octet/telemetry/inspect.h"

#include <fmt/format.h>

#include "database_check.h"
#include "octet/check.h"
#include "sqlite_db.h"

namespace octet {
namespace {

using telemetry_db::Database;
using telemetry_db::Statement;

// The layers' worst readings of `column` (saturated_fraction or underflow_fraction), worst first. SQLite
// takes the bare columns (tensor, step) from the row that holds the MAX.
std::vector<LayerRanking> rank(Database& db, const char* column, int64_t top) {
  Statement s(db, fmt::format("SELECT layer, tensor, step, MAX({0}) AS worst, AVG({0}) FROM tensor_stats "
                              "WHERE {0} IS NOT NULL GROUP BY layer HAVING worst > 0 "
                              "ORDER BY worst DESC, layer LIMIT ?1",
                              column));
  s.bind(1, top);
  std::vector<LayerRanking> out;
  while (s.step()) out.push_back({s.text(0), s.text(1), s.integer(2), s.real(3), s.real(4)});
  return out;
}

GemmRecord gemm_row(Statement& s) {
  return {s.text(0), s.text(1), s.text(2), s.optional_text(3).value_or(""), s.integer(4)};
}

InspectReport read(Database& db, const InspectOptions& options) {
  InspectReport r;
  {
    Statement s(db, "SELECT key, value FROM run WHERE key NOT IN ('config', 'precision_map') ORDER BY key");
    while (s.step()) r.run[s.text(0)] = s.text(1);
  }
  {
    Statement s(db, "SELECT COUNT(*), COALESCE(MAX(step), 0), COALESCE(SUM(skipped), 0) FROM steps");
    s.step();
    r.steps_recorded = s.integer(0);
    r.last_step = s.integer(1);
    r.skipped_steps = s.integer(2);
  }
  {
    Statement s(db, "SELECT loss, fp8_gemms, other_gemms FROM steps ORDER BY step DESC LIMIT 1");
    if (s.step()) {
      r.last_loss = s.optional_real(0);
      r.last_fp8_gemms = s.optional_integer(1).value_or(0);
      r.last_other_gemms = s.optional_integer(2).value_or(0);
    }
    Statement first(db, "SELECT fp8_gemms FROM steps ORDER BY step LIMIT 1");
    if (first.step()) r.first_fp8_gemms = first.optional_integer(0).value_or(0);
  }
  {
    Statement s(db, "SELECT loss FROM validation ORDER BY step DESC LIMIT 1");
    if (s.step()) r.last_validation_loss = s.optional_real(0);
    Statement t(db, "SELECT COUNT(DISTINCT step) FROM tensor_stats");
    t.step();
    r.telemetry_steps = t.integer(0);
  }
  r.saturation = rank(db, "saturated_fraction", options.top);
  r.underflow = rank(db, "underflow_fraction", options.top);
  {
    Statement s(db,
                "SELECT layer, gemm, mode, reason, since_step FROM gemms WHERE since_step > 0 "
                "ORDER BY since_step, rowid");
    while (s.step()) r.precision_changes.push_back(gemm_row(s));
  }
  {
    // The mode changes: their events, at the checkpoint's step, whose message the recorder writes as "mode M
    // from step S (B before): ...", and the GEMM rows written from the step after.
    Statement s(
        db, "SELECT step, message FROM events WHERE kind = 'mode_change' AND step IS NOT NULL ORDER BY id");
    Statement counts(
        db,
        "SELECT COUNT(DISTINCT layer), COUNT(DISTINCT CASE mode WHEN 'fp8' THEN layer END) FROM gemms "
        "WHERE since_step = ?1");
    while (s.step()) {
      InspectReport::ModeChange change;
      change.step = s.integer(0) + 1;
      const std::string message = s.text(1);
      const size_t mode_end = message.find(' ', 5), before = message.find(" ("),
                   before_end = message.find(" before)");
      change.mode = message.starts_with("mode ") && mode_end != std::string::npos
                        ? message.substr(5, mode_end - 5)
                        : "?";
      change.before = before != std::string::npos && before_end != std::string::npos && before_end > before
                          ? message.substr(before + 2, before_end - before - 2)
                          : "?";
      counts.bind(1, change.step);
      if (counts.step()) {
        change.layers = counts.integer(0);
        change.fp8_layers = counts.integer(1);
      }
      counts.reset();
      r.mode_changes.push_back(change);
    }
  }
  {
    Statement s(db, "SELECT step, kind, layer, tensor, value, threshold, message FROM events ORDER BY id");
    while (s.step()) {
      r.events.push_back({s.optional_integer(0), s.text(1), s.optional_text(2), s.optional_text(3),
                          s.optional_real(4), s.optional_real(5), s.text(6)});
    }
  }
  if (!options.layer.empty()) {
    Statement s(db,
                "SELECT step, layer, tensor, amax, scale, saturated_fraction, underflow_fraction, sqnr_db "
                "FROM tensor_stats WHERE layer = ?1 ORDER BY step, CASE tensor WHEN 'activation' THEN 0 "
                "WHEN 'weight' THEN 1 ELSE 2 END");
    s.bind(1, std::string_view(options.layer));
    while (s.step()) {
      r.layer_history.push_back({s.integer(0), s.text(1), s.text(2), s.optional_real(3), s.optional_real(4),
                                 s.optional_real(5), s.optional_real(6), s.optional_real(7)});
    }
    Statement g(db,
                "SELECT layer, gemm, mode, reason, since_step FROM gemms WHERE layer = ?1 "
                "ORDER BY since_step, rowid");
    g.bind(1, std::string_view(options.layer));
    while (g.step()) r.layer_gemms.push_back(gemm_row(g));
    if (r.layer_history.empty()) {
      Statement names(db, "SELECT DISTINCT layer FROM tensor_stats ORDER BY layer");
      std::vector<std::string> layers;
      while (names.step()) layers.push_back(names.text(0));
      OCTET_REQUIRE(false, "--layer {}: no FP8 telemetry for this layer in {}; layers with telemetry: {}",
                    options.layer, db.path().string(),
                    layers.empty() ? "none" : fmt::format("{}", fmt::join(layers, ", ")));
    }
  }
  return r;
}

}  // namespace

InspectReport inspect_run(const std::filesystem::path& run_dir, const InspectOptions& options) {
  namespace fs = std::filesystem;
  OCTET_REQUIRE(options.top >= 1, "--top must be at least 1, got {}", options.top);
  OCTET_REQUIRE(fs::is_directory(run_dir), "{} is not a directory (give the run directory, logging.run_dir)",
                run_dir.string());
  const fs::path file = run_dir / kTelemetryFile;
  OCTET_REQUIRE(fs::is_regular_file(file),
                "{} has no {}: it is not a run directory, or the run had telemetry.enabled = false",
                run_dir.string(), kTelemetryFile);
  Database db(file, Database::Mode::read_only);
  db.execute("BEGIN");  // one snapshot for every query, even while the run is still being written
  telemetry_db::check_telemetry_database(db);
  InspectReport r = read(db, options);
  db.execute("COMMIT");
  r.database = file;
  return r;
}

}  // namespace octet
