// One optimizer step of a GPT: micro-batches with gradient accumulation, loss scaling, a check that the
// loss and every gradient are finite (skipping the step and naming the first non-finite tensor when not),
// clipping by the global gradient norm, AdamW, and the refresh of the GEMMs' weight copies.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "octet/config/train_settings.h"
#include "octet/model/model.h"
#include "octet/telemetry/source.h"
#include "octet/train/optimizer.h"
#include "octet/train/schedule.h"

namespace octet {

// Fills tokens and targets [B, T] (host memory) for the next micro-batch.
using BatchSource = std::function<void(int32_t* tokens, int32_t* targets)>;

// What one optimizer step did: the numbers the run's step table records (telemetry/source.h), as the trainer
// returns them.
using StepResult = StepStatistics;

class Trainer {
 public:
  // Reports the FP8 startup line through settings.log (fp8 mode only) and writes the per-layer precision map
  // to settings.run_directory/precision_map.json when a run directory is set.
  Trainer(Model& model, TrainSettings settings);
  // Runs one optimizer step. Throws octet::Error (ErrorKind::training_failed) after
  // max_consecutive_skips skipped steps in a row.
  StepResult step(const BatchSource& data);
  // Mean loss over `batches` micro-batches, without touching gradients or the optimizer.
  float evaluate(const BatchSource& data, int64_t batches);

  int64_t steps_done() const { return step_; }
  int64_t consecutive_skips() const { return consecutive_skips_; }
  // For resuming from a checkpoint: the optimizer steps done and the skips in a row so far. The optimizer's
  // moments, the loss scaler and the model's FP8 scaling state are restored through their own accessors.
  void restore(int64_t steps_done, int64_t consecutive_skips) {
    step_ = steps_done;
    consecutive_skips_ = consecutive_skips;
  }
  LossScaler& loss_scaler() { return scaler_; }
  AdamW& optimizer() { return optimizer_; }
  const TrainSettings& settings() const { return settings_; }

 private:
  // The first parameter tensor, in backward order, with a non-finite gradient ("" when none): only after the
  // gradients' sum of squares came out non-finite.
  std::string first_non_finite_gradient();
  void write_precision_map();

  Model& model_;
  TrainSettings settings_;
  AdamW optimizer_;
  LossScaler scaler_;
  int64_t step_ = 0;
  int64_t consecutive_skips_ = 0;
};

}  // namespace octet
