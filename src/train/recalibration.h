// Recalibration in a run (docs/localization.md, "Recalibration in a run"): the static recipe's per-operand
// scales of every FP8 layer replaced by those measured on a batch of the run (ShadowModel::measure), in the
// layers' scaling states, which checkpoints save, so that a resumed run continues with them. Internal to the
// engine (training_run.cpp, tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "octet/model/calibration.h"
#include "octet/model/model.h"
#include "octet/telemetry/store.h"

namespace octet {

// Installs the scales of `measured` in the scaling states of the layers `model` runs in FP8 now (the static
// recipe's: the scale every cast of the operand uses from the next step on) and remakes the FP8 weight
// copies with the new weight scales. An operand that saw no non-zero value (or whose scale is not usable)
// keeps its scale. Returns one row per operand of each FP8 layer, before and after, with `reason`.
std::vector<RecalibrationRecord> install_calibrated_scales(Model& model,
                                                           const std::vector<CalibratedLayer>& measured,
                                                           int64_t steps_done, const std::string& reason);

// The run's log line: "step 20: FP8 scales recalibrated (every 20 steps): 12 of 12 operand scales changed,
// the largest change x 0.25 (h.0.mlp.c_fc activation)".
std::string recalibration_line(int64_t steps_done, const std::vector<RecalibrationRecord>& rows,
                               const std::string& reason);

}  // namespace octet
