// Saving and loading checkpoints (see checkpoint.h and docs/checkpoints.md).
#include "octet/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/dist/communicator.h"
#include "octet/io/atomic_file.h"
#include "octet/io/input.h"
#include "octet/io/safetensors.h"
#include "octet/io/tokenizer.h"
#include "octet/train/checkpoint_shards.h"
#include "octet/version.h"

namespace octet {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kFormat = "octet-checkpoint";
constexpr int kFormatVersion = 1;
// state.json is an object of objects a few levels deep, and holds the config and one entry per FP8 layer.
// Larger or deeper text is refused before it is parsed (the JSON library's dump, copy and comparison
// recurse).
constexpr int64_t kMaxStateBytes = int64_t{64} << 20;
constexpr int64_t kMaxStateDepth = 64;

// ---- names and layouts ----------------------------------------------------------------------------------

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---- files ------------------------------------------------------------------------------------------------

void write_file_durably(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OCTET_REQUIRE(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      OCTET_REQUIRE(false, "cannot write {}: {}", path.string(), std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  OCTET_REQUIRE(synced, "cannot flush {} to disk: {}", path.string(), std::strerror(errno));
}

std::vector<float> to_host(Backend& backend, const float* source, int64_t count) {
  std::vector<float> host(static_cast<size_t>(count));
  backend.copy_to_host(host.data(), source, host.size() * sizeof(float));
  return host;
}

// A moment of every parameter: the optimizer's own, or gathered from every rank's shard (a collective:
// every rank of a sharded optimizer calls it).
std::vector<float> whole_moment(Model& model, Trainer& trainer, const float* moment) {
  const AdamW& optimizer = trainer.optimizer();
  if (!optimizer.sharded()) return to_host(model.backend(), moment, model.parameter_count());
  dist::Communicator& ranks = *trainer.parallel().shard_group();
  const dist::ShardRange& shard = optimizer.shard();
  std::vector<float> all(static_cast<size_t>(shard.chunk * ranks.size()), 0.0f);
  float* mine = all.data() + shard.chunk * ranks.rank();
  model.backend().copy_to_host(mine, moment, static_cast<size_t>(shard.size()) * sizeof(float));
  ranks.all_gather(std::span<const float>(mine, static_cast<size_t>(shard.chunk)), std::span<float>(all));
  all.resize(static_cast<size_t>(model.parameter_count()));
  return all;
}

// The step of a directory named step_<digits>, or -1.
int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.size() <= 5 || name.rfind("step_", 0) != 0 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::stoll(name.substr(5));
}

// ---- state.json -------------------------------------------------------------------------------------------

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

// The model's description (Model::model_json) as a JSON object.
json model_json(const Model& model) {
  return json::parse(model.model_json());
}

// Everything state.json holds, parsed and checked before anything is loaded.
struct SavedState {
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  int64_t consecutive_skips = 0;
  std::string octet_version;
  json model;
  MixedPrecision mode{};
  bool dynamic_loss_scale = false;
  float loss_scale = 1.0f;
  int64_t clean_steps = 0;
  std::string recipe;  // empty outside fp8 mode
  std::map<std::string, Fp8LinearState> fp8;
  TrainingProgress progress;
};

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

// A checkpoint of shards (checkpoint_shards.h) has a manifest; a whole checkpoint has none.
bool holds_shards(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kShardManifestFile, ec);
}

// What is missing or wrong in a checkpoint directory's files, found without reading a tensor: a whole
// checkpoint needs model.safetensors, optimizer.safetensors and state.json; a checkpoint of shards a manifest
// that parses and every file it lists, at its recorded size. Empty when nothing is.
std::string checkpoint_files_problem(const fs::path& dir) {
  std::error_code ec;
  if (!holds_shards(dir)) {
    for (const char* name : {kModelFile, kOptimizerFile, kStateFile}) {
      if (!fs::is_regular_file(dir / name, ec)) return fmt::format("{} is missing", name);
    }
    return {};
  }
  if (fs::exists(dir / kOptimizerFile, ec)) {
    return fmt::format("it holds both {} (a whole checkpoint's) and {} (a checkpoint of shards')",
                       kOptimizerFile, kShardManifestFile);
  }
  try {
    const ShardManifest manifest = read_shard_manifest(dir);
    std::string problem = shard_files_problem(dir, manifest);
    if (problem.empty()) {
      const int64_t step = parse_state(dir / kStateFile).step;
      if (step != manifest.step) {
        problem = fmt::format("{} records step {}, {} step {}", kShardManifestFile, manifest.step, kStateFile,
                              step);
      }
    }
    return problem;
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::invalid_input) throw;
    return e.what();
  }
}

}  // namespace

