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
#include <utility>
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

// A BF16 shadow check of one step (docs/localization.md, "Shadow checks"): the loss of the step's first
// micro-batch in FP8 and in BF16 with the same weights, and each FP8 linear layer's weight-gradient cosine
// between the two (nullopt where both gradients are zero).
struct ShadowReading {
  int64_t step = 0;  // steps done
  double fp8_loss = 0.0;
  double bf16_loss = 0.0;
  std::vector<std::pair<std::string, std::optional<double>>> cosines;  // layer, cosine; the model's order
  // |fp8_loss - bf16_loss| / |bf16_loss| (NaN where either loss is not finite).
  double relative_loss_difference() const;
};

struct Alert {
  std::string kind;  // "saturation", "underflow", "scale_jump", "shadow_loss", "shadow_cosine"
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
  // A recalibration in the run (fp8.recalibrate_every, fp8.on_alert = "recalibrate") installed `scale` for
  // this tensor after `step` steps: the reference the next reading's scale is compared with, so that the
  // move the recalibration made on purpose is no scale jump, while a move after it still is one.
  void rebase_scale(const std::string& layer, const std::string& tensor, int64_t step, double scale);
  // The alerts a shadow check raises for the first time: "shadow_cosine" for each layer whose cosine is
  // below shadow_cosine_threshold (or NaN), tensor "weight_gradient"; "shadow_loss" when the relative loss
  // difference exceeds shadow_loss_threshold (or is NaN), naming the layer of the lowest cosine (the one
  // fp8.on_alert = "bf16_layer" moves), tensor "loss". A loss alert is raised once per layer it names.
  std::vector<Alert> observe_shadow(const ShadowReading& reading);

 private:
  bool first_time(const std::string& layer, const std::string& tensor, const std::string& kind);

  TelemetrySettings settings_;
  std::set<std::tuple<std::string, std::string, std::string>> raised_;
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> last_scale_;  // step, scale
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>>
      last_median_;  // step, median amax
};

}  // namespace octet
