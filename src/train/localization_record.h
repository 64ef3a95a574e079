// The telemetry rows of a precision map the run applies (fp8.precision_map): one per layer, with what
// `octet localize` measured and chose, so that `octet report` can show them from the run directory alone.
// Internal to the engine (training_run.cpp, tests).
#pragma once

#include <string>
#include <vector>

#include "octet/model/precision_map_file.h"
#include "octet/telemetry/store.h"

namespace octet {

std::vector<LocalizationRecord> localization_records(const PrecisionMapFile& map);

// The map's totals in one line for the run table: "budget 0.5%, predicted loss change +0.21%, saving 0.8 ms
// per micro-batch (measured); 4 of 5 layers in FP8".
std::string localization_summary(const PrecisionMapFile& map);

}  // namespace octet
