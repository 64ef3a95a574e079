// Checkpoints: one directory per checkpoint (RUN_DIR/checkpoints/step_000100/) holding model.safetensors
// (the weights under the model's Hugging Face names and layout, Model::hf_name, loadable by transformers),
// optimizer.safetensors (octet's exact float32 master weights and the AdamW moments) and state.json (step
// counts, loss scaler, every FP8 layer's scaling state, data loader positions, the resolved config). A run
// whose optimizer state is sharded over several ranks saves a checkpoint of shards instead
// (checkpoint_shards.h): each rank's moments in a file of its own, the master weights in
// parameters.safetensors, and a manifest. Saves are atomic; loads validate everything before changing
// anything, read either layout on any number of ranks, and resume bit for bit. See docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/precision.h"
#include "octet/io/data_loader.h"
#include "octet/io/tokenizer.h"
#include "octet/model/model.h"
#include "octet/train/trainer.h"

namespace octet {

// What the caller owns and a checkpoint keeps for it.
struct TrainingProgress {
  std::optional<io::LoaderPosition> train_position;
  std::optional<io::LoaderPosition> validation_position;
  uint64_t seed = 0;
  std::string config;  // the resolved config, stored and returned verbatim
  // A run's tokenizer files (gpt2's encoder.json and vocab.bpe, llama3's llama3.tiktoken: the complete set of
  // each tokenizer found here) are copied from here into each checkpoint; empty for none (the byte tokenizer
  // has no files). See checkpoint_tokenizer_files.
  std::filesystem::path tokenizer_dir;
  // Where the weights came from when no octet run trained them (`octet import hf`): state.json's
  // "imported_from" object, e.g. {"format": "huggingface", "architecture": "LlamaForCausalLM", "source":
  // DIR}; empty for a run's own checkpoints (state.json then has no such member).
  std::map<std::string, std::string> imported_from;
};

// Where a run's tokenizer files are, for TrainingProgress::tokenizer_dir: for a tokenizer with files (gpt2,
// llama3), the data directory when `octet data prepare` put them there, else io::default_vocabulary_dir()
// when it holds them, else empty; empty for the byte tokenizer.
std::filesystem::path training_tokenizer_files(std::string_view tokenizer,
                                               const std::filesystem::path& data_dir);

// The directory of the `kind` tokenizer's files that text for a checkpoint goes through: the checkpoint's own
// copy, else the data directory's, else io::default_vocabulary_dir(kind). Throws invalid_input naming
// every place looked in when none holds them.
std::filesystem::path checkpoint_tokenizer_files(io::TokenizerKind kind,
                                                 const std::filesystem::path& checkpoint_dir,
                                                 const std::filesystem::path& data_dir);

struct CheckpointOptions {
  int keep_last = 3;  // complete checkpoints kept after a successful save (older ones are deleted); >= 1
  // Called after each file of the checkpoint is on disk (in the temporary directory), before the next one
  // is written; for tests that interrupt a save. On several ranks each rank calls it for the files it writes
  // (its shard; rank 0 also the whole files and the manifest), each on its own thread where ranks are threads.
  std::function<void(const std::filesystem::path& file)> after_file_written;
};

// RUN_DIR/checkpoints/step_<step, at least 6 digits>.
std::filesystem::path checkpoint_directory(const std::filesystem::path& run_dir, int64_t step);

// Saves the state after trainer.steps_done() steps and returns the checkpoint's directory. The files go to
// RUN_DIR/checkpoints/.tmp_step_N, each flushed to disk, and the directory is then renamed into place, so
// a checkpoint is either complete or absent. Afterwards only the newest keep_last complete checkpoints and
// no temporary directories remain. Saving changes nothing in the running model. A data-parallel trainer's
// ranks all call it. With a sharded optimizer each rank writes its shard of the moments into the temporary
// directory while rank 0 writes the whole model's files; rank 0 then writes the manifest, last, and renames
// the directory into place (checkpoint_shards.h). Without one, rank 0 writes the whole checkpoint one rank
// would write. Every rank returns once the checkpoint is in place, or throws (every rank alike, naming the
// first rank that failed) when any part of the save failed (docs/distributed.md).
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir, Model& model, Trainer& trainer,
                                      const TrainingProgress& progress,
                                      const CheckpointOptions& options = {});

// Complete checkpoints of a run, oldest first; temporary and malformed directories are left out.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& run_dir);
// The newest complete checkpoint of a run, if any.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir);
// The checkpoint a run continues from (--resume) or that stands for a run directory (eval, generate): the
// newest complete one. Throws invalid_input, naming the directory and what is wrong with it, when a newer
// checkpoint directory than that is damaged (a file missing, a state.json that does not parse), rather than
// going back to an older checkpoint without a word. Saves are atomic, so only damage after the fact leaves
// such a directory.
std::optional<std::filesystem::path> checkpoint_to_continue(const std::filesystem::path& run_dir);

