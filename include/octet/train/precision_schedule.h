// A run that changes precision mode between steps (train.precision_phases, or fp8.bf16_warmup_steps and
// fp8.bf16_cooldown_steps): the mode of each step, and the switch from the model of one mode to the model of
// the next. A switch carries the training state over exactly as a checkpoint saved before it and resumed in
// the next mode would (capture_training_state, restore_training_state): master weights, AdamW moments, step
// counts and the loss scale; FP8 scaling state starts fresh where the next mode is fp8. The data position is
// the run's own and does not move. See docs/precision.md, "Precision schedules".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/config/run_config.h"
#include "octet/model/model.h"
#include "octet/train/checkpoint.h"
#include "octet/train/trainer.h"

namespace octet {

// A change of mode before step `step` (0-based: after `step` steps done).
struct PrecisionSwitch {
  int64_t step = 0;
  MixedPrecision from{};
  MixedPrecision to{};

  // The run's log line: "step 201: precision bf16 -> fp8 (precision schedule)", the step numbered as the
  // progress lines number it (the first step in the new mode).
  std::string line() const;
};

class PrecisionSchedule {
 public:
  // `config` validated (parse_run_config).
  explicit PrecisionSchedule(const RunConfig& config);

  const std::vector<PrecisionSpan>& spans() const { return spans_; }
  // Whether the run trains in more than one mode.
  bool switches() const { return spans_.size() > 1; }
  MixedPrecision mode_at(int64_t step) const;
  // The configuration of step `step`'s mode (config_in_mode): what a model and trainer for it are built from.
  RunConfig config_at(int64_t step) const;
  // The switch that step `step` begins with when the model runs `current` now: at a phase's first step, or
  // at a resumed run's first step when its model was built in another mode; nullopt when none.
  std::optional<PrecisionSwitch> switch_before(int64_t step, MixedPrecision current) const;
  // One line for the startup log: "precision schedule: bf16 for steps 1-200, fp8 for steps 201-8200, bf16
  // for steps 8201-10000"; empty for a run of one mode.
  std::string describe() const;

 private:
  RunConfig config_;
  std::vector<PrecisionSpan> spans_;
};

// What trains: the backend, the model on it and the trainer of the model's parameters.
struct TrainingStack {
  std::unique_ptr<Backend>& backend;
  std::unique_ptr<Model>& model;
  std::unique_ptr<Trainer>& trainer;
};

// Replaces the model and trainer of `stack` (and its backend, where `rebuild` remakes it) with those that
// `rebuild` makes in the next mode, as the run made its first ones, carrying the training state across
// (capture_training_state, restore_training_state). The old trainer and model are released before `rebuild`
// runs, so that the two never hold memory together. On several ranks every rank switches at the same step
// (capturing a sharded optimizer's state is a collective). Returns the restore's account
// (CheckpointLoad::fresh_fp8_layers, notes).
CheckpointLoad switch_precision(TrainingStack stack, const std::function<void()>& rebuild);

}  // namespace octet
