// A run's precision schedule as its configuration states it (train.precision_phases, or fp8.bf16_warmup_steps
// and fp8.bf16_cooldown_steps around fp8 steps): the checks, and the steps of each mode (run_config.h). The
// run loop that switches modes is train/precision_schedule.h.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "config_key.h"
#include "octet/check.h"

namespace octet {

std::vector<PrecisionSpan> precision_schedule(const RunConfig& config) {
  std::vector<PrecisionSpan> spans;
  auto add = [&](MixedPrecision mode, int64_t steps) {
    const int64_t first = spans.empty() ? 0 : spans.back().end_step;
    if (steps > 0) spans.push_back({mode, first, first + steps});
  };
  if (!config.precision_phases.empty()) {
    int64_t before_last = 0;
    for (size_t i = 0; i + 1 < config.precision_phases.size(); ++i)
      before_last += config.precision_phases[i].steps;
    for (size_t i = 0; i < config.precision_phases.size(); ++i) {
      const PrecisionPhase& p = config.precision_phases[i];
      add(p.mode,
          i + 1 < config.precision_phases.size() || p.steps > 0 ? p.steps : config.steps - before_last);
    }
  } else if (config.bf16_warmup_steps > 0 || config.bf16_cooldown_steps > 0) {
    add(MixedPrecision::bf16, config.bf16_warmup_steps);
    add(config.precision.mode, config.steps - config.bf16_warmup_steps - config.bf16_cooldown_steps);
    add(MixedPrecision::bf16, config.bf16_cooldown_steps);
  } else {
    add(config.precision.mode, config.steps);
  }
  return spans;
}

MixedPrecision precision_at(const RunConfig& config, int64_t step) {
  const std::vector<PrecisionSpan> spans = precision_schedule(config);
  OCTET_CHECK(!spans.empty(), "a run of at least one step has a precision schedule");
  for (const PrecisionSpan& s : spans) {
    if (step < s.end_step) return s.mode;
  }
  return spans.back().mode;
}

RunConfig config_in_mode(const RunConfig& config, MixedPrecision mode) {
  RunConfig c = config;
  c.precision.mode = mode;
  c.train.loss_scale.dynamic = mode == MixedPrecision::fp16;
  return c;
}

namespace config_detail {

void check_precision_phases(const RunConfig& c, const std::string& origin) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) fail(fmt::format("{}: {}", origin, message));
  };
  const bool shorthand = c.bf16_warmup_steps > 0 || c.bf16_cooldown_steps > 0;
  if (shorthand) {
    require(c.precision_phases.empty(),
            "fp8.bf16_warmup_steps and fp8.bf16_cooldown_steps are a shorthand for train.precision_phases; "
            "give one or the other");
    require(
        c.precision.mode == MixedPrecision::fp8,
        fmt::format("fp8.bf16_warmup_steps and fp8.bf16_cooldown_steps put bf16 steps around fp8 ones and "
                    "need train.mixed_precision = \"fp8\", got \"{}\"",
                    mixed_precision_name(c.precision.mode)));
    // Compared without adding them, which could overflow.
    require(c.bf16_warmup_steps < c.steps && c.bf16_cooldown_steps < c.steps - c.bf16_warmup_steps,
            fmt::format("fp8.bf16_warmup_steps ({}) and fp8.bf16_cooldown_steps ({}) leave no fp8 step of "
                        "train.steps ({})",
                        c.bf16_warmup_steps, c.bf16_cooldown_steps, c.steps));
  }
  const std::vector<PrecisionPhase>& phases = c.precision_phases;
  if (!phases.empty()) {
    int64_t total = 0;
    for (size_t i = 0; i < phases.size(); ++i) {
      const PrecisionPhase& p = phases[i];
      require(p.mode != MixedPrecision::fp16,
              fmt::format(
                  "entry {} of train.precision_phases is fp16, which a schedule cannot switch to or from: "
                  "fp16 trains with a dynamic loss scale that no other mode keeps, so a switch would "
                  "start it afresh mid-run; phases are fp32, bf16 or fp8",
                  i + 1));
      require(
          i + 1 == phases.size() || p.steps > 0,
          fmt::format("entry {} of train.precision_phases has no steps; only the last phase may leave them "
                      "out (it runs to the end)",
                      i + 1));
      require(i == 0 || phases[i - 1].mode != p.mode,
              fmt::format("entries {} and {} of train.precision_phases are both {}; join them into one phase",
                          i, i + 1, mixed_precision_name(p.mode)));
      // total <= train.steps so far; the sum saturates rather than overflow.
      total = p.steps > std::numeric_limits<int64_t>::max() - total ? std::numeric_limits<int64_t>::max()
                                                                    : total + p.steps;
      require(
          total <= c.steps && (i + 1 == phases.size() || total < c.steps),
          fmt::format("train.precision_phases: the phases up to entry {} take {} steps, {} train.steps ({})",
                      i + 1, total, total > c.steps ? "more than" : "all of", c.steps));
    }
    require(phases.back().steps == 0 || total == c.steps,
            fmt::format(
                "train.precision_phases: the phases' steps add up to {}, but train.steps is {}; make them "
                "add up, or leave out the last phase's steps so that it runs to the end",
                total, c.steps));
  }
  // What one mode of the run needs, every mode of the schedule needs.
  for (const PrecisionSpan& s : precision_schedule(c)) {
    require(
        !c.precision.bf16_weight_gradients || s.mode == MixedPrecision::bf16 || s.mode == MixedPrecision::fp8,
        fmt::format(
            "train.weight_gradients = \"bf16\" needs train.mixed_precision = \"bf16\" or \"fp8\" "
            "(weight-gradient GEMMs that round to bf16), got \"{}\"{}",
            mixed_precision_name(s.mode),
            precision_schedule(c).size() > 1
                ? fmt::format(" for steps {} to {} of the precision schedule", s.first_step + 1, s.end_step)
                : std::string()));
  }
}

}  // namespace config_detail
}  // namespace octet
