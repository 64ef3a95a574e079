// The configuration of a training run: one TOML file with sections [model], [train], [fp8], [optimizer],
// [scheduler], [loss_scale], [distributed], [data], [checkpoint], [logging], [telemetry], [profiling], and
// `--set section.key=value` overrides. Every key is described once (run_config.cpp's key table), which
// drives parsing, validation, `octet config show` and the key reference in docs/config.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "octet/config/train_settings.h"
#include "octet/dist/topology.h"
#include "octet/model/config.h"
#include "octet/model/precision_policy.h"
#include "octet/telemetry/settings.h"

namespace octet {

// One phase of train.precision_phases: `steps` optimizer steps in `mode`; steps 0 (the last phase only):
// to the end of the run.
struct PrecisionPhase {
  MixedPrecision mode = MixedPrecision::fp32;
  int64_t steps = 0;
};

// [profiling]: the optimizer steps (1-based, both ends included) whose device kernels the run records into
// trace_dir, relative to the run directory unless absolute (docs/gpu.md, "Profiling").
struct ProfilingSettings {
  bool enabled = false;
  int64_t start_step = 2;  // step 1 carries one-off work (workspaces, algorithm choices)
  int64_t end_step = 2;
  std::filesystem::path trace_dir = "profile";
};

struct RunConfig {
  ModelArchitecture model_arch = ModelArchitecture::gpt2;  // which Model make_model builds
  ModelConfig model;                                       // its shape
  PrecisionSettings precision;  // mode from train.mixed_precision, the rest from [fp8]
  // A run that changes mode (precision_schedule): train.precision_phases, or the shorthand of
  // fp8.bf16_warmup_steps and fp8.bf16_cooldown_steps around fp8 steps; none of them: one mode throughout.
  std::vector<PrecisionPhase> precision_phases;
  int64_t bf16_warmup_steps = 0;
  int64_t bf16_cooldown_steps = 0;
  bool fp8_strict = false;      // refuse to start when FP8 cannot run as configured
  TrainSettings train;          // batch, sequence, accumulation, schedule, optimizer, loss scale
  int64_t steps = 1000;
  uint64_t seed = 1337;
  std::string device = "auto";        // "auto" | "cpu" | "cuda"
  std::string attention = "auto";     // on the GPU: "auto" | "cudnn" | "octet"
  bool time_gemm_algorithms = false;  // train.gemm_algorithms = "timed" (GPU only)
  // [distributed]: how the ranks share the work (a world of one rank trains as it always has)
  dist::DistributedSettings distributed;
  // [data]
  std::filesystem::path data_dir;  // shards: train_NNNNNN.bin and val_NNNNNN.bin
  std::string tokenizer = "bytes";
  int64_t eval_every = 100;  // steps between validation losses; 0: only at the end
  int64_t eval_batches = 20;
  // [checkpoint]
  int64_t checkpoint_every = 0;  // steps between checkpoints; 0: only at the end and on interruption
  int64_t keep_last = 3;
  // [logging]
  std::filesystem::path run_dir = "runs/octet";
  int64_t log_every = 10;  // steps between plain progress lines when the output is not a terminal
  // [telemetry], and the alert keys of [fp8]
  TelemetrySettings telemetry;
  ProfilingSettings profiling;
};

// Where a run of `config` writes its kernel trace: profiling.trace_dir, relative to logging.run_dir.
std::filesystem::path profiling_trace_dir(const RunConfig& config);

// A key of the configuration, for documentation and `octet config show`.
struct ConfigKeyInfo {
  std::string name;           // "train.batch_size"
  std::string type;           // "integer", "number", "string", "boolean", "list of strings"
  std::string default_value;  // as TOML
  std::string valid;          // valid values or range, in words
  std::string description;
};
const std::vector<ConfigKeyInfo>& config_keys();

// Reads and validates a configuration. `overrides` are "section.key=value" (value in TOML syntax; a bare word
// is taken as a string; one line). Throws octet::Error (invalid input, exit code 2) with one message that
// names the file, the key and what was expected, echoing input cut short and escaped; nothing is created or
// written. The file must be a regular file of at most 1 MiB; text nested deeper than octet's section.key
// keys and flat values is refused before it is parsed; every derived size must fit (each shape key has an
// upper bound, and so do their products); float32 keys must be finite and in range as float32.
RunConfig load_run_config(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});
// The same from TOML text (`origin` names it in messages).
RunConfig parse_run_config(std::string_view toml, std::string_view origin,
                           const std::vector<std::string>& overrides = {});

// The fully resolved configuration as TOML, every key with its value (defaults included).
std::string to_toml(const RunConfig& config);

// The steps first_step .. end_step - 1 (0-based) of a run, trained in `mode`.
struct PrecisionSpan {
  MixedPrecision mode = MixedPrecision::fp32;
  int64_t first_step = 0;
  int64_t end_step = 0;
};
// The run's modes, step by step, in order: train.precision_phases, or fp8.bf16_warmup_steps bf16 steps, fp8
// steps and fp8.bf16_cooldown_steps bf16 steps, or train.mixed_precision for every step. Every step of
// 0 .. steps - 1 is in exactly one span; neighbouring spans differ in mode. A validated configuration only.
std::vector<PrecisionSpan> precision_schedule(const RunConfig& config);
// The mode of step `step` (0-based; a step at or beyond the end: the last span's).
MixedPrecision precision_at(const RunConfig& config, int64_t step);
// The configuration as a run of `mode` alone uses it: train.mixed_precision = mode, and what follows from the
// mode (the dynamic loss scale of fp16).
RunConfig config_in_mode(const RunConfig& config, MixedPrecision mode);

}  // namespace octet
