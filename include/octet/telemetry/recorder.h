// The training run's telemetry: after every optimizer step it queues the step's row; every N steps it reads
// each FP8 layer's scaling state and cast telemetry (from the device, where the backend keeps them there),
// queues one row per FP8 tensor, and checks the alert thresholds; an alert prints one warning line, queues an
// event row and acts as fp8.on_alert says (docs/telemetry.md). It reads the run through source.h only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "octet/telemetry/alerts.h"
#include "octet/telemetry/settings.h"
#include "octet/telemetry/source.h"
#include "octet/telemetry/store.h"

namespace octet {

struct RecorderOptions {
  std::function<void(std::string_view)> log;  // receives each alert line; none when unset
  // Where precision_map.json is rewritten when an alert moves a layer to BF16 (none when empty).
  std::filesystem::path run_directory;
};

class TelemetryRecorder {
 public:
  // Switches the layers' cast telemetry (and SQNR measurement) on as `settings` say. A resumed store's
  // layers in BF16 move to BF16 now (call before the Trainer is made, so that its startup line and precision
  // map say so) and its raised alerts are not raised again. `layers` must outlive the recorder.
  TelemetryRecorder(Fp8LayerSource& layers, TelemetryStore& store, const TelemetrySettings& settings,
                    RecorderOptions options = {});

  // Queues the run table's rows (key, value) and, unless the store has them, one gemms row per GEMM of every
  // linear layer as the policy runs it now (since step 0). A run resumed in another mode (any GEMM's mode
  // differs from the store's rows) writes them again from its first step, with a mode_change event.
  void start(const std::vector<std::pair<std::string, std::string>>& run_info);
  // Whether the step that makes `steps_done` steps records the FP8 tensors: every interval-th, and the last,
  // but not the first (its casts are left out: under delayed scaling they use the initial scale of 1).
  bool is_telemetry_step(int64_t steps_done, int64_t total_steps) const;
  // After each optimizer step: the step row, a skipped step's event, and on telemetry steps the tensors and
  // the alerts (which may move layers to BF16 or ask the run to stop).
  void record_step(const StepStatistics& result, double step_ms, double tokens_per_s, bool telemetry_step);
  void record_validation(int64_t steps_done, float loss);
  void record_event(EventRecord event);
  // The run switched precision mode after `steps_done` steps (a precision schedule), and `layers` now reads
  // the new mode's model: a mode_change event, the GEMM rows from the next step on, the precision map, cast
  // telemetry switched on as at the start, and the layers that alerts moved to BF16 moved again. The new
  // model's casts count from zero; the first step after the switch is left out of the next interval, as
  // the run's first step is.
  void precision_changed(int64_t steps_done, std::string_view from, std::string_view to);

  // A BF16 shadow check of the step that made reading.step steps (docs/localization.md): its rows, and the
  // alerts it raises, acted on as fp8.on_alert says.
  void record_shadow(const ShadowReading& reading);
  // A recalibration in the run measured these operands' scales again (their rows say why): the rows, and
  // one event with `line` (the run's log line) and the number of scales that changed as its value.
  void record_recalibration(int64_t steps_done, const std::vector<RecalibrationRecord>& rows,
                            const std::string& line);
  // An alert with fp8.on_alert = "recalibrate" fired since the last call: why (the first such alert), once;
  // empty when none did.
  std::string take_recalibration_request() { return std::exchange(recalibration_request_, {}); }

  // An alert with fp8.on_alert = "stop" fired: the run should save a checkpoint and end with this message.
  bool stop_requested() const { return !stop_message_.empty(); }
  const std::string& stop_message() const { return stop_message_; }
  // Alerts raised by this run so far.
  int64_t alerts_raised() const { return alerts_raised_; }

 private:
  void record_tensors(int64_t step);
  void act_on(const Alert& alert);
  void move_to_bf16(const std::string& layer, const std::string& reason, int64_t since_step);
  void log(const std::string& line) const;

  Fp8LayerSource& layers_;
  TelemetryStore& store_;
  TelemetrySettings settings_;
  RecorderOptions options_;
  AlertMonitor monitor_;
  std::map<std::string, Fp8LinearTelemetry> previous_;  // totals at the last telemetry step, per layer
  // Per (layer, tensor): the scaling state's amax updates at the last telemetry step (delayed scaling).
  std::map<std::pair<std::string, std::string>, int64_t> amax_updates_;
  // Layers that alerts moved to BF16 (and why), moved again when the run switches to a new model.
  std::map<std::string, std::string> moved_to_bf16_;
  bool after_switch_ = false;  // the step after a switch of precision mode is to come
  std::string stop_message_;
  std::string recalibration_request_;
  int64_t alerts_raised_ = 0;
};

}  // namespace octet
