// Block scaling (DeepSeek-V3 style): one float32 scale per 1x128 tile of activations and gradients and per
// 128x128 block of weights, optionally rounded down to a power of two so that rescaling is exact.
#include <fmt/format.h>

#include "octet/numerics/scaling.h"

namespace octet {

BlockScaling::BlockScaling(bool power_of_two_scales) : power_of_two_(power_of_two_scales) {}

std::string BlockScaling::describe() const {
  return fmt::format("block (1x128 activations and gradients, 128x128 weights{})",
                     power_of_two_ ? ", power-of-two scales" : "");
}

ScaleGranularity BlockScaling::granularity(TensorRole role) const {
  return role == TensorRole::weight ? ScaleGranularity::block_128x128 : ScaleGranularity::tile_1x128;
}

float BlockScaling::block_scale(float block_amax, Dtype format, bool* degenerate) const {
  const float scale = scale_from_amax(block_amax, dtype_info(format).max_finite, 0, 1.0f, degenerate);
  return power_of_two_ ? round_scale_down_to_power_of_two(scale) : scale;
}

}  // namespace octet
