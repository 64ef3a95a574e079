// What a run measures about its FP8 numerics and what it does when they go wrong: [telemetry] and the alert
// keys of [fp8] in the run configuration (docs/telemetry.md).
#pragma once

#include <cstdint>
#include <string_view>

namespace octet {

// What an FP8 alert does besides printing one warning line and writing an event row.
enum class AlertAction : uint8_t {
  warn,        // nothing more: the layer stays in FP8
  bf16_layer,  // the layer's three GEMMs run in BF16 from the next step on
  stop,        // the run saves a checkpoint and stops (exit code 3)
  recalibrate,  // the static recipe's scales are measured again and installed (docs/localization.md)
};
std::string_view alert_action_name(AlertAction a);

struct TelemetrySettings {
  bool enabled = true;    // write RUN_DIR/telemetry.sqlite
  int64_t interval = 10;  // steps between records of the FP8 tensors (and alert checks)
  bool sqnr = false;      // also measure each cast's signal-to-quantization-noise ratio (costly)
  AlertAction on_alert = AlertAction::warn;
  // An alert fires when, over one telemetry interval, a tensor's
  float alert_saturation = 0.01f;  // saturated fraction (saturated / elements) exceeds this,
  float alert_underflow = 0.10f;   // underflow fraction (underflowed / non-zero inputs) exceeds this,
  float alert_scale_jump = 8.0f;   // or scale moved by more than this factor (0: never).
  // BF16 shadow checks (docs/localization.md): every shadow_every-th fp8 step (0: never) the step's first
  // micro-batch runs again in BF16; an alert fires when the relative loss difference exceeds
  // shadow_loss_threshold or a layer's weight-gradient cosine falls below shadow_cosine_threshold.
  int64_t shadow_every = 0;
  float shadow_loss_threshold = 0.02f;
  float shadow_cosine_threshold = 0.9f;
  // Steps between recalibrations of the static recipe's scales in the run (0: never).
  int64_t recalibrate_every = 0;
};

}  // namespace octet
