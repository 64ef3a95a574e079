// See database_check.h. Each table is scanned once: one query counts its rows and text, and one finds the
// first row with a value outside its column's rule (the rules below, written as SQL conditions).
#include "database_check.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace octet::telemetry_db {
namespace {

enum class Kind { integer, number, text };

struct ColumnRule {
  const char* name;
  Kind kind;
  bool nullable;
  double min = 0.0;  // integer and number
  double max = 0.0;
  int64_t max_chars = 0;                 // text
  std::vector<const char*> one_of = {};  // text: the only values allowed (empty: any)
};

struct TableRule {
  const char* name;
  int64_t max_rows;
  int64_t max_text_chars;  // all its text columns together
  std::vector<ColumnRule> columns;
  // A table that databases of earlier octet versions lack: checked where present, a reader takes it as empty
  // where absent (table_present).
  bool optional = false;
};

constexpr double kFinite =
    1.7976931348623157e308;  // the largest double: BETWEEN -kFinite AND kFinite excludes Inf
constexpr double kStep = static_cast<double>(kMaxStep);
constexpr double kCount = 9'007'199'254'740'992.0;  // 2^53: exact in JSON and in the page's script
constexpr int64_t kName = 256;
constexpr int64_t kMessage = 65536;
// A cosine computed in float64 can exceed 1 by a few ulps; anything further is not one.
constexpr double kCosine = 1.000001;

ColumnRule step_column(const char* name, bool nullable = false) {
  return {name, Kind::integer, nullable, 0, kStep};
}
ColumnRule count_column(const char* name) {
  return {name, Kind::integer, true, 0, kCount};
}
ColumnRule number_column(const char* name, double min = -kFinite, double max = kFinite) {
  return {name, Kind::number, true, min, max};
}
ColumnRule required_number_column(const char* name, double min = -kFinite, double max = kFinite) {
  return {name, Kind::number, false, min, max};
}
ColumnRule text_column(const char* name, bool nullable, int64_t max_chars) {
  return {name, Kind::text, nullable, 0, 0, max_chars};
}
ColumnRule choice_column(const char* name, std::vector<const char*> values) {
  return {name, Kind::text, false, 0, 0, kName, std::move(values)};
}

const std::vector<TableRule>& rules() {
  static const std::vector<TableRule> tables = {
      {"run",
       1000,
       16 * kMaxTextBytes,
       {text_column("key", false, kName), text_column("value", false, kMaxTextBytes)}},
      {"steps",
       2'000'000,
       64 << 20,
       {step_column("step"),
        number_column("loss"),
        number_column("learning_rate", 0),
        number_column("grad_norm", 0),
        number_column("loss_scale", 0),
        {"skipped", Kind::integer, false, 0, 1},
        text_column("skip_reason", true, kMessage),
        count_column("tokens"),
        number_column("step_ms", 0),
        number_column("tokens_per_s", 0),
        count_column("fp8_gemms"),
        count_column("other_gemms")}},
      {"validation", 1'000'000, 0, {step_column("step"), number_column("loss")}},
      {"tensor_stats",
       10'000'000,
       1 << 30,
       {step_column("step"), text_column("layer", false, kName),
        choice_column("tensor", {"activation", "weight", "gradient"}), number_column("amax", 0),
        number_column("scale", 0), number_column("saturated_fraction", 0, 1),
        number_column("underflow_fraction", 0, 1), number_column("sqnr_db")}},
      {"gemms",
       1'000'000,
       64 << 20,
       {text_column("layer", false, kName),
        choice_column("gemm", {"forward", "input_gradient", "weight_gradient"}),
        choice_column("mode", {"f32", "bf16", "f16", "fp8"}), text_column("reason", true, kMessage),
        step_column("since_step")}},
      {"phases",
       10'000'000,
       256 << 20,
       {step_column("step"), text_column("phase", false, kName), number_column("ms", 0)}},
      {"events",
       1'000'000,
       64 << 20,
       {step_column("step", true), text_column("kind", false, kName), text_column("layer", true, kName),
        text_column("tensor", true, kName), number_column("value"), number_column("threshold"),
        text_column("message", false, kMessage)}},
      {"shadow_loss",
       1'000'000,
       0,
       {step_column("step"), number_column("fp8_loss"), number_column("bf16_loss"),
        number_column("relative_difference", 0)},
       true},
      {"shadow",
       10'000'000,
       1 << 30,
       {step_column("step"), text_column("layer", false, kName), number_column("cosine", -kCosine, kCosine)},
       true},
      {"recalibrations",
       10'000'000,
       1 << 30,
       {step_column("step"), text_column("layer", false, kName),
        choice_column("tensor", {"activation", "weight", "gradient"}),
        required_number_column("scale_before", 0), required_number_column("scale_after", 0),
        number_column("amax", 0), text_column("reason", false, kMessage)},
       true},
      {"localization",
       kMaxLayers,
       64 << 20,
       {text_column("layer", false, kName),
        {"position", Kind::integer, false, 0, kMaxLayers},
        choice_column("choice", {"fp8", "bf16", "excluded"}),
        text_column("reason", false, kMessage),
        number_column("fp8_loss_change"),
        number_column("bf16_loss_change"),
        number_column("fp8_gradient_cosine", -kCosine, kCosine),
        number_column("bf16_gradient_cosine", -kCosine, kCosine),
        number_column("bf16_ms", 0),
        number_column("fp8_ms", 0),
        number_column("activation_sqnr_db"),
        number_column("weight_sqnr_db"),
        number_column("gradient_sqnr_db")},
       true},
  };
  return tables;
}

std::string number(double v) {
  return fmt::format("{:.17g}", v);
}

std::string quoted(const char* column) {
  return fmt::format("\"{}\"", column);
}

// The SQL condition a value of the column must meet.
std::string condition(const ColumnRule& c) {
  const std::string col = quoted(c.name);
  std::string ok;
  switch (c.kind) {
    case Kind::integer:
      ok = fmt::format("typeof({0}) = 'integer' AND {0} BETWEEN {1} AND {2}", col, number(c.min),
                       number(c.max));
      break;
    case Kind::number:
      ok = fmt::format("typeof({0}) IN ('integer', 'real') AND {0} BETWEEN {1} AND {2}", col, number(c.min),
                       number(c.max));
      break;
    case Kind::text:
      ok = fmt::format("typeof({0}) = 'text' AND length({0}) <= {1}", col, c.max_chars);
      if (!c.one_of.empty()) ok += fmt::format(" AND {} IN ('{}')", col, fmt::join(c.one_of, "', '"));
      break;
  }
  return c.nullable ? fmt::format("({} IS NULL OR ({}))", col, ok) : fmt::format("({})", ok);
}

// What the column's rule allows, for the message.
std::string expected(const ColumnRule& c) {
  std::string what;
  switch (c.kind) {
    case Kind::integer:
      what =
          fmt::format("an integer from {} to {}", static_cast<int64_t>(c.min), static_cast<int64_t>(c.max));
      break;
    case Kind::number:
      what = c.min == -kFinite  ? std::string("a finite number")
             : c.max == kFinite ? fmt::format("a finite number >= {}", c.min)
                                : fmt::format("a number from {} to {}", c.min, c.max);
      break;
    case Kind::text:
      what = c.one_of.empty() ? fmt::format("text of at most {} characters", c.max_chars)
                              : fmt::format("one of '{}'", fmt::join(c.one_of, "', '"));
      break;
  }
  return c.nullable ? what + " or NULL" : what;
}

void require_columns(Database& db, const TableRule& table) {
  Statement s(db, "SELECT name FROM pragma_table_info(?1)");
  s.bind(1, std::string_view(table.name));
  std::vector<std::string> present;
  while (s.step()) present.push_back(s.text(0));
  if (present.empty()) db.refuse(fmt::format("it has no table '{}'", table.name));
  for (const ColumnRule& c : table.columns) {
    if (std::find(present.begin(), present.end(), c.name) == present.end())
      db.refuse(fmt::format("table {} has no column '{}'", table.name, c.name));
  }
}

void check_size(Database& db, const TableRule& table) {
  std::string text_chars = "0";
  for (const ColumnRule& c : table.columns) {
    if (c.kind == Kind::text) text_chars += fmt::format(" + COALESCE(SUM(length({})), 0)", quoted(c.name));
  }
  Statement s(db, fmt::format("SELECT COUNT(*), {} FROM {}", text_chars, table.name));
  s.step();
  const int64_t rows = s.integer(0);
  if (rows > table.max_rows)
    db.refuse(
        fmt::format("table {} has {} rows, more than a reader takes ({})", table.name, rows, table.max_rows));
  const int64_t chars = s.integer(1);
  if (chars > table.max_text_chars) {
    db.refuse(fmt::format("table {} holds {} characters of text, more than a reader takes ({})", table.name,
                          chars, table.max_text_chars));
  }
}

void check_values(Database& db, const TableRule& table) {
  std::string cases;
  for (size_t i = 0; i < table.columns.size(); ++i)
    cases += fmt::format(" WHEN NOT {} THEN {}", condition(table.columns[i]), i);
  Statement s(db, fmt::format("SELECT row, bad FROM (SELECT rowid AS row, CASE{} END AS bad FROM {}) "
                              "WHERE bad IS NOT NULL LIMIT 1",
                              cases, table.name));
  if (!s.step()) return;
  const int64_t row = s.integer(0);
  const ColumnRule& c = table.columns.at(static_cast<size_t>(s.integer(1)));
  Statement value(
      db,
      fmt::format(
          "SELECT typeof({0}), CASE typeof({0}) WHEN 'text' THEN substr({0}, 1, 48) "
          "WHEN 'blob' THEN CAST(length({0}) AS TEXT) ELSE CAST({0} AS TEXT) END FROM {1} WHERE rowid = ?1",
          quoted(c.name), table.name));
  value.bind(1, row);
  std::string found = "a value it could not read again";
  if (value.step()) {
    const std::string type = value.text(0);
    std::string shown = value.is_null(1) ? std::string() : value.text(1);
    if (type == "real" && (shown == "Inf" || shown == "-Inf")) shown = shown == "Inf" ? "inf" : "-inf";
    found = describe_value(type, shown);
  }
  db.refuse(fmt::format("table {}, column {}, row {}: expected {}, found {}", table.name, c.name, row,
                        expected(c), found));
}

bool scalar(const nlohmann::json& v) {
  return v.is_string() || v.is_number() || v.is_boolean() || v.is_null();
}

// The precision map is JSON that the report shows layer by layer: an array of objects whose members are
// scalars or, as a calibrated layer's "scales", objects of scalars.
void check_precision_map(Database& db) {
  Statement s(db, "SELECT value FROM run WHERE key = 'precision_map'");
  if (!s.step()) return;
  const nlohmann::json map = nlohmann::json::parse(s.text(0), nullptr, /*allow_exceptions=*/false);
  bool flat = map.is_array();
  for (size_t i = 0; flat && i < map.size(); ++i) {
    flat = map[i].is_object();
    for (auto it = flat ? map[i].begin() : map[i].end(); flat && it != map[i].end(); ++it) {
      flat = scalar(*it) || (it->is_object() && std::all_of(it->begin(), it->end(), scalar));
    }
  }
  if (!flat) {
    db.refuse(
        "table run, key precision_map: expected a JSON array of objects with one entry per layer, as "
        "precision_map.json");
  }
}

void check_layers(Database& db) {
  Statement s(db, "SELECT COUNT(*) FROM (SELECT layer FROM tensor_stats UNION SELECT layer FROM gemms)");
  s.step();
  const int64_t layers = s.integer(0);
  if (layers > kMaxLayers) {
    db.refuse(fmt::format("tables tensor_stats and gemms name {} layers, more than a reader takes ({})",
                          layers, kMaxLayers));
  }
}

}  // namespace

bool table_present(Database& db, std::string_view table) {
  Statement s(db, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1");
  s.bind(1, table);
  return s.step() && s.integer(0) > 0;
}

void check_telemetry_database(Database& db) {
  std::vector<const TableRule*> present;
  for (const TableRule& table : rules()) {
    if (table.optional && !table_present(db, table.name)) continue;
    require_columns(db, table);
    present.push_back(&table);
  }
  for (const TableRule* rule : present) {
    const TableRule& table = *rule;
    check_size(db, table);
    check_values(db, table);
  }
  check_precision_map(db);
  check_layers(db);
}

}  // namespace octet::telemetry_db
