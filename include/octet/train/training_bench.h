// `octet bench train`: the training throughput of a configuration, measured with the very model, backend and
// trainer `octet train` builds, without a run directory or checkpoints. Tokens per second and milliseconds
// per step over timed steps after warm-up, model FLOPs utilisation against the GPU's datasheet peaks, device
// memory, and a separate, synchronised pass that times the phases of a step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/config/run_config.h"
#include "octet/model/precision_policy.h"

namespace octet {

struct TrainingBenchOptions {
  int64_t steps = 20;         // timed optimizer steps
  int64_t warmup_steps = 5;   // untimed steps first (plans, scratch memory, FP8 amax histories settle)
  int64_t phase_steps = 5;    // steps of the synchronised phase pass after the timed steps; 0: no pass
  bool random_tokens = true;  // uniform random tokens and targets; false: the config's data.dir
  // Receives the lines a training run prints at start (the device line, the FP8 policy line).
  std::function<void(std::string_view)> log;
};

// Dense datasheet peaks of a GPU, in TFLOP/s.
struct DatasheetPeaks {
  std::string gpu;  // as the table names it: "H100 SXM"
  double bf16 = 0.0;
  double fp8 = 0.0;
};
// The peaks of a GPU picked by its CUDA device name ("NVIDIA H100 80GB HBM3"); none for a GPU not in the
// table.
std::optional<DatasheetPeaks> datasheet_peaks(std::string_view device_name);

// Mean milliseconds per step of each phase in the synchronised pass (the backend synchronised at every
// boundary, so their sum exceeds the unsynchronised ms_per_step by the overlap the synchronisation removes).
struct StepPhaseTimes {
  int64_t steps = 0;
  double data_ms = 0.0;     // the batch source: random tokens or the data loader (host)
  double forward_ms = 0.0;  // forward and loss, tokens to the device included
  double backward_ms = 0.0;
  double optimizer_ms = 0.0;  // zeroing gradients, non-finite checks, gradient norm, AdamW, weight copies
  double total_ms() const { return data_ms + forward_ms + backward_ms + optimizer_ms; }
  // Device milliseconds per step of each kind of op (Backend::take_op_times, events around every op) in the
  // forward, backward and optimizer phases; empty where the backend does not time its ops.
  bool has_op_times = false;
  OpTimes forward_ops{};
  OpTimes backward_ops{};
  OpTimes optimizer_ops{};
};

struct TrainingBenchResult {
  std::string device_line;      // what `octet train` would print about the device
  std::string backend;          // "cpu" or "cuda"
  std::string device_name;      // the GPU's name; "CPU" on the CPU backend
  std::string model;            // Model::describe()
  std::string mode;             // mixed-precision mode
  int64_t parameters = 0;       // every parameter of the model as built (padded vocabulary)
  int64_t flop_parameters = 0;  // N of the FLOP estimate: parameters less the position embedding
  int64_t tokens_per_step = 0;  // B * T * grad_accum_steps
  int64_t steps = 0;
  int64_t warmup_steps = 0;
  int64_t skipped_steps = 0;  // timed steps skipped as non-finite (they skip the optimizer)
  int64_t fp8_gemms_per_step = 0;
  int64_t other_gemms_per_step = 0;
  float last_loss = 0.0f;
  bool random_tokens = true;
  // Every linear layer and the precision of its three GEMMs, as the last timed step ran them.
  std::vector<LinearPlan> linears;

  double seconds = 0.0;  // wall time of the timed steps, the backend synchronised at both ends
  double ms_per_step = 0.0;
  double tokens_per_second = 0.0;
  // Model FLOPs per token: 6 N + 12 L C T (PaLM, appendix B: the matrix products of forward and backward,
  // plus attention's QK^T and AV without discounting the causal mask).
  double flops_per_token = 0.0;
  double model_tflops = 0.0;  // flops_per_token * tokens_per_second
  std::optional<DatasheetPeaks> peaks;
  std::optional<double> mfu_bf16;  // model_tflops / peak, as fractions
  std::optional<double> mfu_fp8;
  std::string mfu_note;  // why MFU is missing, when it is

  // GPU only: the largest device memory in use (cudaMemGetInfo, the whole device) sampled after each warm-up
  // step, after the timed steps and after the phase pass, less what was in use before the backend was made.
  std::optional<size_t> device_memory_bytes;
  std::string memory_note;

  std::optional<StepPhaseTimes> phases;
};

// Builds the backend, model and trainer as `octet train` does (telemetry off), runs the warm-up, timed and
// phase steps, and measures. Throws octet::Error: invalid_input for bad options or a configuration that
// cannot run; training_failed when too many steps in a row are non-finite.
TrainingBenchResult benchmark_training(const RunConfig& config, const TrainingBenchOptions& options);

}  // namespace octet