// The resolved configuration a checkpoint was saved with (TrainingProgress::config), read without loading
// anything else; throws invalid_input when the checkpoint's state.json is missing or malformed.
std::string checkpoint_config(const std::filesystem::path& checkpoint_dir);

// The step a checkpoint was saved at (the next step's index), read without loading anything else; throws
// invalid_input when the checkpoint's state.json is missing or malformed.
int64_t checkpoint_step(const std::filesystem::path& checkpoint_dir);

struct CheckpointLoad {
  int64_t step = 0;  // optimizer steps done (the next step's index)
  TrainingProgress progress;
  std::string octet_version;                  // of the run that saved it
  MixedPrecision saved_mode{};                // mixed precision of the run that saved it
  std::vector<std::string> fresh_fp8_layers;  // FP8 layers of this model whose scaling state starts fresh
  std::vector<std::string> notes;             // lines for the caller to log, e.g. why FP8 state starts fresh
};

// Loads a checkpoint into a model and trainer built for the same shapes (the precision mode may differ).
// Everything is read and validated first; on any problem an invalid_input error names the file and the
// mismatch, and the model and trainer are left untouched. Values no run produces are refused naming the
// field: negative step counts or positions, a loss scale or FP8 scale that is not positive and finite, a
// negative or NaN amax in a history, a negative last amax (NaN or Inf there is legitimate: it records what
// an overflowing step's cast saw), non-finite master weights or moments, and negative second moments. A
// sharded optimizer (data_parallel.h) takes its own shard of the moments, whatever the number of ranks that
// saved them; from a checkpoint of shards it reads only the saved shards that overlap its own (each checked
// against the manifest's size and digest), and a checkpoint of shards whose manifest disagrees with its
// files (a shard missing or of another size or digest, another parameter count or step) is refused.
CheckpointLoad load_checkpoint(const std::filesystem::path& checkpoint_dir, Model& model, Trainer& trainer);

// What a checkpoint keeps of a model and its trainer, in memory: every parameter's master weight and AdamW
// moments, the step counts, the loss scaler, and each FP8 layer's scaling state under its recipe (empty
// outside fp8 mode). A run that changes precision mode (train/precision_schedule.h) carries it from the
// model of one mode to the model of the next, exactly as saving a checkpoint and loading it into a run of
// the next mode would.
struct TrainingState {
  std::vector<float> params;
  // The AdamW moments of elements moments_begin .. moments_begin + m.size() - 1 of the parameter buffer: of
  // every element (capture_training_state), or of at least the trainer's shard (a load of a checkpoint of
  // shards reads no more than a rank's own).
  std::vector<float> m;
  std::vector<float> v;
  int64_t moments_begin = 0;
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  int64_t consecutive_skips = 0;
  MixedPrecision mode{};
  bool dynamic_loss_scale = false;
  float loss_scale = 1.0f;
  int64_t clean_steps = 0;
  std::string recipe;  // ScalingRecipe::describe() of the FP8 layers' recipe; empty when there are none
  std::map<std::string, Fp8LinearState> fp8;
};

// The state of `model` and `trainer` as save_checkpoint would write it (a collective where the optimizer
// state is sharded, as save_checkpoint).
TrainingState capture_training_state(Model& model, Trainer& trainer);
// Puts `state` into a model and trainer of the same shapes, in any precision mode, as load_checkpoint puts
// a checkpoint's (load_checkpoint calls it once the files are validated): FP8 state carried where the layer
// was FP8 under the same recipe and fresh otherwise, the loss scale carried where both scale alike, the
// weight copies remade. The returned load has step, saved_mode, fresh_fp8_layers and notes set.
CheckpointLoad restore_training_state(const TrainingState& state, Model& model, Trainer& trainer);

// The weights only (--init-from): the master weights of a checkpoint made for the same model shape, copied
// into `model` (its weight copies remade); the optimizer, step counts, loss scale and FP8 state are not read.
// The checkpoint's state.json model must equal model.model_json() key by key. Everything is read and
// validated first; on a problem an invalid_input error names the file and the mismatch (a model key that
// differs names the key and both values) and the model is left untouched. Returns the checkpoint's
// imported_from (empty for a run's checkpoint).
std::map<std::string, std::string> load_checkpoint_weights(const std::filesystem::path& checkpoint_dir,
                                                           Model& model);

}  // namespace octet
