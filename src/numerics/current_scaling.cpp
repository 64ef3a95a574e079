// Current (just-in-time) scaling: the scale comes from the amax of the tensor being cast.
#include <fmt/format.h>

#include "octet/numerics/scaling.h"

namespace octet {

CurrentScaling::CurrentScaling(int margin) : margin_(margin) {}

std::string CurrentScaling::describe() const {
  return fmt::format("current (margin {})", margin_);
}

float CurrentScaling::cast_scale(const ScalingState& state, float tensor_amax, Dtype format) const {
  return scale_from_amax(tensor_amax, dtype_info(format).max_finite, margin_, state.scale, nullptr);
}

void CurrentScaling::update(ScalingState& state, float tensor_amax, Dtype format) const {
  bool degenerate = false;
  state.scale =
      scale_from_amax(tensor_amax, dtype_info(format).max_finite, margin_, state.scale, &degenerate);
  state.scale_inv = 1.0f / state.scale;
  state.last_amax = tensor_amax;
  state.updates += 1;
  if (degenerate) state.degenerate_amax += 1;
}

}  // namespace octet
