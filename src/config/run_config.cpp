// Loading run configurations (see run_config.h): TOML text and --set overrides applied through the table of
// keys (config_keys.cpp), the checks that span several keys, and the resolved configuration written back as
// TOML.
#include "octet/config/run_config.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "config_key.h"
#include "octet/check.h"
#include "octet/io/input.h"
#include "toml_text_check.h"

namespace octet {

using config_detail::fail;
using config_detail::Key;
using config_detail::keys;
using config_detail::shown;

namespace {

// The most elements one buffer of a run may have (parameters, logits, activations, attention scores): far
// beyond any memory, and small enough that byte counts of several such buffers still fit in int64.
constexpr double kMaxElements = static_cast<double>(int64_t{1} << 56);

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string nearest(std::string_view name, const std::vector<std::string>& candidates) {
  name = name.substr(0, 100);  // no key is longer; keeps a huge unknown name from taking quadratic time
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  return best;
}

const Key* find_key(std::string_view name) {
  for (const Key& k : keys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const Key& k : keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

void unknown_key(const std::string& where, const std::string& name) {
  std::vector<std::string> names;
  for (const Key& k : keys()) names.push_back(k.name);
  fail(fmt::format("{}: unknown key {}; did you mean {}? (docs/config.md lists every key)", where,
                   shown(name), nearest(name, names)));
}

void apply_table(RunConfig& config, const toml::table& root, const std::string& origin) {
  const std::vector<std::string> known_sections = sections();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const std::string where = fmt::format("{}:{}", origin, section_node.source().begin.line);
    const toml::table* table = section_node.as_table();
    if (table == nullptr) {
      fail(
          fmt::format("{}: {} is outside any section; keys belong in sections such as [train] (sections: {})",
                      where, shown(section), fmt::join(known_sections, ", ")));
    }
    if (std::find(known_sections.begin(), known_sections.end(), section) == known_sections.end()) {
      fail(fmt::format("{}: unknown section [{}]; did you mean [{}]? (sections: {})", where, shown(section),
                       nearest(section, known_sections), fmt::join(known_sections, ", ")));
    }
    for (const auto& [key, node] : *table) {
      const std::string name = section + "." + std::string(key.str());
      const std::string at = fmt::format("{}:{}", origin, node.source().begin.line);
      const Key* k = find_key(name);
      if (k == nullptr) unknown_key(at, name);
      k->set(config, node, at);
    }
  }
}

void apply_override(RunConfig& config, const std::string& assignment) {
  const std::string where = fmt::format("--set {}", shown(assignment, 100));
  // TOML would end the value at a line break and read what follows as more keys, or drop it.
  if (assignment.find_first_of("\n\r") != std::string::npos) {
    fail(fmt::format("{}: the value must be one line (it holds a line break)", where));
  }
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    fail(fmt::format("{}: expected section.key=value, e.g. --set train.mixed_precision=fp8", where));
  }
  const std::string name = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  const Key* k = find_key(name);
  if (k == nullptr) unknown_key(where, name);
  // The value in TOML syntax (1e-3, true, ["a"], "text"); a bare word that is not TOML is taken as a string.
  // Non-ASCII outside quotes is no TOML value, and must not reach the parser: a bare word.
  toml::table parsed;
  bool is_toml = check_toml_text("value = " + value, where) == 0;
  if (is_toml) {
    try {
      parsed = toml::parse("value = " + value);
    } catch (const toml::parse_error&) {
      is_toml = false;
    }
  }
  if (!is_toml) parsed = toml::table{{"value", value}};
  k->set(config, *parsed.get("value"), where);
}

// fp8.shadow_every, fp8.recalibrate_every and fp8.on_alert = "recalibrate" (docs/localization.md): refused,
// never ignored, where they cannot act.
void check_shadow_and_recalibration(const RunConfig& c, const std::string& origin) {
  const TelemetrySettings& t = c.telemetry;
  const bool recalibrates = t.recalibrate_every > 0 || t.on_alert == AlertAction::recalibrate;
  if (t.shadow_every == 0 && !recalibrates) return;
  const std::string what =
      t.shadow_every > 0 ? fmt::format("fp8.shadow_every = {}", t.shadow_every)
      : t.recalibrate_every > 0 ? fmt::format("fp8.recalibrate_every = {}", t.recalibrate_every)
                                : std::string("fp8.on_alert = \"recalibrate\"");
  bool any_fp8 = false;
  for (const PrecisionSpan& span : precision_schedule(c)) any_fp8 |= span.mode == MixedPrecision::fp8;
  if (!any_fp8) {
    fail(fmt::format("{}: {} acts on fp8 steps, and this run trains in {} throughout: train in fp8, or leave "
                     "it out",
                     origin, what, mixed_precision_name(c.precision.mode)));
  }
  if (!t.enabled) {
    fail(fmt::format("{}: {} records in RUN_DIR/telemetry.sqlite, and telemetry.enabled = false: enable "
                     "telemetry, or leave it out",
                     origin, what));
  }
  if (recalibrates && c.precision.recipe != RecipeKind::static_scale) {
    fail(fmt::format("{}: {} installs the static recipe's scales, and fp8.recipe is \"{}\" (which chooses "
                     "its scales itself): set fp8.recipe = \"static\", or leave it out",
                     origin,
                     t.recalibrate_every > 0 ? fmt::format("fp8.recalibrate_every = {}", t.recalibrate_every)
                                             : std::string("fp8.on_alert = \"recalibrate\""),
                     recipe_name(c.precision.recipe)));
  }
}

void check_consistency(const RunConfig& c, const std::string& origin) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) fail(fmt::format("{}: {}", origin, message));
  };
  require(c.model.channels % c.model.heads == 0,
          fmt::format("model.channels ({}) must be a multiple of model.heads ({})", c.model.channels,
                      c.model.heads));
  try {
    c.model.validate();
  } catch (const Error& e) {
    fail(fmt::format("{}: {}", origin, e.what()));
  }
  require(c.model.padded_vocab_size == 0 || c.model.padded_vocab_size >= c.model.vocab_size,
          fmt::format("model.padded_vocab_size ({}) must be 0 or at least model.vocab_size ({})",
                      c.model.padded_vocab_size, c.model.vocab_size));
  require(
      c.train.seq_len <= c.model.max_seq_len,
      fmt::format(
          "train.seq_len ({}) is longer than model.max_seq_len ({}): the model has no positions beyond it",
          c.train.seq_len, c.model.max_seq_len));
  require(c.train.schedule.warmup_steps <= c.steps,
          fmt::format("scheduler.warmup_steps ({}) is more than train.steps ({})",
                      c.train.schedule.warmup_steps, c.steps));
  config_detail::check_precision_phases(c, origin);
  require(c.precision.calibration.empty() || c.precision.mode != MixedPrecision::fp8 ||
              c.precision.recipe == RecipeKind::static_scale,
          fmt::format("fp8.calibration gives the static recipe its scales, and fp8.recipe is \"{}\": set "
                      "fp8.recipe = \"static\", or leave fp8.calibration out",
                      recipe_name(c.precision.recipe)));
  require(
      c.distributed.dp_shard != -1 || c.distributed.dp_replicate != -1,
      "distributed.dp_shard and distributed.dp_replicate cannot both be -1: at most one of them takes the "
      "ranks the other leaves");
  require(c.profiling.start_step <= c.profiling.end_step,
          fmt::format("profiling.start_step ({}) is after profiling.end_step ({})", c.profiling.start_step,
                      c.profiling.end_step));
  require(!c.profiling.enabled || c.profiling.end_step <= c.steps,
          fmt::format("profiling.end_step ({}) is beyond train.steps ({}): the run never reaches it",
                      c.profiling.end_step, c.steps));
  require(!c.profiling.enabled || !c.profiling.trace_dir.empty(),
          "profiling.trace_dir is empty: name a directory (\"profile\" puts it in the run directory)");
  require(c.telemetry.alert_scale_jump == 0.0f || c.telemetry.alert_scale_jump > 1.0f,
          fmt::format("fp8.alert_scale_jump ({}) must be 0 (never) or more than 1: a scale always moves by a "
                      "factor of at least 1",
                      c.telemetry.alert_scale_jump));
  check_shadow_and_recalibration(c, origin);
  // Each shape key is bounded; their products must be too (computed in double, which cannot overflow here).
  const double V = static_cast<double>(c.model.padded_vocab()), C = static_cast<double>(c.model.channels),
               L = static_cast<double>(c.model.layers), NH = static_cast<double>(c.model.heads),
               positions = static_cast<double>(c.model.max_seq_len),
               tokens = static_cast<double>(c.train.batch_size) * static_cast<double>(c.train.seq_len),
               T = static_cast<double>(c.train.seq_len);
  const double parameters = V * C + positions * C + L * (12 * C * C + 13 * C) + 2 * C;
  require(parameters <= kMaxElements,
          fmt::format("the model has {:.3g} parameters, more than the 2^56 octet can address; make "
                      "model.vocab_size, model.channels or model.layers smaller",
                      parameters));
  for (const auto& [what, count] :
       {std::pair{"logits (train.batch_size x train.seq_len x the padded vocabulary)", tokens * V},
        std::pair{"activations (train.batch_size x train.seq_len x model.channels x model.layers x 16)",
                  tokens * C * L * 16},
        std::pair{"attention scores (train.batch_size x train.seq_len^2 x model.heads x model.layers)",
                  tokens * T * NH * L}}) {
    require(
        count <= kMaxElements,
        fmt::format("a step needs {:.3g} {}, more than the 2^56 elements octet can address; make the batch, "
                    "the sequence or the model smaller",
                    count, what));
  }
  const int64_t tokenizer_vocab = c.tokenizer == "gpt2" ? 50257 : c.tokenizer == "llama3" ? 128256 : 256;
  require(c.model.vocab_size >= tokenizer_vocab,
          fmt::format("model.vocab_size ({}) is smaller than the {} tokenizer's vocabulary ({})",
                      c.model.vocab_size, c.tokenizer, tokenizer_vocab));
}

