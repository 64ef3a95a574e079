// Delayed scaling: the scale for this step comes from the amax history of earlier steps, so the cast needs
// no pass over the tensor before it starts; the amax it measures joins the history for later steps.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/numerics/scaling.h"

namespace octet {

DelayedScaling::DelayedScaling(int history_length, AmaxAlgorithm algorithm, int margin)
    : history_length_(history_length), algorithm_(algorithm), margin_(margin) {
  OCTET_REQUIRE(history_length >= 1, "delayed scaling: amax history length must be at least 1, got {}",
                history_length);
}

std::string DelayedScaling::describe() const {
  return fmt::format("delayed (history {}, {}, margin {})", history_length_,
                     algorithm_ == AmaxAlgorithm::max ? "max" : "most_recent", margin_);
}

ScalingState DelayedScaling::initial_state() const {
  ScalingState s;
  s.amax_history.assign(static_cast<size_t>(history_length_), 0.0f);
  return s;
}

float DelayedScaling::cast_scale(const ScalingState& state, float, Dtype) const {
  return state.scale;
}

void DelayedScaling::update(ScalingState& state, float tensor_amax, Dtype format) const {
  OCTET_CHECK(state.amax_history.size() == static_cast<size_t>(history_length_),
              "an amax history of length {}, got {}", history_length_, state.amax_history.size());
  state.last_amax = tensor_amax;
  state.updates += 1;
  if (!std::isfinite(tensor_amax)) {
    // An Inf or NaN amax would poison the window for history_length steps: keep it out, keep the scale.
    state.degenerate_amax += 1;
    return;
  }
  std::rotate(state.amax_history.rbegin(), state.amax_history.rbegin() + 1, state.amax_history.rend());
  state.amax_history[0] = tensor_amax;
  const float amax = algorithm_ == AmaxAlgorithm::max
                         ? *std::max_element(state.amax_history.begin(), state.amax_history.end())
                         : state.amax_history[0];
  bool degenerate = false;
  state.scale = scale_from_amax(amax, dtype_info(format).max_finite, margin_, state.scale, &degenerate);
  state.scale_inv = 1.0f / state.scale;
  if (degenerate) state.degenerate_amax += 1;
}

}  // namespace octet