fs::path checkpoint_directory(const fs::path& run_dir, int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step_{:06d}", step);
}

std::vector<fs::path> list_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  const fs::path root = run_dir / "checkpoints";
  if (!fs::is_directory(root, ec)) return {};
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(e.path());
    if (step < 0 || !e.is_directory(ec)) continue;
    bool complete = checkpoint_files_problem(e.path()).empty();
    if (complete) {
      try {
        complete = parse_state(e.path() / kStateFile).step == step;
      } catch (const Error&) {
        complete = false;
      }
    }
    if (complete) found.emplace_back(step, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> result;
  for (auto& f : found) result.push_back(std::move(f.second));
  return result;
}

std::optional<fs::path> latest_checkpoint(const fs::path& run_dir) {
  std::vector<fs::path> all = list_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::optional<fs::path> checkpoint_to_continue(const fs::path& run_dir) {
  const std::optional<fs::path> latest = latest_checkpoint(run_dir);
  const int64_t latest_step = latest ? step_of(*latest) : -1;
  std::error_code ec;
  const fs::path root = run_dir / "checkpoints";
  if (!fs::is_directory(root, ec)) return latest;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(e.path());
    if (step <= latest_step || !e.is_directory(ec)) continue;
    const std::string remedy =
        latest ? fmt::format("remove it, or continue from {} with --resume-from", latest->string())
               : std::string("remove it to start afresh");
    const std::string missing = checkpoint_files_problem(e.path());
    OCTET_REQUIRE(missing.empty(),
                  "checkpoint {} is damaged: {}; it is newer than every complete checkpoint: {}",
                  e.path().string(), missing, remedy);
    try {
      const int64_t saved = parse_state(e.path() / kStateFile).step;
      OCTET_REQUIRE(saved == step, "checkpoint {} is damaged: its state.json holds step {}; {}",
                    e.path().string(), saved, remedy);
    } catch (const Error& problem) {
      if (problem.kind() != ErrorKind::invalid_input) throw;
      throw Error(ErrorKind::invalid_input, fmt::format("checkpoint {} is damaged ({}); {}",
                                                        e.path().string(), problem.what(), remedy));
    }
  }
  return latest;
}

namespace {

fs::path staging_directory(const fs::path& final_dir) {
  return final_dir.parent_path() / (".tmp_" + final_dir.filename().string());
}

// The empty staging directory of a save of `final_dir`, made after removing the leftovers of interrupted
// saves (never complete checkpoints, so safe to remove).
fs::path prepare_staging(const fs::path& final_dir) {
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  fs::create_directories(root, ec);
  OCTET_REQUIRE(!ec, "cannot create {}: {}", root.string(), ec.message());
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp_step_", 0) == 0 || name.rfind(".old_step_", 0) == 0) fs::remove_all(e.path());
  }
  const fs::path temporary = staging_directory(final_dir);
  fs::create_directory(temporary, ec);
  OCTET_REQUIRE(!ec, "cannot create {}: {}", temporary.string(), ec.message());
  return temporary;
}

