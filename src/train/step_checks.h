// What a training run does around a step for fp8.shadow_every, fp8.recalibrate_every and
// fp8.on_alert = "recalibrate" (docs/localization.md, "Shadow checks" and "Recalibration in a run"): it sets
// the trainer's probe on the step's first micro-batch, and after the step records the shadow check, acts on
// its alerts and recalibrates where asked. One rank only (check_ranks refuses these keys on several).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "octet/config/run_config.h"
#include "octet/model/model.h"
#include "octet/telemetry/recorder.h"
#include "octet/train/trainer.h"

namespace octet {

class ShadowModel;

class StepChecks {
 public:
  // `config`: the run's (validated: these keys need telemetry and, for recalibration, the static recipe).
  explicit StepChecks(const RunConfig& config);
  ~StepChecks();
  StepChecks(const StepChecks&) = delete;
  StepChecks& operator=(const StepChecks&) = delete;

  // Whether the run has anything to do here (any of the keys set).
  bool active() const { return active_; }
  // Before the step that makes `steps_done` steps: sets trainer's probe where this step is checked or may
  // be recalibrated after (the model in fp8 mode).
  void before_step(Trainer& trainer, Model& model, int64_t steps_done);
  // After that step and its telemetry record (whose alerts may ask for a recalibration): the shadow reading
  // recorded and acted on (not for a step skipped for a non-finite loss or gradient, whose skip is its own
  // event), then the recalibration, if any, installed and recorded. Returns the lines for the run's log.
  std::vector<std::string> after_step(Trainer& trainer, Model& model, int64_t steps_done, bool step_skipped,
                                      TelemetryRecorder& telemetry);
  // The run is about to replace its model and maybe its backend (a precision schedule's switch).
  void model_replaced();

 private:
  TelemetrySettings settings_;
  bool active_ = false;
  std::unique_ptr<ShadowModel> shadow_;
  // A model's first step casts with scales that no amax has chosen yet: no check (the run's first step, and
  // the first after a switch of precision mode).
  bool skip_next_check_ = false;
  // The step's first micro-batch, kept where the step may be recalibrated after.
  std::vector<int32_t> tokens_;
  std::vector<int32_t> targets_;
  float dloss_ = 0.0f;
  bool have_batch_ = false;
  std::optional<ShadowReading> reading_;
};

}  // namespace octet
