// A whole training run from a RunConfig, as `octet train` performs it: data, model, precision policy, the
// run directory (resolved config, precision map, per-step metrics as JSON lines), progress lines, validation
// losses, and a clean stop on SIGINT or SIGTERM.
#pragma once

#include <cstdio>
#include <functional>
#include <string>

#include "octet/config/run_config.h"

namespace octet {

struct TrainingRunOptions {
  std::FILE* out = stdout;   // progress and reports
  bool interactive = false;  // a terminal: one progress line updated in place
  bool resume = false;       // continue from the latest complete checkpoint of the run directory
  bool handle_signals = true;
};

struct TrainingRunSummary {
  int64_t steps_done = 0;
  float last_loss = 0.0f;
  float last_validation_loss = 0.0f;
  bool interrupted = false;
};

// Validates everything it can (data, shapes, device) before it creates the run directory.
TrainingRunSummary run_training(const RunConfig& config, const TrainingRunOptions& options);

}  // namespace octet
