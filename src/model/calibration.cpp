// The calibration file (calibration.h): its JSON text, written and read back strictly, and the check that a
// calibration fits the model that reads it.
#include "octet/model/calibration.h"

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/input.h"
#include "octet/numerics/scaling.h"
#include "strict_json.h"

namespace octet {
namespace {

using Json = nlohmann::ordered_json;

// root > layers > layer > operands > operand > statistics, and one level to spare.
constexpr int64_t kMaxDepth = 7;

// The shape keys a calibration is compared on: what decides the layers and their sizes.
std::vector<std::pair<std::string, Json>> shape_keys(const ModelConfig& m) {
  return {{"arch", architecture_name(m.arch)},
          {"vocab_size", m.vocab_size},
          {"padded_vocab_size", m.padded_vocab()},
          {"max_seq_len", m.max_seq_len},
          {"layers", m.layers},
          {"heads", m.heads},
          {"kv_heads", m.kv()},
          {"channels", m.channels},
          {"mlp_hidden", m.hidden()},
          {"tied_head", m.tied_head()},
          {"experts", m.experts},
          {"experts_per_token", m.moe() ? m.experts_per_token : 0},
          {"shared_expert", m.moe() && m.shared_expert}};
}

Json statistics_json(const OperandStatistics& s) {
  return Json{{"values", s.values}, {"zeros", s.zeros}, {"non_finite", s.non_finite}, {"amax", s.amax},
              {"p99", s.p99},       {"p99.9", s.p99_9}, {"p99.99", s.p99_99}};
}

// Reading: every refusal names the file and the field.
class Reader : public StrictJsonReader {
 public:
  explicit Reader(std::string_view origin)
      : StrictJsonReader(fmt::format("calibration file {}", origin)) {}
  using StrictJsonReader::number;
  // A float32 that is finite and not negative (a magnitude), or, with `scale`, a usable scale.
  float number(const Json& object, const std::string& where, const char* key, bool scale = false) const {
    const Json& v = member(object, where, key);
    if (!v.is_number()) fail(fmt::format("{}.{} must be a number, got {}", where, key, v.type_name()));
    const double d = v.get<double>();
    const auto f = static_cast<float>(d);
    if (scale && !is_valid_scale(f)) {
      fail(
          fmt::format("{}.{} = {} is not a usable scale: it must be a positive finite float32 with a finite "
                      "inverse (about 2.9e-39 to 3.4e38)",
                      where, key, v.dump()));
    }
    if (!scale && !(std::isfinite(f) && f >= 0.0f)) {
      fail(fmt::format("{}.{} = {} must be a finite magnitude (0 or more, within float32)", where, key,
                       v.dump()));
    }
    return f;
  }

};

CalibratedOperand read_operand(const Reader& r, const Json& operands, const std::string& where,
                               const char* role) {
  const Json& o = r.member(operands, where, role);
  const std::string at = fmt::format("{}.{}", where, role);
  CalibratedOperand c;
  const std::string format = r.text(o, at, "format");
  const std::optional<Dtype> dtype = parse_dtype(format);
  if (!dtype || (*dtype != Dtype::e4m3 && *dtype != Dtype::e5m2)) {
    r.fail(fmt::format("{}.format must be \"e4m3\" or \"e5m2\", got \"{}\"", at, io::printable(format)));
  }
  c.format = *dtype;
  c.scale = r.number(o, at, "scale", true);
  c.fallback = r.boolean(o, at, "fallback");
  const Json& s = r.member(o, at, "statistics");
  const std::string st = at + ".statistics";
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  c.statistics.values = r.integer(s, st, "values", 0, kMaxCount);
  c.statistics.zeros = r.integer(s, st, "zeros", 0, kMaxCount);
  c.statistics.non_finite = r.integer(s, st, "non_finite", 0, kMaxCount);
  c.statistics.amax = r.number(s, st, "amax");
  c.statistics.p99 = r.number(s, st, "p99");
  c.statistics.p99_9 = r.number(s, st, "p99.9");
  c.statistics.p99_99 = r.number(s, st, "p99.99");
  return c;
}

}  // namespace

std::string_view calibration_statistic_name(CalibrationStatistic statistic) {
  switch (statistic) {
    case CalibrationStatistic::amax:
      return "amax";
    case CalibrationStatistic::p99:
      return "p99";
    case CalibrationStatistic::p99_9:
      return "p99.9";
    case CalibrationStatistic::p99_99:
      return "p99.99";
  }
  return "?";
}

std::optional<CalibrationStatistic> parse_calibration_statistic(std::string_view name) {
  for (const CalibrationStatistic s : {CalibrationStatistic::amax, CalibrationStatistic::p99,
                                       CalibrationStatistic::p99_9, CalibrationStatistic::p99_99}) {
    if (calibration_statistic_name(s) == name) return s;
  }
  return std::nullopt;
}

float OperandStatistics::statistic(CalibrationStatistic which) const {
  switch (which) {
    case CalibrationStatistic::amax:
      return amax;
    case CalibrationStatistic::p99:
      return p99;
    case CalibrationStatistic::p99_9:
      return p99_9;
    case CalibrationStatistic::p99_99:
      return p99_99;
  }
  return amax;
}

std::vector<std::pair<std::string, std::string>> model_shape_keys(const ModelConfig& model) {
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& [key, value] : shape_keys(model)) keys.emplace_back(key, value.dump());
  return keys;
}

