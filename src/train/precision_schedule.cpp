// Precision schedules: the mode of each step, and the switch between modes within a run (see
// precision_schedule.h).
#include "octet/train/precision_schedule.h"

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

std::string PrecisionSwitch::line() const {
  return fmt::format("step {}: precision {} -> {} (precision schedule)", step + 1, mixed_precision_name(from),
                     mixed_precision_name(to));
}

PrecisionSchedule::PrecisionSchedule(const RunConfig& config)
    : config_(config), spans_(precision_schedule(config)) {
  OCTET_CHECK(!spans_.empty(), "a run of at least one step has a precision schedule");
}

MixedPrecision PrecisionSchedule::mode_at(int64_t step) const {
  for (const PrecisionSpan& s : spans_) {
    if (step < s.end_step) return s.mode;
  }
  return spans_.back().mode;
}

RunConfig PrecisionSchedule::config_at(int64_t step) const {
  return config_in_mode(config_, mode_at(step));
}

std::optional<PrecisionSwitch> PrecisionSchedule::switch_before(int64_t step, MixedPrecision current) const {
  const MixedPrecision mode = mode_at(step);
  if (mode == current) return std::nullopt;
  return PrecisionSwitch{step, current, mode};
}

std::string PrecisionSchedule::describe() const {
  if (!switches()) return {};
  std::vector<std::string> parts;
  for (const PrecisionSpan& s : spans_) {
    parts.push_back(
        s.end_step - s.first_step == 1
            ? fmt::format("{} for step {}", mixed_precision_name(s.mode), s.end_step)
            : fmt::format("{} for steps {}-{}", mixed_precision_name(s.mode), s.first_step + 1, s.end_step));
  }
  return fmt::format("precision schedule: {}", fmt::join(parts, ", "));
}

CheckpointLoad switch_precision(TrainingStack stack, const std::function<void()>& rebuild) {
  const TrainingState state = capture_training_state(*stack.model, *stack.trainer);
  // The trainer's optimizer and the model hold the backend's memory: released in that order.
  stack.trainer.reset();
  stack.model.reset();
  rebuild();
  OCTET_CHECK(stack.backend && stack.model && stack.trainer, "a backend, model and trainer after a switch");
  return restore_training_state(state, *stack.model, *stack.trainer);
}

}  // namespace octet