// The files of the whole model, written into `temporary` by one rank: model.safetensors; the master weights,
// with the moments in optimizer.safetensors when `m` and `v` are given (a whole checkpoint), alone in
// parameters.safetensors otherwise (a checkpoint of shards); the tokenizer files; state.json. Returns the
// names of the files written.
std::vector<std::string> write_whole_files(const fs::path& temporary, Model& model, Trainer& trainer,
                                           const TrainingProgress& progress, const CheckpointOptions& options,
                                           const std::vector<float>* m, const std::vector<float>* v) {
  std::vector<std::string> names;
  auto written = [&](const fs::path& file) {
    names.push_back(file.filename().string());
    if (options.after_file_written) options.after_file_written(file);
  };
  const std::vector<float> params = to_host(model.backend(), model.params(), model.parameter_count());

  std::vector<std::vector<float>> hf_data;
  std::vector<io::SafetensorsEntry> hf;
  for (const ParameterInfo& p : model.parameters()) hf_data.push_back(model.to_hf(p, params));
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const ParameterInfo& p = model.parameters()[i];
    hf.push_back({model.hf_name(p), model.hf_shape(p), hf_data[i]});
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"octet_version", kVersion}, {"config", model_json(model).dump()}};
  io::write_safetensors(temporary / kModelFile, hf, metadata);
  written(temporary / kModelFile);

  std::vector<std::pair<std::string, const std::vector<float>*>> sets = {{"", &params}};
  if (m != nullptr && v != nullptr) sets.insert(sets.end(), {{"m.", m}, {"v.", v}});
  std::vector<io::SafetensorsEntry> exact;
  for (const auto& [prefix, source] : sets) {
    for (const ParameterInfo& p : model.parameters()) {
      exact.push_back({prefix + p.name, p.shape,
                       std::span<const float>(source->data() + p.offset, static_cast<size_t>(p.count))});
    }
  }
  const fs::path exact_path = temporary / (sets.size() > 1 ? kOptimizerFile : kParametersFile);
  io::write_safetensors(exact_path, exact, {{"octet_version", kVersion}});
  written(exact_path);

  if (!progress.tokenizer_dir.empty()) {
    for (const io::TokenizerKind kind : {io::TokenizerKind::gpt2, io::TokenizerKind::llama3}) {
      if (!io::has_vocabulary(kind, progress.tokenizer_dir)) continue;
      io::copy_vocabulary(kind, progress.tokenizer_dir, temporary);
      for (const char* name : io::tokenizer_files(kind)) names.push_back(name);
    }
  }
  write_file_durably(temporary / kStateFile, state_text(model, trainer, progress));
  written(temporary / kStateFile);
  return names;
}

// Puts the staging directory in place of `final_dir` (the rename is the commit; a checkpoint of the same
// step, saved again after a resume, is replaced), then keeps only the newest keep_last complete checkpoints.
void commit_checkpoint(const fs::path& run_dir, const fs::path& temporary, const fs::path& final_dir,
                       int keep_last) {
  io::fsync_directory(temporary);
  const fs::path root = final_dir.parent_path();
  std::error_code ec;
  if (fs::exists(final_dir)) {
    const fs::path old = root / (".old_" + final_dir.filename().string());
    fs::rename(final_dir, old, ec);
    OCTET_REQUIRE(!ec, "cannot move the previous {} aside: {}", final_dir.string(), ec.message());
    fs::rename(temporary, final_dir, ec);
    OCTET_REQUIRE(!ec, "cannot move {} into place: {}", final_dir.string(), ec.message());
    fs::remove_all(old);
  } else {
    fs::rename(temporary, final_dir, ec);
    OCTET_REQUIRE(!ec, "cannot move {} into place: {}", final_dir.string(), ec.message());
  }
  io::fsync_directory(root);

  const std::vector<fs::path> complete = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < complete.size(); ++i) fs::remove_all(complete[i]);
}

// What one rank tells the others about its part of a save of shards: the shard it wrote, or why it could not.
// A fixed-size record, gathered from every rank with all_gather.
struct ShardReport {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t bytes = 0;
  uint64_t digest = 0;
  char failure[1024] = {};  // empty when the rank's part succeeded
};

// Every rank's report. When any rank failed, every rank throws the same error, naming the first that did, so
// that the ranks leave the save together.
std::vector<ShardReport> exchange_reports(dist::Communicator& ranks, const ShardReport& mine) {
  std::vector<ShardReport> all(static_cast<size_t>(ranks.size()));
  ranks.all_gather(std::as_bytes(std::span<const ShardReport>(&mine, 1)),
                   std::as_writable_bytes(std::span<ShardReport>(all)));
  for (int r = 0; r < ranks.size(); ++r) {
    const ShardReport& report = all[static_cast<size_t>(r)];
    if (report.failure[0] != '\0') {
      throw Error(ErrorKind::invalid_input,
                  fmt::format("rank {} of {}: {}", r, ranks.size(),
                              std::string(report.failure, strnlen(report.failure, sizeof(report.failure)))));
    }
  }
  return all;
}

