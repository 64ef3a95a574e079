// See report_data.h. The database is opened read-only and read inside one transaction, so that a run still
// being written is seen at one consistent point. Series are stored column-wise (one array per field) to keep
// the page small; SQL NULLs and non-finite numbers become JSON null.
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
//   stats        {steps: [column steps], total_steps, tensors: {tensor: {layers: [names],
//                 amax|scale|saturated_fraction|underflow_fraction|sqnr_db: [[row values]]}}}
//   phases       [{phase, count, mean_ms, total_ms}], largest total first
//   events       [{id, step, kind, layer, tensor, value, threshold, message}]
#include "report_data.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::telemetry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class Database {
 public:
  explicit Database(const fs::path& file) : file_(file) {
    const int rc = sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr);
    if (rc != SQLITE_OK) {
      const std::string message = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
      sqlite3_close(db_);
      db_ = nullptr;
      fail(message);
    }
    sqlite3_busy_timeout(db_, 5000);  // a writer holds its lock only for the moment of a commit
  }
  ~Database() { sqlite3_close(db_); }
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;

  [[noreturn]] void fail(const std::string& message) const {
    throw_error(ErrorKind::invalid_input, __FILE__, __LINE__,
                fmt::format("{} is not a readable octet telemetry database: {}", file_.string(), message));
  }
  void execute(const char* sql) {
    if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) fail(sqlite3_errmsg(db_));
  }
  sqlite3* handle() const { return db_; }

 private:
  fs::path file_;
  sqlite3* db_ = nullptr;
};

