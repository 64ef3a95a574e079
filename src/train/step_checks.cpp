// Shadow checks and recalibration around a training step (see step_checks.h).
#include "step_checks.h"

#include <fmt/format.h>

#include "recalibration.h"
#include "shadow_check.h"

namespace octet {

StepChecks::StepChecks(const RunConfig& config)
    : settings_(config.telemetry),
      active_(config.telemetry.shadow_every > 0 || config.telemetry.recalibrate_every > 0 ||
              config.telemetry.on_alert == AlertAction::recalibrate) {
  if (active_) shadow_ = std::make_unique<ShadowModel>(config);
}

StepChecks::~StepChecks() = default;

void StepChecks::model_replaced() {
  if (shadow_) shadow_->release();
  skip_next_check_ = true;
}

void StepChecks::before_step(Trainer& trainer, Model& model, int64_t steps_done) {
  reading_.reset();
  have_batch_ = false;
  if (!active_ || model.policy().mode() != MixedPrecision::fp8) return;
  const bool check = settings_.shadow_every > 0 && steps_done % settings_.shadow_every == 0 &&
                     !skip_next_check_ && steps_done != 1;
  skip_next_check_ = false;
  const bool may_recalibrate =
      settings_.recalibrate_every > 0 || settings_.on_alert == AlertAction::recalibrate;
  if (!check && !may_recalibrate) return;
  trainer.set_micro_batch_probe([this, &model, check, may_recalibrate, steps_done](const MicroBatch& batch) {
    if (check) reading_ = shadow_->check(model, batch, steps_done);
    if (may_recalibrate) {
      const auto n = static_cast<size_t>(batch.B * batch.T);
      tokens_.assign(batch.tokens, batch.tokens + n);
      targets_.assign(batch.targets, batch.targets + n);
      dloss_ = batch.dloss;
      have_batch_ = true;
    }
  });
}

std::vector<std::string> StepChecks::after_step(Trainer& trainer, Model& model, int64_t steps_done,
                                                bool step_skipped, TelemetryRecorder& telemetry) {
  std::vector<std::string> lines;
  if (!active_) return lines;
  trainer.set_micro_batch_probe(nullptr);
  if (reading_ && !step_skipped) {
    telemetry.record_shadow(*reading_);
  }
  reading_.reset();
  std::string reason = telemetry.take_recalibration_request();
  if (settings_.recalibrate_every > 0 && steps_done % settings_.recalibrate_every == 0) {
    const std::string every = fmt::format("every {} steps", settings_.recalibrate_every);
    reason = reason.empty() ? every : every + "; " + reason;
  }
  if (reason.empty() || !have_batch_ || model.policy().mode() != MixedPrecision::fp8) return lines;
  // Measured after the step's update, on its first micro-batch: the scales the next step casts with.
  const std::vector<CalibratedLayer> measured = shadow_->measure(model, tokens_, targets_, dloss_);
  const std::vector<RecalibrationRecord> rows =
      install_calibrated_scales(model, measured, steps_done, reason);
  lines.push_back(recalibration_line(steps_done, rows, reason));
  telemetry.record_recalibration(steps_done, rows, lines.back());
  return lines;
}

}  // namespace octet
