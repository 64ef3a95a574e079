// The learning-rate schedule (linear warm-up, then cosine decay to a floor) and dynamic loss scaling.
#pragma once

#include <cstdint>

namespace octet {

struct LearningRateSchedule {
  float max_learning_rate = 6e-4f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float final_fraction = 0.1f;  // the floor, as a fraction of the maximum
  // Learning rate of step `step` (0-based): (step + 1) / warmup * max during warm-up, then
  // floor + (max - floor) * (1 + cos(pi * progress)) / 2 with progress from 0 to 1 over the remaining steps.
  float at(int64_t step) const;
};

struct LossScaleSettings {
  bool dynamic = false;  // true for fp16 mode
  float initial_scale = 65536.0f;
  int64_t growth_interval = 2000;  // clean steps before the scale doubles
  float backoff_factor = 0.5f;     // applied on overflow
  float growth_factor = 2.0f;
};

// On overflow the step is skipped and the scale multiplied by the backoff factor; after growth_interval
// clean steps in a row it grows by the growth factor. A static scaler stays at 1.
class LossScaler {
 public:
  explicit LossScaler(LossScaleSettings settings);
  float scale() const { return scale_; }
  // Reports the outcome of a step; returns the scale for the next one.
  float update(bool overflow);
  int64_t clean_steps() const { return clean_steps_; }
  // For checkpoints.
  void restore(float scale, int64_t clean_steps);

 private:
  LossScaleSettings settings_;
  float scale_;
  int64_t clean_steps_ = 0;
};

}  // namespace octet
