// Reading a run's telemetry database for `octet inspect`: the run, the layers whose FP8 tensors saturate and
// underflow most, one layer's history, the GEMMs that changed precision, and the events. Read-only; works
// while the run is still writing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "octet/telemetry/store.h"

namespace octet {

struct InspectOptions {
  std::string layer;  // when set, that layer's history (it must have telemetry)
  int64_t top = 5;    // layers in each ranking
};

// A layer's worst reading of one quantity over the run (the tensor and step where it happened), and its mean
// over all the layer's readings.
struct LayerRanking {
  std::string layer;
  std::string tensor;
  int64_t step = 0;
  double worst = 0.0;
  double mean = 0.0;
};

struct InspectReport {
  std::filesystem::path database;
  std::map<std::string, std::string> run;  // the run table, precision_map and config left out
  int64_t steps_recorded = 0;              // rows in steps
  int64_t last_step = 0;
  int64_t skipped_steps = 0;
  std::optional<double> last_loss;
  std::optional<double> last_validation_loss;
  int64_t first_fp8_gemms = 0;  // per step, at the first and the last recorded step
  int64_t last_fp8_gemms = 0;
  int64_t last_other_gemms = 0;
  int64_t telemetry_steps = 0;                // distinct steps in tensor_stats
  std::vector<LayerRanking> saturation;       // worst first; layers that never saturated are left out
  std::vector<LayerRanking> underflow;        // worst first; layers that never underflowed are left out
  std::vector<GemmRecord> precision_changes;  // gemms rows after the start (since_step > 0)
  // A run resumed in another mode: the first step of the new mode, the mode, the mode before, and the layers
  // with a GEMM in FP8 from then on; the last one starts the run's latest segment.
  struct ModeChange {
    int64_t step = 0;
    std::string mode;
    std::string before;
    int64_t fp8_layers = 0;
    int64_t layers = 0;
  };
  std::vector<ModeChange> mode_changes;
  std::vector<EventRecord> events;          // in order
  std::vector<TensorRecord> layer_history;  // with options.layer: step by step, then by tensor
  std::vector<GemmRecord> layer_gemms;      // with options.layer: all its gemms rows
};

// Throws octet::Error (invalid input, exit code 2) with one clear message when run_dir is missing, has no
// telemetry database, the database is not one (corrupt, or another program's), or options.layer has no
// telemetry in it.
InspectReport inspect_run(const std::filesystem::path& run_dir, const InspectOptions& options);

}  // namespace octet