float calibrated_scale(float statistic, Dtype format, int margin, float fallback, bool* fell_back) {
  bool degenerate = false;
  const float scale =
      scale_from_amax(statistic, dtype_info(format).max_finite, margin, fallback, &degenerate);
  if (fell_back != nullptr) *fell_back = degenerate;
  return scale;
}

std::string calibration_json(const Calibration& c) {
  Json model = Json::object();
  for (auto& [key, value] : shape_keys(c.model)) model[key] = value;
  Json layers = Json::array();
  for (const CalibratedLayer& l : c.layers) {
    Json layer{{"name", l.name}, {"in_features", l.in_features}, {"out_features", l.out_features}};
    if (!l.excluded.empty()) {
      layer["excluded"] = l.excluded;
    } else {
      Json operands = Json::object();
      for (size_t i = 0; i < 3; ++i) {
        const CalibratedOperand& o = l.operands[i];
        operands[std::string(kOperandNames[i])] = Json{{"format", std::string(dtype_name(o.format))},
                                                       {"scale", o.scale},
                                                       {"fallback", o.fallback},
                                                       {"statistics", statistics_json(o.statistics)}};
      }
      layer["operands"] = std::move(operands);
    }
    layers.push_back(std::move(layer));
  }
  const Json root{{"format", std::string(kCalibrationFormat)},
                  {"version", kCalibrationVersion},
                  {"octet_version", c.octet_version},
                  {"data_dir", c.data_dir},
                  {"model_description", c.model_description},
                  {"model", std::move(model)},
                  {"init_from", c.init_from},
                  {"batches", c.batches},
                  {"batch_size", c.batch_size},
                  {"seq_len", c.seq_len},
                  {"statistic", std::string(calibration_statistic_name(c.statistic))},
                  {"margin", c.margin},
                  {"layers", std::move(layers)}};
  return root.dump(2) + "\n";
}