// Runs `part`; a failure becomes the report's message.
template <typename Part>
void attempt(ShardReport& report, Part&& part) {
  if (report.failure[0] != '\0') return;
  try {
    part();
  } catch (const std::exception& e) {
    const std::string what = e.what()[0] != '\0' ? e.what() : "failed";
    std::snprintf(report.failure, sizeof(report.failure), "%s", what.c_str());
  }
}

// A save of shards (checkpoint_shards.h), on every rank of a sharded optimizer. Rank 0 prepares the staging
// directory; every rank writes its shard of the moments there (atomically, flushed) while rank 0 writes the
// whole model's files; the ranks exchange what they wrote; rank 0 writes the manifest last and renames the
// directory into place; every rank returns once it is there, or throws with the others when any part failed.
// With a hybrid layout the shards are a shard group's: the ranks of the first group (ranks 0 .. size - 1,
// topology.h) write them, and the other groups, which hold the same state, take part in the agreement only.
fs::path save_shards(const fs::path& run_dir, const fs::path& final_dir, Model& model, Trainer& trainer,
                     const TrainingProgress& progress, const CheckpointOptions& options) {
  dist::Communicator& ranks = *trainer.parallel().communicator;
  const int rank = trainer.parallel().shard_rank(), size = static_cast<int>(trainer.parallel().shard_ranks());
  const bool writes_shard = ranks.rank() < size;
  const fs::path temporary = staging_directory(final_dir);

  ShardReport prepared;
  if (ranks.rank() == 0) attempt(prepared, [&] { prepare_staging(final_dir); });
  exchange_reports(ranks, prepared);

  ShardReport mine;
  AdamW& optimizer = trainer.optimizer();
  const dist::ShardRange& shard = optimizer.shard();
  mine.begin = shard.begin;
  mine.end = shard.end;
  if (writes_shard)
    attempt(mine, [&] {
      const dist::ShardRange expected = dist::shard_range(model.parameter_count(), rank, size);
      OCTET_CHECK(shard.begin == expected.begin && shard.end == expected.end,
                  "rank {}'s shard [{}, {}) is dist::shard_range's", rank, shard.begin, shard.end);
      // m, then v, of the shard's elements.
      const size_t n = static_cast<size_t>(shard.size());
      std::string bytes(2 * n * sizeof(float), '\0');
      model.backend().copy_to_host(bytes.data(), optimizer.first_moment(), n * sizeof(float));
      model.backend().copy_to_host(bytes.data() + n * sizeof(float), optimizer.second_moment(),
                                   n * sizeof(float));
      const fs::path file = temporary / optimizer_shard_file_name(rank, size);
      io::write_file_atomically(file, bytes);
      mine.bytes = static_cast<int64_t>(bytes.size());
      mine.digest = checkpoint_digest(bytes);
      if (options.after_file_written) options.after_file_written(file);
    });
  std::vector<CheckpointFileRecord> whole;
  if (ranks.rank() == 0) {
    attempt(mine, [&] {
      for (const std::string& name :
           write_whole_files(temporary, model, trainer, progress, options, nullptr, nullptr)) {
        const fs::path path = temporary / name;
        whole.push_back({name, static_cast<int64_t>(fs::file_size(path)), checkpoint_file_digest(path)});
      }
    });
  }
  const std::vector<ShardReport> reports = exchange_reports(ranks, mine);

  ShardReport committed;
  if (ranks.rank() == 0) {
    attempt(committed, [&] {
      ShardManifest manifest;
      manifest.step = trainer.steps_done();
      manifest.ranks = size;
      manifest.parameter_count = model.parameter_count();
      manifest.octet_version = kVersion;
      manifest.files = whole;
      for (int r = 0; r < size; ++r) {
        const ShardReport& report = reports[static_cast<size_t>(r)];
        manifest.optimizer.push_back(
            {r, report.begin, report.end, {optimizer_shard_file_name(r, size), report.bytes, report.digest}});
      }
      // The manifest is the last file of the checkpoint: a directory without it is no checkpoint of shards.
      write_file_durably(temporary / kShardManifestFile, shard_manifest_text(manifest));
      if (options.after_file_written) options.after_file_written(temporary / kShardManifestFile);
      commit_checkpoint(run_dir, temporary, final_dir, options.keep_last);
    });
  }
  exchange_reports(ranks, committed);
  return final_dir;
}

}  // namespace