class Statement {
 public:
  Statement(Database& db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db.handle(), sql, -1, &statement_, nullptr) != SQLITE_OK) {
      db.fail(sqlite3_errmsg(db.handle()));
    }
  }
  ~Statement() { sqlite3_finalize(statement_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // True while there is a row.
  bool next() {
    const int rc = sqlite3_step(statement_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) db_.fail(sqlite3_errmsg(db_.handle()));
    return false;
  }
  bool is_null(int column) const { return sqlite3_column_type(statement_, column) == SQLITE_NULL; }
  int64_t integer(int column) const { return sqlite3_column_int64(statement_, column); }
  std::optional<double> real(int column) const {
    if (is_null(column)) return std::nullopt;
    const double v = sqlite3_column_double(statement_, column);
    return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
  }
  std::string text(int column) const {
    const unsigned char* t = sqlite3_column_text(statement_, column);
    return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
  }
  json number_or_null(int column) const {
    const std::optional<double> v = real(column);
    return v ? json(*v) : json(nullptr);
  }
  json integer_or_null(int column) const { return is_null(column) ? json(nullptr) : json(integer(column)); }
  json text_or_null(int column) const { return is_null(column) ? json(nullptr) : json(text(column)); }

 private:
  Database& db_;
  sqlite3_stmt* statement_ = nullptr;
};

constexpr const char* kTables[] = {"run", "steps", "validation", "tensor_stats", "gemms", "phases", "events"};
constexpr const char* kStatMetrics[] = {"amax", "scale", "saturated_fraction", "underflow_fraction",
                                        "sqnr_db"};

void require_tables(Database& db) {
  std::set<std::string> present;
  Statement s(db, "SELECT name FROM sqlite_master WHERE type = 'table'");
  while (s.next()) present.insert(s.text(0));
  for (const char* table : kTables) {
    if (!present.contains(table)) db.fail(fmt::format("it has no table '{}'", table));
  }
}

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
  while (s.next()) {
    const std::string key = s.text(0);
    if (key == "config") {
      doc["config"] = s.text(1);
    } else if (key == "precision_map") {
      json map = json::parse(s.text(1), nullptr, /*allow_exceptions=*/false);
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
  while (s.next()) {
    const int64_t step = s.integer(0);
    steps["step"].push_back(step);
    steps["loss"].push_back(s.number_or_null(1));
    if (s.real(1)) ++out.loss_points;
    steps["learning_rate"].push_back(s.number_or_null(2));
    steps["grad_norm"].push_back(s.number_or_null(3));
    steps["loss_scale"].push_back(s.number_or_null(4));
    const bool skipped = s.integer(5) != 0;
    steps["skipped"].push_back(skipped ? 1 : 0);
    if (skipped) skips.push_back({{"step", step}, {"reason", s.text(6)}});
    steps["tokens"].push_back(s.integer_or_null(7));
    steps["step_ms"].push_back(s.number_or_null(8));
    steps["tokens_per_s"].push_back(s.number_or_null(9));
    steps["fp8_gemms"].push_back(s.integer_or_null(10));
    steps["other_gemms"].push_back(s.integer_or_null(11));
  }
  doc["steps"] = std::move(steps);
  doc["skips"] = std::move(skips);

  json validation = {{"step", json::array()}, {"loss", json::array()}};
  Statement v(db, "SELECT step, loss FROM validation ORDER BY step");
  while (v.next()) {
    validation["step"].push_back(v.integer(0));
    validation["loss"].push_back(v.number_or_null(1));
    if (v.real(1)) ++out.validation_points;
  }
  doc["validation"] = std::move(validation);
}

void load_gemms(Database& db, json& doc, LayerOrder& layers, RunReportData& out) {
  json gemms = json::array();
  std::set<std::string> fp8_at_start;
  std::set<std::string> named;
  Statement s(db, "SELECT layer, gemm, mode, reason, since_step FROM gemms ORDER BY since_step, rowid");
  while (s.next()) {
    const std::string layer = s.text(0);
    layers.add(layer);
    named.insert(layer);
    const int64_t since = s.integer(4);
    if (since == 0 && s.text(2) == "fp8") fp8_at_start.insert(layer);
    gemms.push_back({{"layer", layer},
                     {"gemm", s.text(1)},
                     {"mode", s.text(2)},
                     {"reason", s.text_or_null(3)},
                     {"since_step", since}});
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
  while (s.next()) all.push_back(s.integer(0));
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
  while (s.next()) {
    const auto column = column_of.find(s.integer(0));
    if (column == column_of.end()) continue;
    const std::string layer = s.text(1);
    layers.add(layer);
    std::vector<Cell>& row = cells[s.text(2)][layer];
    row.resize(columns.size());
    for (size_t m = 0; m < std::size(kStatMetrics); ++m)
      row[column->second].metric[m] = s.real(3 + static_cast<int>(m));
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
  while (p.next()) {
    phases.push_back({{"phase", p.text(0)},
                      {"count", p.integer(1)},
                      {"mean_ms", p.number_or_null(2)},
                      {"total_ms", p.number_or_null(3)}});
  }
  doc["phases"] = std::move(phases);

  json events = json::array();
  Statement e(db, "SELECT id, step, kind, layer, tensor, value, threshold, message FROM events ORDER BY id");
  while (e.next()) {
    if (!e.is_null(3)) layers.add(e.text(3));
    events.push_back({{"id", e.integer(0)},
                      {"step", e.integer_or_null(1)},
                      {"kind", e.text(2)},
                      {"layer", e.text_or_null(3)},
                      {"tensor", e.text_or_null(4)},
                      {"value", e.number_or_null(5)},
                      {"threshold", e.number_or_null(6)},
                      {"message", e.text(7)}});
  }
  out.events = static_cast<int64_t>(events.size());
  doc["events"] = std::move(events);
}

}  // namespace

RunReportData load_run_report_data(const fs::path& run_dir) {
  OCTET_REQUIRE(fs::is_directory(run_dir), "{} is not a run directory", run_dir.string());
  const fs::path file = run_dir / "telemetry.sqlite";
  OCTET_REQUIRE(fs::is_regular_file(file),
                "{} has no telemetry.sqlite; runs record one from the start (octet train writes it)",
                run_dir.string());
  Database db(file);
  db.execute("BEGIN");  // one snapshot for every query, even while the run is still being written
  require_tables(db);

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
  db.execute("COMMIT");
  doc["layers"] = layers.names();
  return out;
}

}  // namespace octet::telemetry