Calibration parse_calibration(std::string_view text, std::string_view origin) {
  const Reader r(origin);
  const Json root = r.parse(text, kMaxDepth, "a calibration file");
  const std::string format = r.text(root, "the file", "format");
  if (format != kCalibrationFormat) {
    r.fail(fmt::format("format is \"{}\", expected \"{}\" (a file that `octet calibrate` wrote)",
                       io::printable(format), kCalibrationFormat));
  }
  const Json& version = r.member(root, "the file", "version");
  if (!version.is_number_integer() || version.get<int64_t>() != kCalibrationVersion) {
    r.fail(fmt::format("version {} is not one this octet reads (version {}); calibrate again with this octet",
                       io::printable(version.dump()), kCalibrationVersion));
  }
  Calibration c;
  c.octet_version = r.text(root, "the file", "octet_version");
  c.data_dir = r.text(root, "the file", "data_dir");
  c.model_description = r.text(root, "the file", "model_description");
  c.init_from = r.text(root, "the file", "init_from");
  c.batches = r.integer(root, "the file", "batches", 1, int64_t{1} << 40);
  c.batch_size = r.integer(root, "the file", "batch_size", 1, int64_t{1} << 40);
  c.seq_len = r.integer(root, "the file", "seq_len", 1, int64_t{1} << 40);
  const std::string statistic = r.text(root, "the file", "statistic");
  const std::optional<CalibrationStatistic> parsed = parse_calibration_statistic(statistic);
  if (!parsed) {
    r.fail(fmt::format("statistic \"{}\" is not one of \"amax\", \"p99\", \"p99.9\", \"p99.99\"",
                       io::printable(statistic)));
  }
  c.statistic = *parsed;
  c.margin = static_cast<int>(r.integer(root, "the file", "margin", 0, 16));

  // The model's shape keys, read into a ModelConfig whose derived sizes give the same values back.
  const Json& model = r.member(root, "the file", "model");
  if (!model.is_object()) r.fail(fmt::format("model must be an object, got {}", model.type_name()));
  const std::string arch = r.text(model, "model", "arch");
  if (arch == "gpt2") {
    c.model.arch = ModelArchitecture::gpt2;
  } else if (arch == "llama") {
    c.model.arch = ModelArchitecture::llama;
  } else {
    r.fail(fmt::format("model.arch must be \"gpt2\" or \"llama\", got \"{}\"", io::printable(arch)));
  }
  constexpr int64_t kMaxSize = int64_t{1} << 31;
  c.model.vocab_size = r.integer(model, "model", "vocab_size", 1, kMaxSize);
  c.model.padded_vocab_size = r.integer(model, "model", "padded_vocab_size", 1, kMaxSize);
  c.model.max_seq_len = r.integer(model, "model", "max_seq_len", 1, kMaxSize);
  c.model.layers = r.integer(model, "model", "layers", 1, kMaxSize);
  c.model.heads = r.integer(model, "model", "heads", 1, kMaxSize);
  c.model.kv_heads = r.integer(model, "model", "kv_heads", 1, kMaxSize);
  c.model.channels = r.integer(model, "model", "channels", 1, kMaxSize);
  c.model.ffn_hidden = r.integer(model, "model", "mlp_hidden", 1, kMaxSize);
  c.model.tie_embeddings = r.boolean(model, "model", "tied_head");
  c.model.experts = r.integer(model, "model", "experts", 0, kMaxSize);
  c.model.experts_per_token = r.integer(model, "model", "experts_per_token", 0, kMaxSize);
  c.model.shared_expert = r.boolean(model, "model", "shared_expert");
  for (const auto& [key, value] : shape_keys(c.model)) c.model_shape.emplace_back(key, model.at(key).dump());

  const Json& layers = r.member(root, "the file", "layers");
  if (!layers.is_array()) r.fail(fmt::format("layers must be an array, got {}", layers.type_name()));
  std::set<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Json& l = layers[i];
    const std::string where = fmt::format("layers[{}]", i);
    CalibratedLayer layer;
    layer.name = r.text(l, where, "name");
    if (!names.insert(layer.name).second) {
      r.fail(fmt::format("{}: layer {} appears twice", where, io::printable(layer.name)));
    }
    const std::string at = fmt::format("layers[{}] ({})", i, io::printable(layer.name));
    layer.in_features = r.integer(l, at, "in_features", 1, kMaxSize);
    layer.out_features = r.integer(l, at, "out_features", 1, kMaxSize);
    if (l.contains("excluded")) {
      layer.excluded = r.text(l, at, "excluded");
      if (layer.excluded.empty()) r.fail(fmt::format("{}.excluded must say why, got \"\"", at));
      if (l.contains("operands")) r.fail(fmt::format("{} is excluded and yet has operands", at));
    } else {
      const Json& operands = r.member(l, at, "operands");
      const std::string ops = at + ".operands";
      for (size_t k = 0; k < 3; ++k) {
        layer.operands[k] = read_operand(r, operands, ops, std::string(kOperandNames[k]).c_str());
      }
    }
    c.layers.push_back(std::move(layer));
  }
  return c;
}

