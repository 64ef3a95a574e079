// A checkpoint's state.json: step counts, the loss scaler, every FP8 layer's scaling state, the data loader
// positions and the resolved config, written as JSON and read back with every value checked (see
// checkpoint_internal.h and docs/checkpoints.md).
#include "checkpoint_internal.h"

#include <cmath>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/input.h"
#include "octet/version.h"

namespace octet {
namespace checkpoint_detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "octet-checkpoint";
constexpr int kFormatVersion = 1;
// state.json is an object of objects a few levels deep, and holds the config and one entry per FP8 layer.
// Larger or deeper text is refused before it is parsed (the JSON library's dump, copy and comparison
// recurse).
constexpr int64_t kMaxStateBytes = int64_t{64} << 20;
constexpr int64_t kMaxStateDepth = 64;

// Floats are JSON numbers, which nlohmann writes as the shortest decimal that reads back as the same double;
// a float widened to double thus comes back bit for bit. Non-finite values, which JSON cannot hold, are
// the strings "nan", "inf" and "-inf".
json float_json(float x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return static_cast<double>(x);
}

float float_from_json(const json& j) {
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "nan") return NAN;
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  OCTET_REQUIRE(j.is_number(), "expected a number, got {}", io::printable(j.dump()));
  return static_cast<float>(j.get<double>());
}

json scaling_json(const ScalingState& s) {
  json history = json::array();
  for (const float a : s.amax_history) history.push_back(float_json(a));
  return {{"scale", float_json(s.scale)},
          {"scale_inv", float_json(s.scale_inv)},
          {"last_amax", float_json(s.last_amax)},
          {"amax_history", history},
          {"updates", s.updates},
          {"degenerate_amax", s.degenerate_amax}};
}

// Values a run can have produced, checked where they are read so that the message names the field.
void require_count(int64_t value, const std::string& field) {
  OCTET_REQUIRE(value >= 0, "{} must be at least 0, got {}", field, value);
}

void require_scale(float value, const std::string& field) {
  OCTET_REQUIRE(value > 0.0f && std::isfinite(value), "{} must be positive and finite, got {}", field, value);
}

ScalingState scaling_from_json(const json& j, const std::string& field) {
  ScalingState s;
  s.scale = float_from_json(j.at("scale"));
  require_scale(s.scale, field + ".scale");
  s.scale_inv = float_from_json(j.at("scale_inv"));
  require_scale(s.scale_inv, field + ".scale_inv");
  // The amax the last cast saw is NaN or Inf after a step that overflowed (update() keeps it out of the
  // history), so only a negative one is impossible.
  s.last_amax = float_from_json(j.at("last_amax"));
  OCTET_REQUIRE(!(s.last_amax < 0.0f), "{}.last_amax must not be negative, got {}", field, s.last_amax);
  const json& history = j.at("amax_history");
  OCTET_REQUIRE(history.is_array(), "{}.amax_history must be an array", field);
  for (size_t i = 0; i < history.size(); ++i) {
    const float a = float_from_json(history[i]);
    OCTET_REQUIRE(a >= 0.0f, "{}.amax_history[{}] must be at least 0 and not NaN, got {}", field, i, a);
    s.amax_history.push_back(a);
  }
  s.updates = j.at("updates").get<int64_t>();
  require_count(s.updates, field + ".updates");
  s.degenerate_amax = j.at("degenerate_amax").get<int64_t>();
  require_count(s.degenerate_amax, field + ".degenerate_amax");
  return s;
}

json position_json(const io::LoaderPosition& p) {
  return {{"epoch", p.epoch}, {"shard_index", p.shard_index}, {"window_index", p.window_index}};
}

io::LoaderPosition position_from_json(const json& j, const std::string& field) {
  const io::LoaderPosition p{j.at("epoch").get<int64_t>(), j.at("shard_index").get<int64_t>(),
                             j.at("window_index").get<int64_t>()};
  require_count(p.epoch, field + ".epoch");
  require_count(p.shard_index, field + ".shard_index");
  require_count(p.window_index, field + ".window_index");
  return p;
}

}  // namespace

// The model's description (Model::model_json) as a JSON object.
json model_json(const Model& model) {
  return json::parse(model.model_json());
}

