// See report_data.h. The database is opened read-only and read inside one transaction, so that a run still
// being written is seen at one consistent point. Series are stored column-wise (one array per field) to keep
// the page small; SQL NULLs become JSON null. check_telemetry_database (database_check.h) has refused values
// of the wrong type or range, non-finite numbers among them, before anything is read.
//
// Document layout:
//   facts        {key: value} of the run table, except config and precision_map
//   config       the resolved TOML, or null
//   precision_map the parsed precision_map JSON, or null
//   layers       layer names in the precision map's order (then any others the tables name)
//   steps        {step, loss, learning_rate, grad_norm, loss_scale, skipped, tokens, step_ms, tokens_per_s,
//                 fp8_gemms, other_gemms}: one array each, one entry per step
//   skips        [{step, reason}]
//   validation   {step, loss}
//   gemms        [{layer, gemm, mode, reason, since_step}] in insertion order
//   segment_start the first step of the run's latest segment: 0, or the first step of its last mode change
//   mode_changes [{step (the first in the new mode), message}]
//   stats        {steps: [column steps], total_steps, tensors: {tensor: {layers: [names],
//                 amax|scale|saturated_fraction|underflow_fraction|sqnr_db: [[row values]]}}}
//   phases       [{phase, count, mean_ms, total_ms}], largest total first
//   events       [{id, step, kind, layer, tensor, value, threshold, message}]
//   localization [{layer, choice, reason, fp8_loss_change, bf16_loss_change, fp8_gradient_cosine,
//                 bf16_gradient_cosine, bf16_ms, fp8_ms, activation_sqnr_db, weight_sqnr_db,
//                 gradient_sqnr_db}]
//                in the map's order (empty: no precision map applied, or a database from before the table)
//   shadow       {loss: {step, fp8_loss, bf16_loss, relative_difference}, steps: [steps with cosines],
//                 layers: [names], cosine: [[per layer, per step]]}
//   recalibrations [{step, layer, tensor, scale_before, scale_after, amax, reason}]
#include "report_data.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "database_check.h"
#include "octet/check.h"
#include "sqlite_db.h"

namespace octet::telemetry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using telemetry_db::Database;
using telemetry_db::Statement;

json number_or_null(Statement& s, int column) {
  const std::optional<double> v = s.optional_real(column);
  return v ? json(*v) : json(nullptr);
}
json integer_or_null(Statement& s, int column) {
  const std::optional<int64_t> v = s.optional_integer(column);
  return v ? json(*v) : json(nullptr);
}
json text_or_null(Statement& s, int column) {
  const std::optional<std::string> v = s.optional_text(column);
  return v ? json(*v) : json(nullptr);
}

constexpr const char* kStatMetrics[] = {"amax", "scale", "saturated_fraction", "underflow_fraction",
                                        "sqnr_db"};

// Layer names in a stable order: the precision map's first, then the order the other tables name them in.
class LayerOrder {
 public:
  void add(const std::string& layer) {
    if (index_.emplace(layer, names_.size()).second) names_.push_back(layer);
  }
  size_t index(const std::string& layer) const { return index_.at(layer); }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::map<std::string, size_t> index_;
  std::vector<std::string> names_;
};

void load_facts(Database& db, json& doc, LayerOrder& layers) {
  json facts = json::object();
  doc["config"] = nullptr;
  doc["precision_map"] = nullptr;
  Statement s(db, "SELECT key, value FROM run ORDER BY key");
  while (s.step()) {
    const std::string key = s.text(0);
    if (key == "config") {
      doc["config"] = s.text(1);
    } else if (key == "precision_map") {
      json map = json::parse(s.text(1), nullptr, /*allow_exceptions=*/false);  // checked: an array of objects
      if (map.is_array()) {
        for (const json& entry : map) {
          if (entry.is_object() && entry.contains("layer") && entry["layer"].is_string()) {
            layers.add(entry["layer"].get<std::string>());
          }
        }
        doc["precision_map"] = std::move(map);
      }
    } else {
      facts[key] = s.text(1);
    }
  }
  doc["facts"] = std::move(facts);
}

