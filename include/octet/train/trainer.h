// One optimizer step of a GPT: micro-batches with gradient accumulation, loss scaling, a check that the
// loss and every gradient are finite (skipping the step and naming the first non-finite tensor when not),
// clipping by the global gradient norm, AdamW, and the refresh of the GEMMs' weight copies; on one rank or
// as one of several data-parallel ranks (data_parallel.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "octet/config/train_settings.h"
#include "octet/model/model.h"
#include "octet/telemetry/source.h"
#include "octet/train/batch_source.h"
#include "octet/train/data_parallel.h"
#include "octet/train/optimizer.h"
#include "octet/train/schedule.h"

namespace octet {

// What one optimizer step did: the numbers the run's step table records (telemetry/source.h), as the trainer
// returns them.
using StepResult = StepStatistics;

class StepScaling;
class OverlappedSums;
struct GradientRun;
class ParameterGather;
class TokenRowSums;

// A step's first micro-batch as the trainer ran it (its forward and backward done, the optimizer not yet):
// what a probe (Trainer::set_micro_batch_probe) sees. The model's gradients then hold this micro-batch's
// alone, and its weights are the step's.
struct MicroBatch {
  const int32_t* tokens = nullptr;  // [B, T], host memory
  const int32_t* targets = nullptr;
  int64_t B = 0;
  int64_t T = 0;
  float loss = 0.0f;   // the mean loss over its B x T positions
  float dloss = 0.0f;  // the gradient of the loss sum its backward started from (loss scale included)
};

class Trainer {
 public:
  // Reports the FP8 startup line through settings.log (fp8 mode only) and writes the per-layer precision map
  // to settings.run_directory/precision_map.json when a run directory is set.
  Trainer(Model& model, TrainSettings settings);
  // One data-parallel rank (data_parallel.h): `data` gives this rank's micro-batches (rank_batches), the
  // step's results (loss, gradient norm, tokens) are the whole step's over every rank, its GEMM counts this
  // rank's. Throws invalid_input where `parallel` asks for what cannot be (Trainer::checked: a reduce-scatter
  // with a hybrid layout, fully sharded weights without FP8 gathers).
  Trainer(Model& model, TrainSettings settings, DataParallel parallel);
  ~Trainer();
  // Runs one optimizer step. Throws octet::Error (ErrorKind::training_failed) after
  // max_consecutive_skips skipped steps in a row.
  StepResult step(const BatchSource& data);
  // Mean loss over `batches` micro-batches, without touching gradients or the optimizer. With fully sharded
  // weights (forwards_gather), every rank calls it together.
  float evaluate(const BatchSource& data, int64_t batches);

  // Called in every step after the first micro-batch's backward (of the first emulated rank), until reset
  // with nullptr. A probe must change nothing the step uses: the shadow checks and recalibration of a run
  // (src/train/shadow_check.h) read the gradients and run another model.
  void set_micro_batch_probe(std::function<void(const MicroBatch&)> probe) { probe_ = std::move(probe); }

  int64_t steps_done() const { return step_; }
  int64_t consecutive_skips() const { return consecutive_skips_; }
  // For resuming from a checkpoint: the optimizer steps done and the skips in a row so far. The optimizer's
  // moments, the loss scaler and the model's FP8 scaling state are restored through their own accessors.
  void restore(int64_t steps_done, int64_t consecutive_skips) {
    step_ = steps_done;
    consecutive_skips_ = consecutive_skips;
  }
  LossScaler& loss_scaler() { return scaler_; }
  AdamW& optimizer() { return optimizer_; }
  const DataParallel& parallel() const { return parallel_; }
  // With the optimizer state sharded, the parameters outside a rank's shard are still on their way after a
  // step (the next forward waits for them), and with FP8 weight gathers (DataParallel::fp8_weight_gather) the
  // float32 master values of the weights gathered as codes stay stale there: this brings every parameter up
  // to date on every rank, for what reads params() other than a forward (a checkpoint). Called by every rank
  // together; a no-op otherwise.
  void gather_master_weights();
  // Every parameter's float32 master values on the host of the ranks that keep them (empty elsewhere),
  // leaving the device's as they are: with stale masters, gathered window by window from the ranks' shards
  // (ParameterGather::master_weights), so that their memory stays given back. Called by every rank
  // together where the optimizer state is sharded.
  std::vector<float> master_weights(bool keep);
  // What one gather of a sharded optimizer's parameters moves, planned from the layers' present modes
  // (data_parallel.h); zeros where the optimizer state is whole.
  GatherVolume parameter_gather_volume();
  // Whether every forward gathers weights from the other ranks (fully sharded weights,
  // DataParallel::reshard_after_forward): then every rank runs every forward together, an evaluation's too.
  bool forwards_gather() const;
  // The ranges of the parameters whose float32 master values this rank leaves stale between updates (the
  // weights gathered as FP8 codes, outside this rank's part of each: ParameterGather::stale_ranges); empty
  // without FP8 weight gathers and after gather_master_weights().
  std::vector<Backend::Range> stale_master_ranges() const;
  // The bytes of those masters' memory given back (whole pages of the parameter buffer inside the ranges,
  // Buffer::release): FSDP's first saving. 0 where nothing is stale or the backend keeps the memory.
  size_t released_master_bytes() const;
  const TrainSettings& settings() const { return settings_; }

