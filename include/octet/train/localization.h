// `octet localize`: which linear layers should run in FP8, chosen by measurement. For every layer the
// precision policy would run in FP8 with the configuration's [fp8] settings it measures, over a fixed set of
// batches of the training split (forward and backward, no update): the numerics of its three casts with
// every layer in FP8, its sensitivity (the layer alone in FP8 against all in BF16, and alone in BF16
// against all in FP8: the relative change of the loss and the cosines of the weight gradients), and its gain
// (layer_gain.h). The chooser (layer_chooser.h) then picks the layers that save the most time within a
// budget of predicted loss change, and the result is a precision map (model/precision_map_file.h) that
// training reads through fp8.precision_map.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "octet/config/run_config.h"
#include "octet/model/model.h"
#include "octet/model/precision_map_file.h"
#include "octet/train/layer_gain.h"

namespace octet {

struct LocalizationOptions {
  int64_t batches = 4;    // micro-batches of the training split, the same for every variant
  double budget = 0.005;  // the allowed predicted relative loss change (0.005: 0.5%)
  // Localize the weights of this checkpoint (as `octet train --init-from` loads them); empty: the
  // initialisation of train.seed.
  std::filesystem::path init_from;
  // Called once on the model that holds the weights every variant starts from, after they are loaded (a
  // test plants a sensitive layer here); null: none.
  std::function<void(Model&)> prepare;
  // The peaks the gain is modelled from where no GPU measures it (bandwidth 0: casts modelled as free).
  GainModel gain_model;
  std::FILE* out = nullptr;  // progress lines; null: none
};

// Runs the localization; throws octet::Error (invalid input) for a configuration, data or checkpoint that
// cannot be used, before anything runs. Every variant runs on a fresh model from the same weights and the
// same batches, so no scaling state carries from one to the next; fp8.recipe = "delayed" is measured with
// the current recipe (the scale of each cast from the tensor itself: a delayed history would start empty in
// every variant). Deterministic on one backend: the same inputs give the same map.
PrecisionMapFile run_localization(const RunConfig& config, const LocalizationOptions& options);

// Where `octet localize CONFIG` writes by default: beside the configuration, ".precision_map.json" for
// ".toml" (configs/small.toml: configs/small.precision_map.json).
std::filesystem::path default_precision_map_path(const std::filesystem::path& config_file);

// The map as a table for the terminal: a line per layer with its choice, loss changes, SQNRs and times.
std::string precision_map_table(const PrecisionMapFile& map);

}  // namespace octet