// Far more than any configuration needs; a bound on what is read and scanned.
constexpr size_t kMaxConfigBytes = size_t{1} << 20;

void finish(RunConfig& c) {
  // A schedule of phases decides every step's mode; train.mixed_precision says the first.
  if (!c.precision_phases.empty()) c.precision.mode = c.precision_phases.front().mode;
  c.train.schedule.total_steps = c.steps;
  c.train.loss_scale.dynamic = c.precision.mode == MixedPrecision::fp16;
}

}  // namespace

const std::vector<ConfigKeyInfo>& config_keys() {
  static const std::vector<ConfigKeyInfo> info = [] {
    std::vector<ConfigKeyInfo> out;
    const RunConfig defaults;
    for (const Key& k : keys()) out.push_back({k.name, k.type, k.get(defaults), k.valid, k.description});
    return out;
  }();
  return info;
}

RunConfig parse_run_config(std::string_view toml_text, std::string_view origin,
                           const std::vector<std::string>& overrides) {
  if (toml_text.size() > kMaxConfigBytes) {
    fail(fmt::format("{}: {} bytes, more than the {} a configuration may have", origin, toml_text.size(),
                     kMaxConfigBytes));
  }
  const int64_t non_ascii_line = check_toml_text(toml_text, std::string(origin));
  if (non_ascii_line != 0) {
    fail(
        fmt::format("{}:{}: not valid TOML: a non-ASCII character outside a string or comment (keys, numbers "
                    "and booleans are ASCII; put text in quotes)",
                    origin, non_ascii_line));
  }
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    fail(fmt::format("{}:{}:{}: not valid TOML: {}", origin, e.source().begin.line, e.source().begin.column,
                     shown(e.description(), 200)));
  }
  RunConfig config;
  apply_table(config, root, std::string(origin));
  for (const std::string& o : overrides) apply_override(config, o);
  check_consistency(config, std::string(origin));
  finish(config);
  return config;
}

RunConfig load_run_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    fail(fmt::format("config file {} is a directory; CONFIG must be a TOML file (docs/config.md)",
                     shown(file.string(), 200)));
  }
  const std::string text = io::read_regular_file(file, "config file", kMaxConfigBytes);
  return parse_run_config(text, file.string(), overrides);
}

std::string to_toml(const RunConfig& config) {
  std::string out;
  std::string section;
  for (const Key& k : keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (s != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", s);
      section = s;
    }
    out += fmt::format("{} = {}\n", k.name.substr(k.name.find('.') + 1), k.get(config));
  }
  return out;
}

std::filesystem::path profiling_trace_dir(const RunConfig& config) {
  return config.profiling.trace_dir.is_absolute() ? config.profiling.trace_dir
                                                  : config.run_dir / config.profiling.trace_dir;
}

}  // namespace octet
