// Checkpoint directories (their names, their listing and the one a run continues from), the tokenizer files
// a checkpoint keeps and the training state in memory (see checkpoint.h and docs/checkpoints.md). The
// rest is in checkpoint_state.cpp, checkpoint_save.cpp and checkpoint_load.cpp (checkpoint_internal.h).
#include "octet/train/checkpoint.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "checkpoint_internal.h"
#include "octet/check.h"
#include "octet/dist/communicator.h"
#include "octet/io/tokenizer.h"
#include "octet/train/checkpoint_shards.h"

namespace octet {

namespace fs = std::filesystem;
using checkpoint_detail::holds_shards;
using checkpoint_detail::kModelFile;
using checkpoint_detail::kOptimizerFile;
using checkpoint_detail::kStateFile;
using checkpoint_detail::parse_state;
using checkpoint_detail::to_host;
using checkpoint_detail::whole_moment;

namespace {

// The step of a directory named step_<digits>, or -1.
int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.size() <= 5 || name.rfind("step_", 0) != 0 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
  }
  return std::stoll(name.substr(5));
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

namespace checkpoint_detail {

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

// A checkpoint of shards (checkpoint_shards.h) has a manifest; a whole checkpoint has none.
bool holds_shards(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / kShardManifestFile, ec);
}

}  // namespace checkpoint_detail

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

TrainingState capture_training_state(Model& model, Trainer& trainer) {
  TrainingState state;
  // Every rank together, gathered from the ranks' shards where FP8 weight gathers left masters stale.
  state.params = trainer.master_weights(true);
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

  // Everything is valid: only now change the model and the trainer. Every page of the parameters is mapped
  // first (after a step, FP8 weight gathers leave masters stale and their memory given back).
  trainer.gather_master_weights();
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

}  // namespace octet