void load_steps(Database& db, json& doc, RunReportData& out) {
  json steps = {{"step", json::array()},      {"loss", json::array()},       {"learning_rate", json::array()},
                {"grad_norm", json::array()}, {"loss_scale", json::array()}, {"skipped", json::array()},
                {"tokens", json::array()},    {"step_ms", json::array()},    {"tokens_per_s", json::array()},
                {"fp8_gemms", json::array()}, {"other_gemms", json::array()}};
  json skips = json::array();
  Statement s(
      db,
      "SELECT step, loss, learning_rate, grad_norm, loss_scale, skipped, skip_reason, tokens, step_ms, "
      "tokens_per_s, fp8_gemms, other_gemms FROM steps ORDER BY step");
  while (s.step()) {
    const int64_t step = s.integer(0);
    steps["step"].push_back(step);
    steps["loss"].push_back(number_or_null(s, 1));
    if (!s.is_null(1)) ++out.loss_points;
    steps["learning_rate"].push_back(number_or_null(s, 2));
    steps["grad_norm"].push_back(number_or_null(s, 3));
    steps["loss_scale"].push_back(number_or_null(s, 4));
    const bool skipped = s.integer(5) != 0;
    steps["skipped"].push_back(skipped ? 1 : 0);
    if (skipped) skips.push_back({{"step", step}, {"reason", s.optional_text(6).value_or("")}});
    steps["tokens"].push_back(integer_or_null(s, 7));
    steps["step_ms"].push_back(number_or_null(s, 8));
    steps["tokens_per_s"].push_back(number_or_null(s, 9));
    steps["fp8_gemms"].push_back(integer_or_null(s, 10));
    steps["other_gemms"].push_back(integer_or_null(s, 11));
  }
  doc["steps"] = std::move(steps);
  doc["skips"] = std::move(skips);

  json validation = {{"step", json::array()}, {"loss", json::array()}};
  Statement v(db, "SELECT step, loss FROM validation ORDER BY step");
  while (v.step()) {
    validation["step"].push_back(v.integer(0));
    validation["loss"].push_back(number_or_null(v, 1));
    if (!v.is_null(1)) ++out.validation_points;
  }
  doc["validation"] = std::move(validation);
}

// The run's latest segment starts at step 0, or at the first step of the last mode change (a run resumed in
// another mode; its event is at the checkpoint's step).
int64_t latest_segment_start(Database& db, json& doc) {
  json changes = json::array();
  int64_t start = 0;
  Statement s(db,
              "SELECT step, message FROM events WHERE kind = 'mode_change' AND step IS NOT NULL ORDER BY id");
  while (s.step()) {
    start = std::max(start, s.integer(0) + 1);
    changes.push_back({{"step", s.integer(0) + 1}, {"message", s.text(1)}});
  }
  doc["mode_changes"] = std::move(changes);
  doc["segment_start"] = start;
  return start;
}

void load_gemms(Database& db, json& doc, LayerOrder& layers, RunReportData& out) {
  const int64_t segment = latest_segment_start(db, doc);
  json gemms = json::array();
  std::map<std::pair<std::string, std::string>, std::string> at_segment_start;  // the newest row up to it
  std::set<std::string> named;
  Statement s(db, "SELECT layer, gemm, mode, reason, since_step FROM gemms ORDER BY since_step, rowid");
  while (s.step()) {
    const std::string layer = s.text(0);
    layers.add(layer);
    named.insert(layer);
    const int64_t since = s.integer(4);
    if (since <= segment) at_segment_start[{layer, s.text(1)}] = s.text(2);
    gemms.push_back({{"layer", layer},
                     {"gemm", s.text(1)},
                     {"mode", s.text(2)},
                     {"reason", text_or_null(s, 3)},
                     {"since_step", since}});
  }
  std::set<std::string> fp8_at_start;
  for (const auto& [key, mode] : at_segment_start) {
    if (mode == "fp8") fp8_at_start.insert(key.first);
  }
  // Without GEMM rows, the precision map in the run table says which layers started in FP8.
  if (gemms.empty() && doc["precision_map"].is_array()) {
    for (const json& entry : doc["precision_map"]) {
      for (const char* gemm : {"forward", "input_gradient", "weight_gradient"}) {
        if (entry.value(gemm, std::string()) == "fp8")
          fp8_at_start.insert(entry.value("layer", std::string()));
      }
    }
  }
  out.fp8_layers = static_cast<int64_t>(fp8_at_start.size());
  out.layers = static_cast<int64_t>(!named.empty()                    ? named.size()
                                    : doc["precision_map"].is_array() ? doc["precision_map"].size()
                                                                      : 0);
  doc["gemms"] = std::move(gemms);
}

// The heatmap columns: every telemetry step, or an even sample of them with the first and last kept.
std::vector<int64_t> heatmap_columns(Database& db, int64_t* total) {
  std::vector<int64_t> all;
  Statement s(db, "SELECT DISTINCT step FROM tensor_stats ORDER BY step");
  while (s.step()) all.push_back(s.integer(0));
  *total = static_cast<int64_t>(all.size());
  if (*total <= kMaxHeatmapColumns) return all;
  std::vector<int64_t> chosen;
  for (int64_t i = 0; i < kMaxHeatmapColumns; ++i) {
    const int64_t index = (i * (*total - 1) + (kMaxHeatmapColumns - 1) / 2) / (kMaxHeatmapColumns - 1);
    chosen.push_back(all[static_cast<size_t>(index)]);
  }
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  return chosen;
}

