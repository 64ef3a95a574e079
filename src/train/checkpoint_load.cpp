// Loading checkpoints (see checkpoint.h and docs/checkpoints.md): the checks every load makes before it
// reads a weight, whole checkpoint or checkpoint of shards, and the reading of the master weights and
// moments.
#include "octet/train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "checkpoint_internal.h"
#include "octet/check.h"
#include "octet/dist/communicator.h"
#include "octet/io/safetensors.h"
#include "octet/train/checkpoint_shards.h"

namespace octet {

namespace fs = std::filesystem;
using checkpoint_detail::holds_shards;
using checkpoint_detail::kModelFile;
using checkpoint_detail::kOptimizerFile;
using checkpoint_detail::kStateFile;
using checkpoint_detail::parse_state;
using checkpoint_detail::require_same_model;
using checkpoint_detail::SavedState;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

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
