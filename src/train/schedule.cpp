// The loss scaler (see schedule.h).
#include "octet/train/schedule.h"

#include <cmath>

namespace octet {

LossScaler::LossScaler(LossScaleSettings settings)
    : settings_(settings), scale_(settings.dynamic ? settings.initial_scale : 1.0f) {}

float LossScaler::update(bool overflow) {
  if (!settings_.dynamic) return scale_;
  if (overflow) {
    scale_ *= settings_.backoff_factor;
    clean_steps_ = 0;
  } else if (++clean_steps_ >= settings_.growth_interval) {
    scale_ *= settings_.growth_factor;
    clean_steps_ = 0;
  }
  return scale_;
}

void LossScaler::restore(float scale, int64_t clean_steps) {
  scale_ = scale;
  clean_steps_ = clean_steps;
}

}  // namespace octet
