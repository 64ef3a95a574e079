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
};

struct Alert {
  std::string kind;  // "saturation", "underflow", "scale_jump"
  int64_t step = 0;
  std::string layer;
  std::string tensor;
  double value = 0.0;  // the fraction, or the factor the scale moved by
  double threshold = 0.0;
  std::string what;  // e.g. "97.7% of its values saturated (threshold 1%)"
};

class AlertMonitor {
 public:
  explicit AlertMonitor(const TelemetrySettings& settings) : settings_(settings) {}
  // An alert raised before (by the run this one resumes): not raised again.
  void mark_raised(const std::string& layer, const std::string& tensor, const std::string& kind);
  // The alerts this reading raises for the first time. The scale is compared with the same tensor's scale at
  // the previous reading.
  std::vector<Alert> observe(const TensorReading& reading);

 private:
  bool first_time(const std::string& layer, const std::string& tensor, const std::string& kind);

  TelemetrySettings settings_;
  std::set<std::tuple<std::string, std::string, std::string>> raised_;
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> last_scale_;  // step, scale
};

}  // namespace octet
