// The learning-rate schedule's formula (see train_settings.h).
#include "octet/config/train_settings.h"

#include <cmath>

namespace octet {

float LearningRateSchedule::at(int64_t step) const {
  if (step < warmup_steps) {
    return max_learning_rate * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  const float floor = max_learning_rate * final_fraction;
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 1) return max_learning_rate;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - 1);
  const double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * (progress > 1.0 ? 1.0 : progress)));
  return floor + static_cast<float>(cosine) * (max_learning_rate - floor);
}

}  // namespace octet