Calibration read_calibration_file(const std::filesystem::path& path) {
  const std::string text = io::read_regular_file(path, "calibration file", kMaxCalibrationBytes);
  return parse_calibration(text, path.string());
}

std::vector<std::optional<std::array<float, 3>>> calibrated_scales(const Calibration& calibration,
                                                                   std::string_view origin,
                                                                   const ModelConfig& model,
                                                                   const std::vector<LinearPlan>& layers,
                                                                   const Fp8Formats& formats) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::invalid_input, fmt::format("calibration file {}: {}", origin, what));
  };
  const std::map<std::string, std::string> theirs(calibration.model_shape.begin(),
                                                  calibration.model_shape.end());
  for (const auto& [key, value] : shape_keys(model)) {
    const auto it = theirs.find(key);
    const std::string there = it == theirs.end() ? std::string("missing") : it->second;
    if (there != value.dump()) {
      fail(
          fmt::format("it was made for another model: model.{} is {} there, {} in this one ({}); calibrate "
                      "this model",
                      key, io::printable(there), value.dump(), model.describe()));
    }
  }
  std::map<std::string_view, const CalibratedLayer*> by_name;
  for (const CalibratedLayer& l : calibration.layers) by_name[l.name] = &l;
  std::set<std::string_view> known;
  for (const LinearPlan& p : layers) known.insert(p.name);
  for (const CalibratedLayer& l : calibration.layers) {
    if (known.count(l.name) == 0) {
      fail(fmt::format("it has a layer {} that this model ({}) does not have", io::printable(l.name),
                       model.describe()));
    }
  }
  const std::array<Dtype, 3> wanted = {formats.activation, formats.weight, formats.gradient};
  std::vector<std::optional<std::array<float, 3>>> scales;
  for (const LinearPlan& p : layers) {
    const auto it = by_name.find(p.name);
    if (it == by_name.end()) fail(fmt::format("the model's layer {} is missing from it", p.name));
    const CalibratedLayer& l = *it->second;
    if (l.in_features != p.in_features || l.out_features != p.out_features) {
      fail(fmt::format("layer {} is [{} -> {}] there, [{} -> {}] in this model", p.name, l.in_features,
                       l.out_features, p.in_features, p.out_features));
    }
    if (!p.fp8()) {
      scales.emplace_back();
      continue;
    }
    if (!l.excluded.empty()) {
      fail(
          fmt::format("layer {} runs in FP8 here but was not calibrated ({}); calibrate with this run's "
                      "[fp8] settings",
                      p.name, io::printable(l.excluded, 120)));
    }
    std::array<float, 3> s{};
    for (size_t k = 0; k < 3; ++k) {
      if (l.operands[k].format != wanted[k]) {
        fail(
            fmt::format("layer {}'s {} scale is for {}, and this run casts it to {} (fp8.formats); "
                        "calibrate with this run's fp8.formats",
                        p.name, kOperandNames[k], dtype_name(l.operands[k].format), dtype_name(wanted[k])));
      }
      s[k] = l.operands[k].scale;
    }
    scales.emplace_back(s);
  }
  return scales;
}

}  // namespace octet
