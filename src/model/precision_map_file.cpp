// The precision map file (precision_map_file.h): its JSON text, written and read back strictly, and what it
// asks of the model that reads it.
#include "octet/model/precision_map_file.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/input.h"
#include "octet/model/calibration.h"
#include "strict_json.h"

namespace octet {
namespace {

using Json = nlohmann::ordered_json;

// root > layers > layer > numerics > operand, and one level to spare.
constexpr int64_t kMaxDepth = 6;
constexpr int64_t kMaxSize = int64_t{1} << 40;

Json optional_number(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? Json(*v) : Json(nullptr);
}

// NaN (a cosine of a zero or non-finite gradient) is written as null.
Json number_or_null(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

Json compared_json(const SensitivityCompared& s) {
  return Json{{"loss_change", number_or_null(s.loss_change)},
              {"layer_gradient_cosine", number_or_null(s.layer_gradient_cosine)},
              {"all_gradient_cosine", number_or_null(s.all_gradient_cosine)}};
}

class Reader : public StrictJsonReader {
 public:
  explicit Reader(std::string_view origin) : StrictJsonReader(fmt::format("precision map {}", origin)) {}
};

SensitivityCompared read_compared(const Reader& r, const Json& layer, const std::string& at,
                                  const char* key) {
  const Json& o = r.member(layer, at, key);
  const std::string where = fmt::format("{}.{}", at, key);
  constexpr double kBig = std::numeric_limits<double>::max();
  SensitivityCompared s;
  s.loss_change = r.number(o, where, "loss_change", -kBig, kBig);
  s.layer_gradient_cosine = r.number(o, where, "layer_gradient_cosine", -1.0, 1.0, true);
  s.all_gradient_cosine = r.number(o, where, "all_gradient_cosine", -1.0, 1.0, true);
  return s;
}


}  // namespace

std::string precision_map_file_json(const PrecisionMapFile& m) {
  Json model = Json::object();
  for (const auto& [key, value] : m.model_shape) model[key] = Json::parse(value);
  Json layers = Json::array();
  for (const LocalizedLayer& l : m.layers) {
    Json layer{{"name", l.name}, {"in_features", l.in_features}, {"out_features", l.out_features}};
    if (!l.excluded.empty()) {
      layer["choice"] = "excluded";
      layer["reason"] = l.excluded;
    } else {
      layer["choice"] = l.fp8 ? "fp8" : "bf16";
      layer["reason"] = l.reason;
      Json numerics = Json::object();
      for (size_t k = 0; k < 3; ++k) {
        const CastNumerics& n = l.numerics[k];
        numerics[std::string(kOperandNames[k])] = Json{{"sqnr_db", optional_number(n.sqnr_db)},
                                                       {"saturated", n.saturated},
                                                       {"underflowed", n.underflowed}};
      }
      layer["numerics"] = std::move(numerics);
      layer["alone_in_fp8"] = compared_json(l.alone_in_fp8);
      layer["alone_in_bf16"] = compared_json(l.alone_in_bf16);
      layer["gain"] = Json{{"bf16_ms", l.bf16_ms},
                           {"fp8_gemm_ms", l.fp8_gemm_ms},
                           {"fp8_cast_ms", l.fp8_cast_ms},
                           {"saving_ms", l.bf16_ms - l.fp8_gemm_ms - l.fp8_cast_ms}};
    }
    layers.push_back(std::move(layer));
  }
  const Json root{{"format", std::string(kPrecisionMapFormat)},
                  {"version", kPrecisionMapVersion},
                  {"octet_version", m.octet_version},
                  {"data_dir", m.data_dir},
                  {"model_description", m.model_description},
                  {"model", std::move(model)},
                  {"init_from", m.init_from},
                  {"batches", m.batches},
                  {"batch_size", m.batch_size},
                  {"seq_len", m.seq_len},
                  {"recipe", m.recipe},
                  {"budget", m.budget},
                  {"predictor", m.predictor},
                  {"gain", m.gain_basis},
                  {"loss_bf16", number_or_null(m.loss_bf16)},
                  {"loss_fp8", number_or_null(m.loss_fp8)},
                  {"loss_chosen", number_or_null(m.loss_chosen)},
                  {"predicted_loss_change", m.predicted_loss_change},
                  {"saving_ms", m.saving_ms},
                  {"layers", std::move(layers)}};
  return root.dump(2) + "\n";
}

PrecisionMapFile parse_precision_map_file(std::string_view text, std::string_view origin) {
  const Reader r(origin);
  const Json root = r.parse(text, kMaxDepth, "a precision map");
  const std::string format = r.text(root, "the file", "format");
  if (format != kPrecisionMapFormat) {
    r.fail(fmt::format("format is \"{}\", expected \"{}\" (a file that `octet localize` wrote)",
                       io::printable(format), kPrecisionMapFormat));
  }
  const Json& version = r.member(root, "the file", "version");
  if (!version.is_number_integer() || version.get<int64_t>() != kPrecisionMapVersion) {
    r.fail(fmt::format("version {} is not one this octet reads (version {}); localize again with this octet",
                       io::printable(version.dump()), kPrecisionMapVersion));
  }
  constexpr double kBig = std::numeric_limits<double>::max();
  PrecisionMapFile m;
  m.octet_version = r.text(root, "the file", "octet_version");
  m.data_dir = r.text(root, "the file", "data_dir");
  m.model_description = r.text(root, "the file", "model_description");
  const Json& model = r.member(root, "the file", "model");
  if (!model.is_object() || model.empty()) r.fail("model must be an object of the model's shape keys");
  for (const auto& [key, value] : model.items()) {
    if (!value.is_primitive() || value.is_null()) {
      r.fail(fmt::format("model.{} must be a number, string or boolean", io::printable(key)));
    }
    m.model_shape.emplace_back(key, value.dump());
  }
  m.init_from = r.text(root, "the file", "init_from");
  m.batches = r.integer(root, "the file", "batches", 1, kMaxSize);
  m.batch_size = r.integer(root, "the file", "batch_size", 1, kMaxSize);
  m.seq_len = r.integer(root, "the file", "seq_len", 1, kMaxSize);
  m.recipe = r.text(root, "the file", "recipe");
  m.budget = r.number(root, "the file", "budget", 0.0, kBig);
  m.predictor = r.text(root, "the file", "predictor");
  m.gain_basis = r.text(root, "the file", "gain");
  m.loss_bf16 = r.number(root, "the file", "loss_bf16", 0.0, kBig, true);
  m.loss_fp8 = r.number(root, "the file", "loss_fp8", 0.0, kBig, true);
  m.loss_chosen = r.number(root, "the file", "loss_chosen", 0.0, kBig, true);
  m.predicted_loss_change = r.number(root, "the file", "predicted_loss_change", -kBig, kBig);
  m.saving_ms = r.number(root, "the file", "saving_ms", -kBig, kBig);

  const Json& layers = r.member(root, "the file", "layers");
  if (!layers.is_array()) r.fail(fmt::format("layers must be an array, got {}", layers.type_name()));
  std::set<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Json& l = layers[i];
    LocalizedLayer layer;
    layer.name = r.text(l, fmt::format("layers[{}]", i), "name");
    if (!names.insert(layer.name).second) {
      r.fail(fmt::format("layers[{}]: layer {} appears twice", i, io::printable(layer.name)));
    }
    const std::string at = fmt::format("layers[{}] ({})", i, io::printable(layer.name));
    layer.in_features = r.integer(l, at, "in_features", 1, kMaxSize);
    layer.out_features = r.integer(l, at, "out_features", 1, kMaxSize);
    const std::string choice = r.text(l, at, "choice");
    const std::string reason = r.text(l, at, "reason");
    if (reason.empty()) r.fail(fmt::format("{}.reason must say why, got \"\"", at));
    if (choice == "excluded") {
      layer.excluded = reason;
      m.layers.push_back(std::move(layer));
      continue;
    }
    if (choice != "fp8" && choice != "bf16") {
      r.fail(fmt::format("{}.choice must be \"fp8\", \"bf16\" or \"excluded\", got \"{}\"", at,
                         io::printable(choice)));
    }
    layer.fp8 = choice == "fp8";
    layer.reason = reason;
    const Json& numerics = r.member(l, at, "numerics");
    for (size_t k = 0; k < 3; ++k) {
      const std::string name(kOperandNames[k]);
      const Json& n = r.member(numerics, at + ".numerics", name.c_str());
      const std::string where = fmt::format("{}.numerics.{}", at, name);
      const double sqnr = r.number(n, where, "sqnr_db", -kBig, kBig, true);
      if (!std::isnan(sqnr)) layer.numerics[k].sqnr_db = sqnr;
      layer.numerics[k].saturated = r.number(n, where, "saturated", 0.0, 1.0);
      layer.numerics[k].underflowed = r.number(n, where, "underflowed", 0.0, 1.0);
    }
    layer.alone_in_fp8 = read_compared(r, l, at, "alone_in_fp8");
    layer.alone_in_bf16 = read_compared(r, l, at, "alone_in_bf16");
    const Json& gain = r.member(l, at, "gain");
    layer.bf16_ms = r.number(gain, at + ".gain", "bf16_ms", 0.0, kBig);
    layer.fp8_gemm_ms = r.number(gain, at + ".gain", "fp8_gemm_ms", 0.0, kBig);
    layer.fp8_cast_ms = r.number(gain, at + ".gain", "fp8_cast_ms", 0.0, kBig);
    r.number(gain, at + ".gain", "saving_ms", -kBig, kBig);
    m.layers.push_back(std::move(layer));
  }
  return m;
}

PrecisionMapFile read_precision_map_file(const std::filesystem::path& path) {
  const std::string text = io::read_regular_file(path, "precision map", kMaxPrecisionMapBytes);
  return parse_precision_map_file(text, path.string());
}

std::vector<std::optional<std::string>> precision_map_moves(const PrecisionMapFile& map,
                                                            std::string_view origin, const ModelConfig& model,
                                                            const std::vector<LinearPlan>& layers) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::invalid_input, fmt::format("precision map {}: {}", origin, what));
  };
  const std::map<std::string, std::string> theirs(map.model_shape.begin(), map.model_shape.end());
  for (const auto& [key, value] : model_shape_keys(model)) {
    const auto it = theirs.find(key);
    const std::string there = it == theirs.end() ? std::string("missing") : it->second;
    if (there != value) {
      fail(
          fmt::format("it was made for another model: model.{} is {} there, {} in this one ({}); localize "
                      "this model",
                      key, io::printable(there), value, model.describe()));
    }
  }
  std::map<std::string_view, const LocalizedLayer*> by_name;
  for (const LocalizedLayer& l : map.layers) by_name[l.name] = &l;
  std::set<std::string_view> known;
  for (const LinearPlan& p : layers) known.insert(p.name);
  for (const LocalizedLayer& l : map.layers) {
    if (known.count(l.name) == 0) {
      fail(fmt::format("it has a layer {} that this model ({}) does not have", io::printable(l.name),
                       model.describe()));
    }
  }
  std::vector<std::optional<std::string>> moves;
  for (const LinearPlan& p : layers) {
    const auto it = by_name.find(p.name);
    if (it == by_name.end()) fail(fmt::format("the model's layer {} is missing from it", p.name));
    const LocalizedLayer& l = *it->second;
    if (l.in_features != p.in_features || l.out_features != p.out_features) {
      fail(fmt::format("layer {} is [{} -> {}] there, [{} -> {}] in this model", p.name, l.in_features,
                       l.out_features, p.in_features, p.out_features));
    }
    if (p.fp8() && !l.excluded.empty()) {
      fail(
          fmt::format("layer {} runs in FP8 here but was not measured when the map was made ({}); localize "
                      "with this run's [fp8] settings",
                      p.name, io::printable(l.excluded, 120)));
    }
    moves.push_back(p.fp8() && l.excluded.empty() && !l.fp8 ? std::optional<std::string>(l.reason)
                                                            : std::nullopt);
  }
  return moves;
}

}  // namespace octet
