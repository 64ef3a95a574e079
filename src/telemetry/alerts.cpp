// FP8 alert thresholds and their de-duplication (see alerts.h).
#include "octet/telemetry/alerts.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace octet {

std::string_view alert_action_name(AlertAction a) {
  switch (a) {
    case AlertAction::warn:
      return "warn";
    case AlertAction::bf16_layer:
      return "bf16_layer";
    case AlertAction::stop:
      return "stop";
  }
  return "?";
}

namespace {

std::string percent(double fraction) {
  return fmt::format("{:.3g}%", fraction * 100.0);
}

// A float32 setting as the number it was written as (0.1, not 0.10000000149011612).
double setting(float v) {
  return std::stod(fmt::format("{}", v));
}

bool usable_scale(double s) {
  return std::isfinite(s) && s > 0.0;
}

}  // namespace

void AlertMonitor::mark_raised(const std::string& layer, const std::string& tensor, const std::string& kind) {
  raised_.insert({layer, tensor, kind});
}

bool AlertMonitor::first_time(const std::string& layer, const std::string& tensor, const std::string& kind) {
  return raised_.insert({layer, tensor, kind}).second;
}

std::vector<Alert> AlertMonitor::observe(const TensorReading& r) {
  std::vector<Alert> alerts;
  auto raise = [&](std::string kind, double value, double threshold, std::string what) {
    if (first_time(r.layer, r.tensor, kind))
      alerts.push_back({std::move(kind), r.step, r.layer, r.tensor, value, threshold, std::move(what)});
  };
  // Thresholds are float32 settings: compare in float32, so that a fraction of exactly 0.01 is not above
  // alert_saturation = 0.01.
  auto above = [](double value, float threshold) { return static_cast<float>(value) > threshold; };
  if (r.saturated_fraction && above(*r.saturated_fraction, settings_.alert_saturation)) {
    raise("saturation", *r.saturated_fraction, setting(settings_.alert_saturation),
          fmt::format("{} of its values saturated (threshold {})", percent(*r.saturated_fraction),
                      percent(settings_.alert_saturation)));
  }
  if (r.underflow_fraction && above(*r.underflow_fraction, settings_.alert_underflow)) {
    raise("underflow", *r.underflow_fraction, setting(settings_.alert_underflow),
          fmt::format("{} of its non-zero values underflowed to zero (threshold {})",
                      percent(*r.underflow_fraction), percent(settings_.alert_underflow)));
  }
  if (r.scale && usable_scale(*r.scale)) {
    const auto key = std::make_pair(r.layer, r.tensor);
    const auto it = last_scale_.find(key);
    if (it != last_scale_.end() && settings_.alert_scale_jump > 0.0f) {
      const auto [previous_step, previous] = it->second;
      const double factor = std::max(*r.scale / previous, previous / *r.scale);
      if (above(factor, settings_.alert_scale_jump)) {
        raise("scale_jump", factor, setting(settings_.alert_scale_jump),
              fmt::format(
                  "its scale moved by a factor of {:.3g} ({:.4g} at step {} -> {:.4g}; threshold {:.3g})",
                  factor, previous, previous_step, *r.scale, settings_.alert_scale_jump));
      }
    }
    last_scale_[key] = {r.step, *r.scale};
  }
  return alerts;
}

}  // namespace octet