SavedState parse_state(const fs::path& path) {
  const std::string text = io::read_regular_file(path, "checkpoint state", kMaxStateBytes);
  OCTET_REQUIRE(io::json_nesting_depth(text, kMaxStateDepth) <= kMaxStateDepth,
                "{} is malformed: nested more than {} deep", path.string(), kMaxStateDepth);
  SavedState s;
  try {
    const json j = json::parse(text);
    OCTET_REQUIRE(j.is_object() && j.value("format", "") == kFormat,
                  "{} is not an octet checkpoint state (no \"format\": \"{}\")", path.string(), kFormat);
    const int version = j.at("format_version").get<int>();
    OCTET_REQUIRE(version == kFormatVersion, "{} has format_version {}; this octet reads {}", path.string(),
                  version, kFormatVersion);
    s.step = j.at("step").get<int64_t>();
    require_count(s.step, "step");
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    require_count(s.optimizer_steps, "optimizer_steps");
    s.consecutive_skips = j.at("consecutive_skips").get<int64_t>();
    require_count(s.consecutive_skips, "consecutive_skips");
    s.octet_version = j.at("octet_version").get<std::string>();
    s.model = j.at("model");
    const std::string mode = j.at("mixed_precision").get<std::string>();
    const auto parsed = parse_mixed_precision(mode);
    OCTET_REQUIRE(parsed.has_value(), "unknown mixed_precision '{}'", mode);
    s.mode = *parsed;
    const json& scaler = j.at("loss_scale");
    s.dynamic_loss_scale = scaler.at("dynamic").get<bool>();
    s.loss_scale = float_from_json(scaler.at("scale"));
    require_scale(s.loss_scale, "loss_scale.scale");
    s.clean_steps = scaler.at("clean_steps").get<int64_t>();
    require_count(s.clean_steps, "loss_scale.clean_steps");
    const json& fp8 = j.at("fp8");
    if (!fp8.is_null()) {
      s.recipe = fp8.at("recipe").get<std::string>();
      for (const auto& [layer, state] : fp8.at("layers").items()) {
        const std::string field = "fp8.layers." + io::printable(layer);
        const float weight_copy_scale = float_from_json(state.at("weight_copy_scale"));
        require_scale(weight_copy_scale, field + ".weight_copy_scale");
        s.fp8[layer] = {scaling_from_json(state.at("activation"), field + ".activation"),
                        scaling_from_json(state.at("weight"), field + ".weight"),
                        scaling_from_json(state.at("gradient"), field + ".gradient"), weight_copy_scale};
      }
    }
    const json& data = j.at("data");
    if (data.contains("train"))
      s.progress.train_position = position_from_json(data.at("train"), "data.train");
    if (data.contains("validation"))
      s.progress.validation_position = position_from_json(data.at("validation"), "data.validation");
    s.progress.seed = j.at("seed").get<uint64_t>();
    s.progress.config = j.at("config").get<std::string>();
    if (j.contains("imported_from")) {
      for (const auto& [key, value] : j.at("imported_from").items())
        s.progress.imported_from[key] = value.get<std::string>();
    }
  } catch (const json::exception& e) {
    OCTET_REQUIRE(false, "{} is malformed: {}", path.string(), io::printable(e.what(), 200));
  } catch (const Error& e) {
    if (std::string(e.what()).find(path.string()) != std::string::npos) throw;
    OCTET_REQUIRE(false, "{} is malformed: {}", path.string(), e.what());
  }
  return s;
}

std::string state_text(Model& model, Trainer& trainer, const TrainingProgress& progress) {
  json j;
  j["format"] = kFormat;
  j["format_version"] = kFormatVersion;
  j["octet_version"] = kVersion;
  j["step"] = trainer.steps_done();
  j["optimizer_steps"] = trainer.optimizer().steps();
  j["consecutive_skips"] = trainer.consecutive_skips();
  j["model"] = model_json(model);
  j["mixed_precision"] = std::string(mixed_precision_name(model.policy().mode()));
  j["loss_scale"] = {{"dynamic", trainer.settings().loss_scale.dynamic},
                     {"scale", float_json(trainer.loss_scaler().scale())},
                     {"clean_steps", trainer.loss_scaler().clean_steps()}};
  json layers = json::object();
  for (const LinearPlan& plan : model.policy().layers()) {
    if (const Fp8LinearState* s = model.fp8_state(plan.name)) {
      layers[plan.name] = {{"activation", scaling_json(s->activation)},
                           {"weight", scaling_json(s->weight)},
                           {"gradient", scaling_json(s->gradient)},
                           {"weight_copy_scale", float_json(s->weight_copy_scale)}};
    }
  }
  if (model.policy().recipe() != nullptr && !layers.empty()) {
    j["fp8"] = {{"recipe", model.policy().recipe()->describe()}, {"layers", layers}};
  } else {
    j["fp8"] = nullptr;
  }
  json data = json::object();
  if (progress.train_position) data["train"] = position_json(*progress.train_position);
  if (progress.validation_position) data["validation"] = position_json(*progress.validation_position);
  j["data"] = data;
  j["seed"] = progress.seed;
  j["config"] = progress.config;
  if (!progress.imported_from.empty()) j["imported_from"] = progress.imported_from;
  return j.dump(2) + "\n";
}

// The checkpoint's model description must equal this model's, key by key.
void require_same_model(const fs::path& state_path, const SavedState& saved, const Model& model) {
  const json expected_model = model_json(model);
  for (const auto& [key, value] : expected_model.items()) {
    OCTET_REQUIRE(saved.model.contains(key) && saved.model[key] == value,
                  "{}: the checkpoint's model has {} {}, this model has {}", state_path.string(), key,
                  saved.model.contains(key) ? saved.model[key].dump() : "(none)", value.dump());
  }
}

}  // namespace checkpoint_detail
}  // namespace octet
