// The run's telemetry and FP8 alerts (see recorder.h).
#include "octet/telemetry/recorder.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/io/atomic_file.h"

namespace octet {
namespace {

constexpr const char* kGemmNames[] = {"forward", "input_gradient", "weight_gradient"};

std::optional<double> finite_or_null(double v) {
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

CastTelemetry difference(const CastTelemetry& now, const CastTelemetry& before) {
  CastTelemetry d;
  d.casts = now.casts - before.casts;
  d.elements = now.elements - before.elements;
  d.nonzero = now.nonzero - before.nonzero;
  d.saturated = now.saturated - before.saturated;
  d.underflowed = now.underflowed - before.underflowed;
  d.signal_energy = now.signal_energy - before.signal_energy;
  d.noise_energy = now.noise_energy - before.noise_energy;
  return d;
}

// Whether `layer` has a GEMM in FP8 now.
bool runs_in_fp8(const Fp8LayerSource& layers, std::string_view layer) {
  for (const LinearLayerPrecision& l : layers.linear_layers()) {
    if (l.name == layer) return l.fp8();
  }
  OCTET_CHECK(false, "a linear layer named {}", layer);
  return false;
}

}  // namespace

TelemetryRecorder::TelemetryRecorder(Fp8LayerSource& layers, TelemetryStore& store,
                                     const TelemetrySettings& settings, RecorderOptions options)
    : layers_(layers), store_(store), settings_(settings), options_(std::move(options)), monitor_(settings) {
  OCTET_REQUIRE(settings.interval >= 1, "telemetry.interval must be at least 1, got {}", settings.interval);
  layers_.set_cast_telemetry(true, settings.sqnr);
  const TelemetryResume& resumed = store_.resumed();
  for (const auto& [layer, tensor, kind] : resumed.alerts_raised) monitor_.mark_raised(layer, tensor, kind);
  for (const auto& [layer, reason] : resumed.layers_in_bf16) {
    bool known = false;
    for (const LinearLayerPrecision& plan : layers_.linear_layers())
      known |= plan.name == layer && plan.fp8();
    if (known) layers_.move_layer_to_bf16(layer, reason);
    moved_to_bf16_[layer] = reason;
  }
}

void TelemetryRecorder::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void TelemetryRecorder::start(const std::vector<std::pair<std::string, std::string>>& run_info) {
  for (const auto& [key, value] : run_info) store_.add(RunInfoRecord{key, value, key == "started_at"});
  store_.add(RunInfoRecord{"precision_map", layers_.precision_map_json()});
  // The report colours its heatmaps against the thresholds (docs/dashboard.md).
  store_.add(RunInfoRecord{"alert_saturation", fmt::format("{}", settings_.alert_saturation)});
  store_.add(RunInfoRecord{"alert_underflow", fmt::format("{}", settings_.alert_underflow)});
  store_.add(RunInfoRecord{"alert_scale_jump", fmt::format("{}", settings_.alert_scale_jump)});
  if (settings_.shadow_every > 0) {
    store_.add(RunInfoRecord{"shadow_loss_threshold", fmt::format("{}", settings_.shadow_loss_threshold)});
    store_.add(
        RunInfoRecord{"shadow_cosine_threshold", fmt::format("{}", settings_.shadow_cosine_threshold)});
  }
  const TelemetryResume& resumed = store_.resumed();
  int64_t since = 0;
  if (resumed.has_gemms) {
    // A run resumed in another mode (a bf16 run continued in fp8): a new segment of the run, whose GEMMs are
    // written again from the first step it runs, so that the gemms table's newest rows say how it runs now.
    bool changed = false;
    for (const LinearLayerPrecision& plan : layers_.linear_layers()) {
      const GemmMode modes[] = {plan.forward, plan.input_gradient, plan.weight_gradient};
      for (int g = 0; g < 3; ++g) {
        const auto it = resumed.gemm_modes.find({plan.name, kGemmNames[g]});
        changed |= it == resumed.gemm_modes.end() || it->second != gemm_mode_name(modes[g]);
      }
    }
    if (!changed || !resumed.at) return;
    since = *resumed.at + 1;
    std::string mode = "?";
    for (const auto& [key, value] : run_info) {
      if (key == "mode") mode = value;
    }
    // At the checkpoint's step, as a layer_to_bf16 event is at its alert's: a resume from the same checkpoint
    // keeps it, one from an earlier checkpoint deletes it with the rows it explains.
    store_.add(EventRecord{*resumed.at, "mode_change", std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           fmt::format("mode {} from step {} ({} before): resumed from step {}", mode, since,
                                       resumed.mode.empty() ? "?" : resumed.mode, *resumed.at)});
  }
  for (const LinearLayerPrecision& plan : layers_.linear_layers()) {
    const GemmMode modes[] = {plan.forward, plan.input_gradient, plan.weight_gradient};
    for (int g = 0; g < 3; ++g) {
      store_.add(
          GemmRecord{plan.name, kGemmNames[g], std::string(gemm_mode_name(modes[g])), plan.reason, since});
    }
  }
}

bool TelemetryRecorder::is_telemetry_step(int64_t steps_done, int64_t total_steps) const {
  // Not the first step of a run (see record_step), unless it is the only one.
  if (steps_done == 1) return total_steps == 1;
  return steps_done % settings_.interval == 0 || steps_done == total_steps;
}

void TelemetryRecorder::record_event(EventRecord event) {
  store_.add(std::move(event));
}

void TelemetryRecorder::precision_changed(int64_t steps_done, std::string_view from, std::string_view to) {
  layers_.set_cast_telemetry(true, settings_.sqnr);
  for (const auto& [layer, reason] : moved_to_bf16_) {
    if (runs_in_fp8(layers_, layer)) layers_.move_layer_to_bf16(layer, reason);
  }
  previous_.clear();
  amax_updates_.clear();
  after_switch_ = true;
  // As start() records a run resumed in another mode, so that `octet inspect` reads both alike.
  store_.add(EventRecord{
      steps_done, "mode_change", std::nullopt, std::nullopt, std::nullopt, std::nullopt,
      fmt::format("mode {} from step {} ({} before): precision schedule", to, steps_done + 1, from)});
  for (const LinearLayerPrecision& plan : layers_.linear_layers()) {
    const GemmMode modes[] = {plan.forward, plan.input_gradient, plan.weight_gradient};
    for (int g = 0; g < 3; ++g) {
      store_.add(GemmRecord{plan.name, kGemmNames[g], std::string(gemm_mode_name(modes[g])), plan.reason,
                            steps_done + 1});
    }
  }
  store_.add(RunInfoRecord{"precision_map", layers_.precision_map_json()});
  // A run that started in a mode without FP8 names its recipe once an fp8 phase has one.
  if (const ScalingRecipe* recipe = layers_.scaling_recipe())
    store_.add(RunInfoRecord{"recipe", recipe->describe()});
}

void TelemetryRecorder::record_validation(int64_t steps_done, float loss) {
  store_.add(ValidationRecord{steps_done, loss});
}

void TelemetryRecorder::record_step(const StepStatistics& r, double step_ms, double tokens_per_s,
                                    bool telemetry_step) {
  const int64_t done = r.step + 1;
  StepRecord row;
  row.step = done;
  row.loss = finite_or_null(r.loss);
  row.learning_rate = r.learning_rate;
  row.grad_norm = r.skipped ? std::nullopt : finite_or_null(r.grad_norm);
  row.loss_scale = r.loss_scale;
  row.skipped = r.skipped;
  if (r.skipped) row.skip_reason = r.skip_reason;
  row.tokens = r.tokens;
  row.step_ms = step_ms;
  row.tokens_per_s = tokens_per_s;
  row.fp8_gemms = r.fp8_gemms;
  row.other_gemms = r.other_gemms;
  store_.add(std::move(row));
  if (r.skipped) {
    store_.add(EventRecord{done, "skipped_step", std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                           fmt::format("step {} skipped: {}", done, r.skip_reason)});
  }
  if (telemetry_step) record_tensors(done);
  const bool first_of_model = done == 1 || after_switch_;
  after_switch_ = false;
  if (first_of_model && !telemetry_step) {
    // The first step's casts are left out of the first interval: under delayed scaling they use the initial
    // scale of 1, as no amax is known yet, and would raise alerts that say nothing about the run.
    // For the same reason the first step's amaxes are not among those a scale jump compares.
    for (const LinearLayerPrecision& plan : layers_.linear_layers()) {
      if (const Fp8LinearTelemetry* totals = plan.fp8() ? layers_.cast_telemetry(plan.name) : nullptr)
        previous_[plan.name] = *totals;
      if (const Fp8LinearState* state = plan.fp8() ? layers_.fp8_state(plan.name) : nullptr) {
        amax_updates_[{plan.name, "activation"}] = state->activation.updates;
        amax_updates_[{plan.name, "weight"}] = state->weight.updates;
        amax_updates_[{plan.name, "gradient"}] = state->gradient.updates;
      }
    }
  }
}

void TelemetryRecorder::record_tensors(int64_t step) {
  std::vector<Alert> alerts;
  for (const LinearLayerPrecision& plan : layers_.linear_layers()) {
    if (!plan.fp8()) continue;
    // Both bring the host copies up to date from the device, where a backend keeps them there.
    const Fp8LinearState* state = layers_.fp8_state(plan.name);
    const Fp8LinearTelemetry* totals = layers_.cast_telemetry(plan.name);
    OCTET_CHECK(state != nullptr && totals != nullptr, "scaling state and telemetry of FP8 layer {}",
                plan.name);
    Fp8LinearTelemetry& before = previous_[plan.name];
    const ScalingRecipe* recipe = layers_.scaling_recipe();
    OCTET_CHECK(recipe != nullptr, "the scaling recipe of FP8 layer {}", plan.name);
    struct Operand {
      const char* name;
      TensorRole role;
      const ScalingState& scaling;
      CastTelemetry now;
      CastTelemetry then;
    };
    const Operand operands[] = {
        {"activation", TensorRole::activation, state->activation, totals->activation, before.activation},
        {"weight", TensorRole::weight, state->weight, totals->weight, before.weight},
        {"gradient", TensorRole::gradient, state->gradient, totals->gradient, before.gradient},
    };
    for (const Operand& o : operands) {
      const CastTelemetry d = difference(o.now, o.then);
      TensorRecord row;
      row.step = step;
      row.layer = plan.name;
      row.tensor = o.name;
      if (recipe->granularity(o.role) == ScaleGranularity::per_tensor) {
        row.amax = finite_or_null(o.scaling.last_amax);
        row.scale = finite_or_null(o.scaling.scale);
      }
      if (d.elements > 0)
        row.saturated_fraction = static_cast<double>(d.saturated) / static_cast<double>(d.elements);
      if (d.nonzero > 0)
        row.underflow_fraction = static_cast<double>(d.underflowed) / static_cast<double>(d.nonzero);
      if (settings_.sqnr && d.signal_energy > 0.0 && d.noise_energy > 0.0)
        row.sqnr_db = 10.0 * std::log10(d.signal_energy / d.noise_energy);
      TensorReading reading{step,      plan.name, o.name, row.saturated_fraction, row.underflow_fraction,
                            row.scale, {}};
      if (!o.scaling.amax_history.empty()) {
        // The history holds the newest amax first; the reading wants those of the casts since the previous
        // reading, oldest first.
        const auto key = std::make_pair(plan.name, std::string(o.name));
        const auto seen = amax_updates_.find(key);
        const int64_t fresh = o.scaling.updates - (seen != amax_updates_.end() ? seen->second : 0);
        const size_t take =
            std::min(o.scaling.amax_history.size(), static_cast<size_t>(std::max<int64_t>(fresh, 0)));
        for (size_t i = take; i-- > 0;) reading.recent_amax.push_back(o.scaling.amax_history[i]);
        amax_updates_[key] = o.scaling.updates;
      }
      for (Alert& a : monitor_.observe(reading)) alerts.push_back(std::move(a));
      store_.add(std::move(row));
    }
    before = *totals;
  }
  for (const Alert& a : alerts) act_on(a);
}

void TelemetryRecorder::act_on(const Alert& a) {
  ++alerts_raised_;
  const std::string action_key = fmt::format("fp8.on_alert = \"{}\"", alert_action_name(settings_.on_alert));
  std::string consequence;
  switch (settings_.on_alert) {
    case AlertAction::warn:
      consequence = fmt::format("training goes on in FP8 ({}); not repeated for this tensor", action_key);
      break;
    case AlertAction::bf16_layer: {
      const bool still_fp8 = runs_in_fp8(layers_, a.layer);
      consequence = still_fp8
                        ? fmt::format("{} runs in BF16 from step {} ({})", a.layer, a.step + 1, action_key)
                        : fmt::format("{} already moves to BF16 from step {}", a.layer, a.step + 1);
      break;
    }
    case AlertAction::stop:
      consequence = fmt::format("the run stops after a checkpoint ({})", action_key);
      break;
    case AlertAction::recalibrate:
      consequence = fmt::format("the FP8 scales are measured again on this step's batch ({})", action_key);
      break;
  }
  const std::string line = fmt::format("warning: FP8 {} alert at step {}: {} {}: {}; {}", a.kind, a.step,
                                       a.layer, a.tensor, a.what, consequence);
  log(line);
  store_.add(EventRecord{a.step, a.kind, a.layer, a.tensor, a.value, a.threshold, line});
  if (settings_.on_alert == AlertAction::bf16_layer && runs_in_fp8(layers_, a.layer)) {
    move_to_bf16(a.layer,
                 fmt::format("BF16 from step {} after an FP8 {} alert at step {} ({} {})", a.step + 1, a.kind,
                             a.step, a.tensor,
                             a.kind == "scale_jump"      ? fmt::format("factor {:.3g}", a.value)
                             : a.kind == "shadow_cosine" ? fmt::format("cosine {:.4g}", a.value)
                                                         : fmt::format("{:.3g}%", a.value * 100)),
                 a.step + 1);
  } else if (settings_.on_alert == AlertAction::recalibrate && recalibration_request_.empty()) {
    recalibration_request_ =
        fmt::format("FP8 {} alert at step {} ({} {})", a.kind, a.step, a.layer, a.tensor);
  } else if (settings_.on_alert == AlertAction::stop && stop_message_.empty()) {
    stop_message_ = fmt::format(
        "training stopped at step {} by an FP8 {} alert: {} {}: {} (fp8.on_alert = \"stop\"). Run `octet "
        "inspect` on the run directory; docs/troubleshooting.md says what to change",
        a.step, a.kind, a.layer, a.tensor, a.what);
    store_.add(EventRecord{a.step, "stop", a.layer, a.tensor, a.value, a.threshold, stop_message_});
  }
}

void TelemetryRecorder::record_shadow(const ShadowReading& r) {
  store_.add(ShadowLossRecord{r.step, finite_or_null(r.fp8_loss), finite_or_null(r.bf16_loss),
                              finite_or_null(r.relative_loss_difference())});
  for (const auto& [layer, cosine] : r.cosines)
    store_.add(ShadowLayerRecord{r.step, layer, cosine ? finite_or_null(*cosine) : std::nullopt});
  for (const Alert& a : monitor_.observe_shadow(r)) act_on(a);
}

void TelemetryRecorder::record_recalibration(int64_t steps_done, const std::vector<RecalibrationRecord>& rows,
                                             const std::string& line) {
  int64_t changed = 0;
  for (const RecalibrationRecord& row : rows) {
    changed += row.scale_after != row.scale_before ? 1 : 0;
    // The new scale is the one later readings are compared with: the recalibration's own move is no jump.
    monitor_.rebase_scale(row.layer, row.tensor, steps_done, row.scale_after);
    store_.add(row);
  }
  store_.add(EventRecord{steps_done, "recalibration", std::nullopt, std::nullopt,
                         static_cast<double>(changed), std::nullopt, line});
}

void TelemetryRecorder::move_to_bf16(const std::string& layer, const std::string& reason,
                                     int64_t since_step) {
  layers_.move_layer_to_bf16(layer, reason);
  moved_to_bf16_[layer] = reason;
  for (const char* gemm : kGemmNames) store_.add(GemmRecord{layer, gemm, "bf16", reason, since_step});
  store_.add(EventRecord{since_step - 1, "layer_to_bf16", layer, std::nullopt, std::nullopt, std::nullopt,
                         fmt::format("{}: {}", layer, reason)});
  store_.add(RunInfoRecord{"precision_map", layers_.precision_map_json()});
  if (!options_.run_directory.empty())
    io::write_file_atomically(options_.run_directory / "precision_map.json", layers_.precision_map_json());
}

}  // namespace octet