 private:
  // The settings and layout, checked (invalid_input naming what is wrong).
  static DataParallel checked(const TrainSettings& settings, const DataParallel& parallel);
  // A sharded optimizer's gather of the parameters (null where the state is whole), the masters it will
  // leave stale already given back.
  static std::unique_ptr<ParameterGather> make_gather(Model& model, const DataParallel& parallel);
  // The first parameter tensor, in backward order, with a non-finite gradient ("" when none): only after the
  // gradients' sum of squares came out non-finite.
  std::string first_non_finite_gradient();
  // The sum of the squares of every gradient, in float64 and a fixed order: the model's own, or, with the
  // optimizer state in shards, the shards' sums added in rank order.
  double gradient_sum_of_squares();
  void write_precision_map();
  // The micro-batches of this rank (of every emulated rank in turn), their gradients accumulated as
  // data_parallel.h says; returns the float64 sum of their losses.
  double accumulate(const BatchSource& data, float dloss, const std::function<void(StepPhase)>& phase);
  // Whether the sums start during the last micro-batch's backward (overlapped_sums.h).
  bool overlap_gradient_sums() const;
  // TrainSettings::host_part_began, where set.
  void host_part(std::string_view part) const {
    if (settings_.host_part_began) settings_.host_part_began(part);
  }
  // The elements of a bucket of the overlapped sums (DataParallel::bucket_elements; 0 there: one bucket).
  int64_t bucket_elements() const;
  // Each emulated rank's gradients added on the host, in rank order, as the ranks' sums add them: `sum` and
  // `group` hold the float32 gradients and, after them, the bf16 ones as codes (widened to float32).
  void add_emulated_rank(std::vector<float>& sum, const std::vector<float>& group, bool first) const;
  // The elements of the buffer of `storage` that hold the gradients of parameters [begin, end) within it:
  // one range, both buffers keeping the parameters' order (the zero padding between bf16 slices included).
  std::pair<int64_t, int64_t> gradient_range(Dtype storage, int64_t begin, int64_t end) const;
  // After an optimizer that holds a shard has updated it: starts the gathers of every rank's updated shard of
  // the parameters into the whole buffer, which the next forward waits for run by run, remaking the weight
  // copies (parameter_gather.h).
  void gather_parameters();

  Model& model_;
  TrainSettings settings_;
  DataParallel parallel_;
  int64_t gradient_floats_ = 0;  // the float32 gradients' extent, which the ranks sum
  int64_t gradient_codes_ = 0;   // the bf16 gradients' extent (train.weight_gradients = "bf16" on a GPU)
  float* gradient_base_ = nullptr;  // model.grads()
  // The two buffers' layouts for the ranks' sums (overlapped_sums.h: gradient_runs), fixed with the model.
  std::vector<GradientRun> float_runs_, code_runs_;
  void* gradient_codes_base_ = nullptr;  // model.grads_bf16()
  // FP8 scaling once per step, on several ranks (real or emulated); null on one.
  std::unique_ptr<StepScaling> step_scaling_;
  // The gradient sums started during this step's backward, of the float32 buffer and of the bf16 one; null
  // when none are.
  std::unique_ptr<OverlappedSums> overlapped_, overlapped_codes_;
  // A sharded optimizer's gather of the updated parameters; null where the state is whole.
  std::unique_ptr<ParameterGather> gather_;
  // The token-indexed gradient's sums over the rows read (DataParallel::sparse_embedding_sums); null: none.
  std::unique_ptr<TokenRowSums> token_rows_;
  std::function<void(const MicroBatch&)> probe_;
  AdamW optimizer_;
  LossScaler scaler_;
  int64_t step_ = 0;
  int64_t consecutive_skips_ = 0;
};

}  // namespace octet