fs::path save_checkpoint(const fs::path& run_dir, Model& model, Trainer& trainer,
                         const TrainingProgress& progress, const CheckpointOptions& options) {
  OCTET_REQUIRE(options.keep_last >= 1, "checkpoint keep_last must be at least 1, got {}", options.keep_last);
  const fs::path final_dir = checkpoint_directory(run_dir, trainer.steps_done());
  // A sharded optimizer's ranks each write their shard of the moments, under one manifest.
  if (trainer.optimizer().sharded())
    return save_shards(run_dir, final_dir, model, trainer, progress, options);
  // Otherwise every rank holds the same parameters, moments and scaling state: rank 0 writes the one whole
  // checkpoint, the files one rank would write, and the others wait until it is in place.
  dist::Communicator* ranks = trainer.parallel().communicator;
  if (ranks != nullptr && ranks->rank() != 0) {
    ranks->barrier();
    return final_dir;
  }
  const std::vector<float> m = whole_moment(model, trainer, trainer.optimizer().first_moment());
  const std::vector<float> v = whole_moment(model, trainer, trainer.optimizer().second_moment());
  const fs::path temporary = prepare_staging(final_dir);
  write_whole_files(temporary, model, trainer, progress, options, &m, &v);
  commit_checkpoint(run_dir, temporary, final_dir, options.keep_last);
  if (ranks != nullptr) ranks->barrier();
  return final_dir;
}

fs::path training_tokenizer_files(std::string_view tokenizer, const fs::path& data_dir) {
  const std::optional<io::TokenizerKind> kind = io::parse_tokenizer_kind(tokenizer);
  if (!kind.has_value() || io::tokenizer_files(*kind).empty()) return {};
  if (!data_dir.empty() && io::has_vocabulary(*kind, data_dir)) return data_dir;
  const fs::path fallback = io::default_vocabulary_dir(*kind);
  return io::has_vocabulary(*kind, fallback) ? fallback : fs::path();
}

fs::path checkpoint_tokenizer_files(io::TokenizerKind kind, const fs::path& checkpoint_dir,
                                    const fs::path& data_dir) {
  return io::find_vocabulary(kind, {checkpoint_dir, data_dir, io::default_vocabulary_dir(kind)});
}

std::string checkpoint_config(const fs::path& checkpoint_dir) {
  return parse_state(checkpoint_dir / kStateFile).progress.config;
}

int64_t checkpoint_step(const fs::path& checkpoint_dir) {
  return parse_state(checkpoint_dir / kStateFile).step;
}

