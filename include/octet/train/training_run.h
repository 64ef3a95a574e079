// A whole training run from a RunConfig, as `octet train` performs it: data, model, precision policy, the
// run directory (resolved config, precision map, per-step metrics as JSON lines; one writer, never a previous
// run overwritten unasked), progress lines, validation losses, and a clean stop on SIGINT or SIGTERM.
#pragma once

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "octet/backend/backend.h"
#include "octet/config/run_config.h"
#include "octet/dist/launch.h"
#include "octet/model/sampling.h"

namespace octet {

struct TrainingRunOptions {
  std::FILE* out = stdout;   // progress and reports, each line flushed as it is written
  bool interactive = false;  // a terminal: one progress line updated in place
  bool resume = false;       // continue from the latest complete checkpoint of the run directory
  // Continue from this checkpoint directory (of any run) into the run directory; empty: none.
  std::filesystem::path resume_from;
  // Start afresh (step 0, fresh optimizer, the run's own configuration) from this checkpoint's weights only;
  // its model must equal the configuration's [model]. Empty: none. Not with resume or resume_from.
  std::filesystem::path init_from;
  bool overwrite = false;  // remove octet's files of a previous run in the run directory and start afresh
  bool handle_signals = true;
  // This process is one rank of a run of several (a launcher's environment, dist/launch.h): it joins the
  // others, trains its share of every step, and rank 0 alone prints progress and writes the run directory.
  // Nothing: a run of one.
  std::optional<dist::RankEnvironment> ranks;
};

struct TrainingRunSummary {
  int64_t steps_done = 0;
  float last_loss = 0.0f;
  float last_validation_loss = 0.0f;
  bool interrupted = false;
  int stop_signal = 0;  // the signal (SIGINT, SIGTERM) that stopped the run, when interrupted
  // [profiling]: where the kernel trace was written (empty: none), and whether the run gave it up (a
  // fallback: the profiler could not record, and the run trained on without it)
  std::filesystem::path kernel_trace_dir;
  bool profiling_fell_back = false;
};

// The backend a run trains on, as train.device says (the GPU for "auto" when one is visible), and the line
// the run prints about it: the device and how FP8 runs there. Throws octet::Error (invalid_input) when the
// device cannot be had or cannot run the configuration (no CUDA, no GPU, a recipe the GPU lacks, fp8.strict).
struct TrainingBackend {
  std::unique_ptr<Backend> backend;
  bool cuda = false;
  std::string device_line;
};
TrainingBackend make_training_backend(const RunConfig& config);

// Validates everything it can (data, shapes, device, the run directory, the checkpoint it resumes from)
// before it writes anything; a refusal throws octet::Error (invalid_input) and leaves the run directory as it
// was. A run directory that holds a run already is refused unless options.resume (continue from its latest
// complete checkpoint), options.overwrite (octet's files of the old run are removed) or options.resume_from
// names that run's latest checkpoint. RUN_DIR/octet.lock keeps a second run out while this one lives.
// Saves a checkpoint every checkpoint.every steps, at the end, and when stopped by a signal. Once training is
// under way, a failure to write (a checkpoint, metrics.jsonl, the telemetry database) throws octet::Error
// (training_failed) naming the file and the reason; the last complete checkpoint is kept.
TrainingRunSummary run_training(const RunConfig& config, const TrainingRunOptions& options);

// Throws octet::Error (invalid_input) when the configuration cannot train on `world` ranks: a [distributed]
// layout that does not fit them, or one not supported yet. run_training checks it too; a launcher checks it
// before it starts the ranks, so that the refusal is said once.
void check_ranks(const RunConfig& config, int world);

struct EvaluationResult {
  float loss = 0.0f;  // mean cross-entropy per token over the validation batches
  float perplexity = 0.0f;
  int64_t tokens = 0;
  int64_t step = 0;  // the checkpoint's step
  MixedPrecision mode = MixedPrecision::fp32;
  std::string device_line;  // where it ran, as a training run says it at start
};

// Validation loss of a checkpoint over the first `batches` batches (0: the run's data.eval_batches, so that
// the result equals the run's own last validation loss) of the validation split of `data_dir`
// (empty: the data.dir the checkpoint was trained with), in the precision mode it was trained in, on the
// device `device` ("auto", "cpu", "cuda"; empty: the run's train.device). Deterministic on each backend:
// on the backend the run trained on, it repeats the run's last validation loss exactly.
EvaluationResult evaluate_checkpoint(const std::filesystem::path& checkpoint,
                                     const std::filesystem::path& data_dir, int64_t batches,
                                     const std::string& device = {});

// Continues `prompt` with the checkpoint's model and tokenizer on `device` (as evaluate_checkpoint); returns
// the generated text.
std::string generate_from_checkpoint(const std::filesystem::path& checkpoint, std::string_view prompt,
                                     const SamplingSettings& settings, const std::string& device = {});

}  // namespace octet
