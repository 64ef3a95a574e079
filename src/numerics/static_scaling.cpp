// Static scaling: scales fixed in advance. The recipe's scale is every tensor's initial scale; a tensor's
// state may hold another one (a per-layer scale from a calibration file, set when the model is built), and
// the state's scale is what every cast of that tensor uses, unchanged from step to step.
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/numerics/scaling.h"

namespace octet {

StaticScaling::StaticScaling(float scale, std::string calibration)
    : scale_(scale), calibration_(std::move(calibration)) {
  OCTET_REQUIRE(is_valid_scale(scale),
                "static scaling: the scale must be a positive finite number with a "
                "finite inverse (about 2.9e-39 to 3.4e38), got {}",
                scale);
}

std::string StaticScaling::describe() const {
  if (!calibration_.empty()) return fmt::format("static (per-layer scales calibrated in {})", calibration_);
  return fmt::format("static (scale {})", scale_);
}

ScalingState StaticScaling::initial_state() const {
  ScalingState s;
  s.scale = scale_;
  s.scale_inv = 1.0f / scale_;
  return s;
}

float StaticScaling::cast_scale(const ScalingState& state, float, Dtype) const {
  return state.scale;
}

void StaticScaling::update(ScalingState& state, float tensor_amax, Dtype) const {
  state.scale_inv = 1.0f / state.scale;
  state.last_amax = tensor_amax;
  state.updates += 1;
  if (!(tensor_amax > 0.0f) || !std::isfinite(tensor_amax)) state.degenerate_amax += 1;
}

}  // namespace octet
