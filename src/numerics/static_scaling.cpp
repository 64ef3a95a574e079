// Static scaling: one scale fixed in advance (for example from a calibration pass over representative data).
#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/numerics/scaling.h"

namespace octet {

StaticScaling::StaticScaling(float scale) : scale_(scale) {
  OCTET_REQUIRE(is_valid_scale(scale),
                "static scaling: the scale must be a positive finite number with a "
                "finite inverse (about 2.9e-39 to 3.4e38), got {}",
                scale);
}

std::string StaticScaling::describe() const {
  return fmt::format("static (scale {})", scale_);
}

ScalingState StaticScaling::initial_state() const {
  ScalingState s;
  s.scale = scale_;
  s.scale_inv = 1.0f / scale_;
  return s;
}

float StaticScaling::cast_scale(const ScalingState&, float, Dtype) const {
  return scale_;
}

void StaticScaling::update(ScalingState& state, float tensor_amax, Dtype) const {
  state.scale = scale_;
  state.scale_inv = 1.0f / scale_;
  state.last_amax = tensor_amax;
  state.updates += 1;
  if (!(tensor_amax > 0.0f) || !std::isfinite(tensor_amax)) state.degenerate_amax += 1;
}

}  // namespace octet
