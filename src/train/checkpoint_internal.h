// What the checkpoint sources share, internal to the engine: checkpoint.cpp (the checkpoint directories,
// their listing and the training state in memory), checkpoint_state.cpp (state.json), checkpoint_save.cpp
// (the save, whole or of shards) and checkpoint_load.cpp (the checks before a load and the reading of weights
// and moments). The manifest of a checkpoint of shards and its digests are checkpoint_shards.cpp's
// (checkpoint_shards.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "octet/model/model.h"
#include "octet/train/checkpoint.h"
#include "octet/train/trainer.h"

namespace octet {
namespace checkpoint_detail {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateFile = "state.json";

// ---- checkpoint.cpp ---------------------------------------------------------------------------------------

// `count` floats of backend memory, copied to the host.
std::vector<float> to_host(Backend& backend, const float* source, int64_t count);

std::vector<float> whole_moment(Model& model, Trainer& trainer, const float* moment);

bool holds_shards(const std::filesystem::path& dir);

// ---- state.json (checkpoint_state.cpp) --------------------------------------------------------------------

// Everything state.json holds, parsed and checked before anything is loaded.
struct SavedState {
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  int64_t consecutive_skips = 0;
  std::string octet_version;
  nlohmann::json model;
  MixedPrecision mode{};
  bool dynamic_loss_scale = false;
  float loss_scale = 1.0f;
  int64_t clean_steps = 0;
  std::string recipe;  // empty outside fp8 mode
  std::map<std::string, Fp8LinearState> fp8;
  TrainingProgress progress;
};

nlohmann::json model_json(const Model& model);

// Reads and checks a checkpoint's state.json; throws invalid_input naming the file and what is wrong.
SavedState parse_state(const std::filesystem::path& path);

// state.json's text for the state after trainer.steps_done() steps.
std::string state_text(Model& model, Trainer& trainer, const TrainingProgress& progress);

void require_same_model(const std::filesystem::path& state_path, const SavedState& saved, const Model& model);

}  // namespace checkpoint_detail
}  // namespace octet
