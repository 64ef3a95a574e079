// `octet calibrate`: the configured model (GPT-2 or Llama, dense or mixture of experts, on the device
// train.device says) runs batches of the configured training data forward and backward in BF16, with no
// update, while the operands of every linear layer the precision policy would run in FP8 are measured; the
// result is a calibration (model/calibration.h) whose scales the static recipe reads (fp8.calibration).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "octet/config/run_config.h"
#include "octet/model/calibration.h"

namespace octet {

struct CalibrationOptions {
  int64_t batches = 8;  // micro-batches of the training split, in the order training takes them
  CalibrationStatistic statistic = CalibrationStatistic::amax;
  // Calibrate the weights of this checkpoint (as `octet train --init-from` loads them); empty: the
  // initialisation of train.seed.
  std::filesystem::path init_from;
  std::FILE* out = nullptr;  // progress lines (the device, the model, each batch's loss); null: none
};

// Runs the calibration; throws octet::Error (invalid input) for a configuration, data or checkpoint that
// cannot be used, before anything runs. The precision policy decides the layers as it would in fp8 mode
// with the configuration's [fp8] settings: the layers it keeps out of FP8 are listed as excluded, with its
// reason. Scales follow the delayed recipe's rule, scale = fp8_max / (statistic x 2^fp8.margin), with each
// operand's format (fp8.formats); an operand that saw no non-zero value takes fp8.static_scale.
// Deterministic: the same configuration, data and weights give the same calibration on the same backend.
Calibration run_calibration(const RunConfig& config, const CalibrationOptions& options);

// Where `octet calibrate CONFIG` writes by default: beside the configuration, its name with
// ".calibration.json" for ".toml" (configs/small.toml: configs/small.calibration.json).
std::filesystem::path default_calibration_path(const std::filesystem::path& config_file);

}  // namespace octet
