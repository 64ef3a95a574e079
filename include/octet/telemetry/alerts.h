// FP8 alerts: which telemetry readings cross the configured thresholds, each raised once per run for a given
// layer, tensor and kind (a resumed run remembers the ones already raised). Pure logic; the recorder
// (recorder.h) prints them, stores them and acts on them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "octet/telemetry/settings.h"

namespace octet {

// One FP8 tensor's reading at a telemetry step.
struct TensorReading {
  int64_t step = 0;
  std::string layer;
  std::string tensor;  // "activation", "weight", "gradient"
  std::optional<double> saturated_fraction;
  std::optional<double> underflow_fraction;
  std::optional<double> scale;  // per-tensor recipes only
  // Delayed scaling: the amax of every cast since the previous reading (as many as the amax history still
  // holds), oldest first. Empty for other recipes.
  std::vector<double> recent_amax;
};

struct Alert {
  std::string kind;  // "saturation", "underflow", "scale_jump"
  int64_t step = 0;
  std::string layer;
  std::string tensor;
  double value = 0.0;  // the fraction, or the factor the median amax or the scale moved by
  double threshold = 0.0;
  std::string what;  // e.g. "97.7% of its values saturated (threshold 1%)"
};

class AlertMonitor {
 public:
  explicit AlertMonitor(const TelemetrySettings& settings) : settings_(settings) {}
  // An alert raised before (by the run this one resumes): not raised again.
  void mark_raised(const std::string& layer, const std::string& tensor, const std::string& kind);
  // The alerts this reading raises for the first time. A scale jump is a lasting move of an activation's or
  // a weight's magnitude, which LayerNorm and weight decay keep steady in healthy training: where the reading
  // has the amax of each cast (recent_amax), the median of those amaxes against the median at the previous
  // reading, so that a spike of a step or two, which moves delayed scaling's scale (it follows the largest
  // amax of its history) but not the median, is not one; without them, the scale against the scale at the
  // previous reading. Gradients raise none: their magnitudes move by orders of magnitude with the loss and
  // the learning rate, and what that costs shows in their saturation and underflow fractions.
  std::vector<Alert> observe(const TensorReading& reading);

 private:
  bool first_time(const std::string& layer, const std::string& tensor, const std::string& kind);

  TelemetrySettings settings_;
  std::set<std::tuple<std::string, std::string, std::string>> raised_;
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> last_scale_;  // step, scale
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>>
      last_median_;  // step, median amax
};

}  // namespace octet
