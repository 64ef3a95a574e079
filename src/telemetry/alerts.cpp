// FP8 alert thresholds and their de-duplication (see alerts.h).
#include "octet/telemetry/alerts.h"

#include <algorithm>
#include <cmath>
#include <vector>

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
    case AlertAction::recalibrate:
      return "recalibrate";
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
  const double jump = setting(settings_.alert_scale_jump);
  const auto key = std::make_pair(r.layer, r.tensor);
  if (r.tensor == "gradient") {
    // Gradients' magnitudes follow the loss and the learning rate by orders of magnitude in healthy training
    // (a warm-up, the spikes that clipping absorbs, the decay), and E5M2's range is there for it: a
    // gradient's scale jump says nothing on its own. What it costs shows in the saturation and underflow
    // fractions.
  } else if (!r.recent_amax.empty()) {
    // A zero amax (an all-zero tensor) gives no scale and is passed over.
    std::vector<double> amaxes;
    for (const double amax : r.recent_amax) {
      if (usable_scale(amax)) amaxes.push_back(amax);
    }
    if (amaxes.empty()) return alerts;
    std::sort(amaxes.begin(), amaxes.end());
    const size_t n = amaxes.size();
    const double median = n % 2 == 1 ? amaxes[n / 2] : std::sqrt(amaxes[n / 2 - 1] * amaxes[n / 2]);
    const auto it = last_median_.find(key);
    if (it != last_median_.end() && settings_.alert_scale_jump > 0.0f) {
      const auto [previous_step, previous] = it->second;
      const double factor = std::max(median / previous, previous / median);
      if (above(factor, settings_.alert_scale_jump)) {
        raise(
            "scale_jump", factor, jump,
            fmt::format("its median amax moved by a factor of {:.3g} ({:.4g} over the casts up to step {} -> "
                        "{:.4g} over the {} since; threshold {:.3g})",
                        factor, previous, previous_step, median, n, jump));
      }
    }
    last_median_[key] = {r.step, median};
  } else if (r.scale && usable_scale(*r.scale)) {
    const auto it = last_scale_.find(key);
    if (it != last_scale_.end() && settings_.alert_scale_jump > 0.0f) {
      const auto [previous_step, previous] = it->second;
      const double factor = std::max(*r.scale / previous, previous / *r.scale);
      if (above(factor, settings_.alert_scale_jump)) {
        raise("scale_jump", factor, jump,
              fmt::format(
                  "its scale moved by a factor of {:.3g} ({:.4g} at step {} -> {:.4g}; threshold {:.3g})",
                  factor, previous, previous_step, *r.scale, jump));
      }
    }
    last_scale_[key] = {r.step, *r.scale};
  }
  return alerts;
}

void AlertMonitor::rebase_scale(const std::string& layer, const std::string& tensor, int64_t step,
                                double scale) {
  if (usable_scale(scale)) last_scale_[{layer, tensor}] = {step, scale};
}

double ShadowReading::relative_loss_difference() const {
  if (!std::isfinite(fp8_loss) || !std::isfinite(bf16_loss)) return NAN;
  return std::abs(fp8_loss - bf16_loss) / std::abs(bf16_loss);
}

std::vector<Alert> AlertMonitor::observe_shadow(const ShadowReading& r) {
  std::vector<Alert> alerts;
  // A NaN never passes: a cosine or a loss difference that is not a number crosses its threshold.
  const double cosine_threshold = setting(settings_.shadow_cosine_threshold);
  const std::pair<std::string, std::optional<double>>* lowest = nullptr;
  for (const auto& entry : r.cosines) {
    const auto& [layer, cosine] = entry;
    if (!cosine) continue;
    const bool low = !(static_cast<float>(*cosine) >= settings_.shadow_cosine_threshold);
    if (lowest == nullptr || !(*cosine >= *lowest->second)) lowest = &entry;
    if (low && first_time(layer, "weight_gradient", "shadow_cosine")) {
      alerts.push_back({"shadow_cosine", r.step, layer, "weight_gradient", *cosine, cosine_threshold,
                        fmt::format("its weight gradient in FP8 has a cosine of {:.4g} with the BF16 "
                                    "shadow's (threshold {:.3g})",
                                    *cosine, cosine_threshold)});
    }
  }
  const double difference = r.relative_loss_difference();
  if (!(static_cast<float>(difference) <= settings_.shadow_loss_threshold)) {
    const std::string layer = lowest != nullptr ? lowest->first : std::string("model");
    if (first_time(layer, "loss", "shadow_loss")) {
      const double threshold = setting(settings_.shadow_loss_threshold);
      alerts.push_back(
          {"shadow_loss", r.step, layer, "loss", difference, threshold,
           fmt::format("the loss of the step's first micro-batch is {:.6g} in FP8 and {:.6g} in BF16, a "
                       "relative difference of {} (threshold {}){}",
                       r.fp8_loss, r.bf16_loss, percent(difference), percent(threshold),
                       lowest != nullptr ? fmt::format("; the lowest weight-gradient cosine is this layer's, "
                                                       "{:.4g}",
                                                       *lowest->second)
                                         : std::string())});
    }
  }
  return alerts;
}

}  // namespace octet