namespace {

// A file of a checkpoint of shards that a load reads must have the digest its manifest records.
void require_listed_digest(const fs::path& dir, const ShardManifest& manifest, const std::string& name) {
  const auto it = std::find_if(manifest.files.begin(), manifest.files.end(),
                               [&](const CheckpointFileRecord& f) { return f.name == name; });
  OCTET_CHECK(it != manifest.files.end(), "the manifest lists {}", name);
  const uint64_t digest = checkpoint_file_digest(dir / name);
  OCTET_REQUIRE(digest == it->digest,
                "{}: its digest is {:016x}, the manifest {} records {:016x}: the file is damaged",
                (dir / name).string(), digest, kShardManifestFile, it->digest);
}

struct OpenedCheckpoint {
  SavedState state;
  std::optional<ShardManifest> shards;  // a checkpoint of shards' manifest
};

// The checks every load makes before reading weights: the files are there (for a checkpoint of shards: the
// manifest is valid, every file it lists is there at its size, and it describes this model's parameter
// buffer and state.json's step) and state.json describes this model.
OpenedCheckpoint open_checkpoint(const fs::path& dir, const Model& model) {
  OpenedCheckpoint opened;
  std::error_code ec;
  if (!holds_shards(dir)) {
    for (const char* name : {kModelFile, kOptimizerFile, kStateFile}) {
      OCTET_REQUIRE(fs::is_regular_file(dir / name), "checkpoint {} is incomplete: {} is missing",
                    dir.string(), name);
    }
  } else {
    OCTET_REQUIRE(
        !fs::exists(dir / kOptimizerFile, ec),
        "checkpoint {} is inconsistent: it holds both {} (a whole checkpoint's) and {} (a checkpoint "
        "of shards')",
        dir.string(), kOptimizerFile, kShardManifestFile);
    opened.shards = read_shard_manifest(dir);
    const std::string problem = shard_files_problem(dir, *opened.shards);
    OCTET_REQUIRE(problem.empty(), "checkpoint {} is incomplete: {}", dir.string(), problem);
    require_listed_digest(dir, *opened.shards, kStateFile);
  }
  const fs::path state_path = dir / kStateFile;
  opened.state = parse_state(state_path);
  require_same_model(state_path, opened.state, model);
  if (opened.shards) {
    const fs::path manifest_path = dir / kShardManifestFile;
    OCTET_REQUIRE(opened.shards->parameter_count == model.parameter_count(),
                  "{}: the checkpoint's parameter buffer holds {} elements, this model's {}",
                  manifest_path.string(), opened.shards->parameter_count, model.parameter_count());
    OCTET_REQUIRE(opened.shards->step == opened.state.step, "{}: step {}, but {} holds step {}",
                  manifest_path.string(), opened.shards->step, kStateFile, opened.state.step);
  }
  return opened;
}

// One of optimizer.safetensors' float32 sets in octet's layout, the tensor of each parameter named prefix +
// its name: the master weights (prefix "") or an AdamW moment ("m.", "v."). A run never saves a non-finite
// weight or moment (a step that produced one is skipped), nor a negative second moment: such a file was
// damaged or made by hand, and training on it gives NaN.
std::vector<float> read_exact_set(const io::SafetensorsFile& exact, const fs::path& path, const Model& model,
                                  const std::string& prefix) {
  const bool second_moment = prefix == "v.";
  std::vector<float> values(static_cast<size_t>(model.parameter_count()));
  for (const ParameterInfo& p : model.parameters()) {
    const std::string name = prefix + p.name;
    const io::SafetensorsTensor* t = exact.find(name);
    OCTET_REQUIRE(t != nullptr, "{}: tensor '{}' is missing", path.string(), name);
    OCTET_REQUIRE(t->shape == p.shape, "{}: tensor '{}' has shape {}, this model needs {}", path.string(),
                  name, shape_text(t->shape), shape_text(p.shape));
    for (size_t i = 0; i < t->data.size(); ++i) {
      const float x = t->data[i];
      OCTET_REQUIRE(std::isfinite(x) && (!second_moment || x >= 0.0f),
                    "{}: tensor '{}' holds {} at index {}; {} must be finite{}", path.string(), name, x, i,
                    prefix.empty() ? "master weights" : "AdamW moments",
                    second_moment ? " and second moments at least 0" : "");
    }
    std::copy(t->data.begin(), t->data.end(), values.begin() + p.offset);
  }
  return values;
}

}  // namespace

