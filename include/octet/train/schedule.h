// Dynamic loss scaling. Its settings and the learning-rate schedule are plain settings of the run
// configuration (config/train_settings.h).
#pragma once

#include <cstdint>

#include "octet/config/train_settings.h"

namespace octet {

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