void load_tensor_stats(Database& db, json& doc, LayerOrder& layers) {
  int64_t total = 0;
  const std::vector<int64_t> columns = heatmap_columns(db, &total);
  std::map<int64_t, size_t> column_of;
  for (size_t i = 0; i < columns.size(); ++i) column_of[columns[i]] = i;

  struct Cell {
    std::optional<double> metric[std::size(kStatMetrics)];
  };
  // tensor -> layer -> column -> cell
  std::map<std::string, std::map<std::string, std::vector<Cell>>> cells;
  bool sqnr_measured = false;
  Statement s(db,
              "SELECT step, layer, tensor, amax, scale, saturated_fraction, underflow_fraction, sqnr_db "
              "FROM tensor_stats ORDER BY step");
  while (s.step()) {
    const auto column = column_of.find(s.integer(0));
    if (column == column_of.end()) continue;
    const std::string layer = s.text(1);
    layers.add(layer);
    std::vector<Cell>& row = cells[s.text(2)][layer];
    row.resize(columns.size());
    for (size_t m = 0; m < std::size(kStatMetrics); ++m)
      row[column->second].metric[m] = s.optional_real(3 + static_cast<int>(m));
    sqnr_measured = sqnr_measured || row[column->second].metric[4].has_value();
  }

  json tensors = json::object();
  for (auto& [tensor, by_layer] : cells) {
    std::vector<std::string> names;
    for (const auto& entry : by_layer) names.push_back(entry.first);
    std::sort(names.begin(), names.end(),
              [&](const std::string& a, const std::string& b) { return layers.index(a) < layers.index(b); });
    json t = {{"layers", names}};
    for (size_t m = 0; m < std::size(kStatMetrics); ++m) {
      if (m == 4 && !sqnr_measured) continue;
      json rows = json::array();
      for (const std::string& name : names) {
        json row = json::array();
        for (const Cell& c : by_layer[name]) row.push_back(c.metric[m] ? json(*c.metric[m]) : json(nullptr));
        rows.push_back(std::move(row));
      }
      t[kStatMetrics[m]] = std::move(rows);
    }
    tensors[tensor] = std::move(t);
  }
  doc["stats"] = {{"steps", columns}, {"total_steps", total}, {"tensors", std::move(tensors)}};
}

void load_phases_and_events(Database& db, json& doc, LayerOrder& layers, RunReportData& out) {
  json phases = json::array();
  Statement p(db,
              "SELECT phase, COUNT(ms), AVG(ms), SUM(ms) FROM phases GROUP BY phase "
              "ORDER BY SUM(ms) DESC, phase");
  while (p.step()) {
    phases.push_back({{"phase", p.text(0)},
                      {"count", p.integer(1)},
                      {"mean_ms", number_or_null(p, 2)},
                      {"total_ms", number_or_null(p, 3)}});
  }
  doc["phases"] = std::move(phases);

  json events = json::array();
  Statement e(db, "SELECT id, step, kind, layer, tensor, value, threshold, message FROM events ORDER BY id");
  while (e.step()) {
    if (!e.is_null(3)) layers.add(e.text(3));
    events.push_back({{"id", e.integer(0)},
                      {"step", integer_or_null(e, 1)},
                      {"kind", e.text(2)},
                      {"layer", text_or_null(e, 3)},
                      {"tensor", text_or_null(e, 4)},
                      {"value", number_or_null(e, 5)},
                      {"threshold", number_or_null(e, 6)},
                      {"message", e.text(7)}});
  }
  out.events = static_cast<int64_t>(events.size());
  doc["events"] = std::move(events);
}