CheckpointLoad load_checkpoint(const fs::path& dir, Model& model, Trainer& trainer) {
  const OpenedCheckpoint opened = open_checkpoint(dir, model);
  const SavedState& saved = opened.state;

  // Master weights and moments: exact, in octet's layout. From a checkpoint of shards, the moments of this
  // trainer's own shard only (every element when its optimizer is not sharded), read from the saved shards
  // that hold them, whatever the number of ranks that saved them.
  TrainingState state;
  const fs::path optimizer_path = dir / (opened.shards ? kParametersFile : kOptimizerFile);
  if (opened.shards) {
    require_listed_digest(dir, *opened.shards, kParametersFile);
    require_listed_digest(dir, *opened.shards, kModelFile);
  }
  const io::SafetensorsFile exact = io::read_safetensors(optimizer_path);
  std::vector<float> params = read_exact_set(exact, optimizer_path, model, "");
  if (opened.shards) {
    const dist::ShardRange& shard = trainer.optimizer().shard();
    MomentRange moments = read_moment_range(dir, *opened.shards, shard.begin, shard.end);
    state.m = std::move(moments.m);
    state.v = std::move(moments.v);
    state.moments_begin = shard.begin;
  } else {
    state.m = read_exact_set(exact, optimizer_path, model, "m.");
    state.v = read_exact_set(exact, optimizer_path, model, "v.");
  }
  // The Hugging Face copy must be valid and agree with the master weights bit for bit.
  const fs::path model_path = dir / kModelFile;
  const io::SafetensorsFile hf = io::read_safetensors(model_path);
  for (const ParameterInfo& p : model.parameters()) {
    const std::string name = model.hf_name(p);
    const io::SafetensorsTensor* t = hf.find(name);
    OCTET_REQUIRE(t != nullptr, "{}: tensor '{}' is missing", model_path.string(), name);
    const std::vector<int64_t> shape = model.hf_shape(p);
    OCTET_REQUIRE(t->shape == shape, "{}: tensor '{}' has shape {}, this model needs {}", model_path.string(),
                  name, shape_text(t->shape), shape_text(shape));
    const std::vector<float> expected = model.to_hf(p, params);
    OCTET_REQUIRE(std::memcmp(expected.data(), t->data.data(), expected.size() * sizeof(float)) == 0,
                  "{}: tensor '{}' differs from the master weights in {}", model_path.string(), name,
                  optimizer_path.string());
  }

  state.params = std::move(params);
  state.step = saved.step;
  state.optimizer_steps = saved.optimizer_steps;
  state.consecutive_skips = saved.consecutive_skips;
  state.mode = saved.mode;
  state.dynamic_loss_scale = saved.dynamic_loss_scale;
  state.loss_scale = saved.loss_scale;
  state.clean_steps = saved.clean_steps;
  state.recipe = saved.recipe;
  state.fp8 = saved.fp8;
  CheckpointLoad result = restore_training_state(state, model, trainer);
  result.progress = saved.progress;
  result.octet_version = saved.octet_version;
  return result;
}

TrainingState capture_training_state(Model& model, Trainer& trainer) {
  TrainingState state;
  state.params = to_host(model.backend(), model.params(), model.parameter_count());
  state.m = whole_moment(model, trainer, trainer.optimizer().first_moment());
  state.v = whole_moment(model, trainer, trainer.optimizer().second_moment());
  state.step = trainer.steps_done();
  state.optimizer_steps = trainer.optimizer().steps();
  state.consecutive_skips = trainer.consecutive_skips();
  state.mode = model.policy().mode();
  state.dynamic_loss_scale = trainer.settings().loss_scale.dynamic;
  state.loss_scale = trainer.loss_scaler().scale();
  state.clean_steps = trainer.loss_scaler().clean_steps();
  for (const LinearPlan& plan : model.policy().layers()) {
    if (const Fp8LinearState* s = model.fp8_state(plan.name)) state.fp8[plan.name] = *s;
  }
  if (model.policy().recipe() != nullptr && !state.fp8.empty())
    state.recipe = model.policy().recipe()->describe();
  return state;
}

