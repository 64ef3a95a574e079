// One optimizer step of a GPT: micro-batches with gradient accumulation, loss scaling, a check that the
// loss and every gradient are finite (skipping the step and naming the first non-finite tensor when not),
// clipping by the global gradient norm, AdamW, and the refresh of the GEMMs' weight copies.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "octet/config/train_settings.h"
#include "octet/model/model.h"
#include "octet/train/optimizer.h"
#include "octet/train/schedule.h"

namespace octet {

// Fills tokens and targets [B, T] (host memory) for the next micro-batch.
using BatchSource = std::function<void(int32_t* tokens, int32_t* targets)>;

struct StepResult {
  int64_t step = 0;   // 0-based index of this optimizer step
  float loss = 0.0f;  // mean over the step's micro-batches
  float learning_rate = 0.0f;
  float grad_norm = 0.0f;   // global norm of the unscaled gradient, before clipping
  float loss_scale = 1.0f;  // used by this step
  bool skipped = false;
  std::string skip_reason;  // e.g. "non-finite gradient in h.3.mlp.c_fc.weight"
  int64_t fp8_gemms = 0;    // GEMMs of this step that ran in FP8
  int64_t other_gemms = 0;  // and the others
  int64_t tokens = 0;
};

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