// The tables of the FP8 checks in a run (docs/localization.md): localization, shadow checks, recalibrations.
// Databases of earlier versions lack them: empty then.
void load_checks(Database& db, json& doc, LayerOrder& layers) {
  json localization = json::array();
  if (telemetry_db::table_present(db, "localization")) {
    Statement s(db,
                "SELECT layer, choice, reason, fp8_loss_change, bf16_loss_change, fp8_gradient_cosine, "
                "bf16_gradient_cosine, bf16_ms, fp8_ms, activation_sqnr_db, weight_sqnr_db, gradient_sqnr_db "
                "FROM localization ORDER BY position, layer");
    constexpr const char* kNumbers[] = {"fp8_loss_change",      "bf16_loss_change", "fp8_gradient_cosine",
                                        "bf16_gradient_cosine", "bf16_ms",          "fp8_ms",
                                        "activation_sqnr_db",   "weight_sqnr_db",   "gradient_sqnr_db"};
    while (s.step()) {
      layers.add(s.text(0));
      json row = {{"layer", s.text(0)}, {"choice", s.text(1)}, {"reason", s.text(2)}};
      for (size_t k = 0; k < std::size(kNumbers); ++k)
        row[kNumbers[k]] = number_or_null(s, 3 + static_cast<int>(k));
      localization.push_back(std::move(row));
    }
  }
  doc["localization"] = std::move(localization);

  json loss = {{"step", json::array()},
               {"fp8_loss", json::array()},
               {"bf16_loss", json::array()},
               {"relative_difference", json::array()}};
  if (telemetry_db::table_present(db, "shadow_loss")) {
    Statement s(db, "SELECT step, fp8_loss, bf16_loss, relative_difference FROM shadow_loss ORDER BY step");
    while (s.step()) {
      loss["step"].push_back(s.integer(0));
      loss["fp8_loss"].push_back(number_or_null(s, 1));
      loss["bf16_loss"].push_back(number_or_null(s, 2));
      loss["relative_difference"].push_back(number_or_null(s, 3));
    }
  }
  std::vector<int64_t> steps;
  std::map<int64_t, size_t> column_of;
  std::map<std::string, std::map<size_t, std::optional<double>>> cosines;  // layer -> column -> cosine
  if (telemetry_db::table_present(db, "shadow")) {
    Statement c(db, "SELECT DISTINCT step FROM shadow ORDER BY step");
    while (c.step()) {
      column_of[c.integer(0)] = steps.size();
      steps.push_back(c.integer(0));
    }
    Statement s(db, "SELECT step, layer, cosine FROM shadow ORDER BY step, layer");
    while (s.step()) {
      layers.add(s.text(1));
      cosines[s.text(1)][column_of.at(s.integer(0))] = s.optional_real(2);
    }
  }
  std::vector<std::string> names;
  for (const auto& entry : cosines) names.push_back(entry.first);
  std::sort(names.begin(), names.end(),
            [&](const std::string& a, const std::string& b) { return layers.index(a) < layers.index(b); });
  json rows = json::array();
  for (const std::string& name : names) {
    json row(steps.size(), nullptr);
    for (const auto& [column, cosine] : cosines[name]) {
      if (cosine) row[column] = *cosine;
    }
    rows.push_back(std::move(row));
  }
  doc["shadow"] = {
      {"loss", std::move(loss)}, {"steps", steps}, {"layers", names}, {"cosine", std::move(rows)}};

  json recalibrations = json::array();
  if (telemetry_db::table_present(db, "recalibrations")) {
    Statement s(db,
                "SELECT step, layer, tensor, scale_before, scale_after, amax, reason FROM recalibrations "
                "ORDER BY step, rowid");
    while (s.step()) {
      layers.add(s.text(1));
      recalibrations.push_back({{"step", s.integer(0)},
                                {"layer", s.text(1)},
                                {"tensor", s.text(2)},
                                {"scale_before", s.real(3)},
                                {"scale_after", s.real(4)},
                                {"amax", number_or_null(s, 5)},
                                {"reason", s.text(6)}});
    }
  }
  doc["recalibrations"] = std::move(recalibrations);
}

}  // namespace

RunReportData load_run_report_data(const fs::path& run_dir) {
  OCTET_REQUIRE(fs::is_directory(run_dir), "{} is not a run directory", run_dir.string());
  const fs::path file = run_dir / "telemetry.sqlite";
  OCTET_REQUIRE(fs::is_regular_file(file),
                "{} has no telemetry.sqlite; runs record one from the start (octet train writes it)",
                run_dir.string());
  Database db(file, Database::Mode::read_only);
  db.execute("BEGIN");  // one snapshot for every query, even while the run is still being written
  telemetry_db::check_telemetry_database(db);

  RunReportData out;
  json& doc = out.document;
  doc = json::object();
  doc["dir"] = run_dir.string();
  LayerOrder layers;
  load_facts(db, doc, layers);
  load_steps(db, doc, out);
  load_gemms(db, doc, layers, out);
  load_tensor_stats(db, doc, layers);
  load_phases_and_events(db, doc, layers, out);
  load_checks(db, doc, layers);
  db.execute("COMMIT");
  doc["layers"] = layers.names();
  return out;
}

}  // namespace octet::telemetry