CheckpointLoad restore_training_state(const TrainingState& saved, Model& model, Trainer& trainer) {
  const dist::ShardRange& shard = trainer.optimizer().shard();
  OCTET_CHECK(saved.params.size() == static_cast<size_t>(model.parameter_count()) &&
                  saved.m.size() == saved.v.size() && saved.moments_begin >= 0 &&
                  saved.moments_begin <= shard.begin &&
                  shard.end <= saved.moments_begin + static_cast<int64_t>(saved.m.size()),
              "a training state of the model's {} parameters with the moments of elements [{}, {}), got {} "
              "parameters and the moments of [{}, {})",
              model.parameter_count(), shard.begin, shard.end, saved.params.size(), saved.moments_begin,
              saved.moments_begin + static_cast<int64_t>(saved.m.size()));
  const std::vector<float>& params = saved.params;
  const std::vector<float>& m = saved.m;
  const std::vector<float>& v = saved.v;
  // FP8 scaling state: carried over where the layer was FP8 under the same recipe, fresh otherwise.
  CheckpointLoad result;
  struct Fp8Restore {
    Fp8LinearState* live;
    Fp8LinearState state;
    bool carried;  // from the checkpoint, rather than fresh
  };
  std::vector<Fp8Restore> fp8;
  const ScalingRecipe* recipe = model.policy().recipe();
  for (const LinearPlan& plan : model.policy().layers()) {
    Fp8LinearState* live = model.fp8_state(plan.name);
    if (live == nullptr) continue;
    const auto it = saved.fp8.find(plan.name);
    const size_t history = recipe->initial_state().amax_history.size();
    const bool usable = it != saved.fp8.end() && saved.recipe == recipe->describe() &&
                        it->second.activation.amax_history.size() == history &&
                        it->second.weight.amax_history.size() == history &&
                        it->second.gradient.amax_history.size() == history;
    if (usable) {
      fp8.push_back({live, it->second, true});
    } else {
      fp8.push_back({live, model.policy().initial_fp8_state(plan.name), false});
      result.fresh_fp8_layers.push_back(plan.name);
    }
  }
  if (!result.fresh_fp8_layers.empty()) {
    const std::string why =
        saved.mode != MixedPrecision::fp8
            ? fmt::format("checkpoint was trained in {}", mixed_precision_name(saved.mode))
        : saved.recipe != recipe->describe()
            ? fmt::format("checkpoint's recipe was {}, this run's is {}", saved.recipe, recipe->describe())
            : std::string("checkpoint has no FP8 state for them");
    result.notes.push_back(fmt::format("FP8 scaling state starts fresh for {} of {} FP8 layers: {}",
                                       result.fresh_fp8_layers.size(), fp8.size(), why));
  }
  const bool restore_scaler = saved.dynamic_loss_scale == trainer.settings().loss_scale.dynamic;
  if (!restore_scaler) {
    result.notes.push_back(
        fmt::format("loss scale starts fresh: the checkpoint's scaling was {}, this run's is {}",
                    saved.dynamic_loss_scale ? "dynamic" : "static",
                    trainer.settings().loss_scale.dynamic ? "dynamic" : "static"));
  }

  // Everything is valid: only now change the model and the trainer.
  Backend& backend = model.backend();
  const size_t n = params.size();
  backend.copy_from_host(model.params(), params.data(), n * sizeof(float));
  // A sharded optimizer takes its shard of the moments, whatever the number of ranks that saved them.
  const auto shard_bytes = static_cast<size_t>(shard.size()) * sizeof(float);
  const int64_t first = shard.begin - saved.moments_begin;
  backend.copy_from_host(trainer.optimizer().first_moment(), m.data() + first, shard_bytes);
  backend.copy_from_host(trainer.optimizer().second_moment(), v.data() + first, shard_bytes);
  trainer.restore(saved.step, saved.consecutive_skips);
  trainer.optimizer().restore_steps(saved.optimizer_steps);
  if (restore_scaler) trainer.loss_scaler().restore(saved.loss_scale, saved.clean_steps);
  // The weight copies are remade with the scale the saving run's copies were cast with
  // (Fp8LinearState::weight_copy_scale); the cast records an amax, so the saved state is put back afterwards.
  // A fresh layer keeps that first amax, as after init_weights in a new run.
  // A GPU backend keeps the scaling state on the device: every change made here is published to it.
  for (const Fp8Restore& r : fp8) {
    *r.live = r.state;
    if (r.carried) r.live->weight.scale = r.state.weight_copy_scale;
    backend.publish_scaling(*r.live);
  }
  model.refresh_weight_copies();
  for (const Fp8Restore& r : fp8) {
    if (!r.carried) continue;
    *r.live = r.state;
    backend.publish_scaling(*r.live);
  }
  result.step = saved.step;
  result.saved_mode = saved.mode;
  return result;
}

std::map<std::string, std::string> load_checkpoint_weights(const fs::path& dir, Model& model) {
  const OpenedCheckpoint opened = open_checkpoint(dir, model);
  const SavedState& saved = opened.state;
  const fs::path optimizer_path = dir / (opened.shards ? kParametersFile : kOptimizerFile);
  if (opened.shards) require_listed_digest(dir, *opened.shards, kParametersFile);
  const std::vector<float> params =
      read_exact_set(io::read_safetensors(optimizer_path), optimizer_path, model, "");
  model.backend().copy_from_host(model.params(), params.data(), params.size() * sizeof(float));
  model.refresh_weight_copies();
  return saved.progress.imported_from;
}

}  // namespace octet
