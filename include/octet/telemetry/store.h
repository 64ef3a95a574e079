// The telemetry store: RUN_DIR/telemetry.sqlite, written off the training thread. The step only enqueues
// plain records; a writer thread takes whatever is queued and writes it in one transaction. The schema is
// fixed (docs/telemetry.md): octet inspect and octet report read it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

namespace octet {

inline constexpr const char* kTelemetryFile = "telemetry.sqlite";

// One row of each table; optional fields are NULL when absent.
struct RunInfoRecord {
  std::string key;
  std::string value;
  bool keep_existing = false;  // a resumed run keeps the first value (started_at)
};
struct StepRecord {
  int64_t step = 0;  // steps done: 1 for the first optimizer step
  std::optional<double> loss;
  double learning_rate = 0.0;
  std::optional<double> grad_norm;  // NULL for skipped steps
  double loss_scale = 1.0;
  bool skipped = false;
  std::optional<std::string> skip_reason;
  int64_t tokens = 0;
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
  int64_t fp8_gemms = 0;
  int64_t other_gemms = 0;
};
struct ValidationRecord {
  int64_t step = 0;
  double loss = 0.0;
};
struct TensorRecord {
  int64_t step = 0;
  std::string layer;   // "h.0.attn.c_attn", ..., "lm_head"
  std::string tensor;  // "activation", "weight", "gradient"
  std::optional<double> amax;
  std::optional<double> scale;
  std::optional<double> saturated_fraction;
  std::optional<double> underflow_fraction;
  std::optional<double> sqnr_db;
};
struct GemmRecord {
  std::string layer;
  std::string gemm;  // "forward", "input_gradient", "weight_gradient"
  std::string mode;  // "f32", "bf16", "f16", "fp8"
  std::string reason;
  int64_t since_step = 0;  // 0: from the start; otherwise the first step that runs this way
};
struct PhaseRecord {
  int64_t step = 0;
  std::string phase;
  double ms = 0.0;
};
// A BF16 shadow check's losses (docs/localization.md, "Shadow checks").
struct ShadowLossRecord {
  int64_t step = 0;
  std::optional<double> fp8_loss;
  std::optional<double> bf16_loss;
  std::optional<double> relative_difference;
};
// One FP8 layer's weight-gradient cosine in a shadow check (NULL where both gradients are zero).
struct ShadowLayerRecord {
  int64_t step = 0;
  std::string layer;
  std::optional<double> cosine;
};
// One operand's scale changed by a recalibration in the run.
struct RecalibrationRecord {
  int64_t step = 0;
  std::string layer;
  std::string tensor;  // "activation", "weight", "gradient"
  double scale_before = 1.0;
  double scale_after = 1.0;
  std::optional<double> amax;  // the statistic measured (NULL: none seen, scale kept)
  std::string reason;          // "every 100 steps", or the alert that asked for it
};
// One linear layer of the precision map the run applied (fp8.precision_map, written by `octet localize`):
// what localization measured and chose. Measurements are NULL for a layer the policy excluded.
struct LocalizationRecord {
  std::string layer;
  int64_t position = 0;  // the layer's index in the map (the policy's order)
  std::string choice;    // "fp8", "bf16", "excluded"
  std::string reason;
  std::optional<double> fp8_loss_change;       // relative loss change, this layer alone in FP8
  std::optional<double> bf16_loss_change;      // this layer alone in BF16 (against all in FP8)
  std::optional<double> fp8_gradient_cosine;   // its weight gradient's cosine, alone in FP8 vs all BF16
  std::optional<double> bf16_gradient_cosine;  // alone in BF16 vs all FP8
  std::optional<double> bf16_ms;               // its three GEMMs in BF16, per micro-batch
  std::optional<double> fp8_ms;                // in FP8, with the casts
  std::optional<double> sqnr_db[3];            // activation, weight, gradient casts
};
struct EventRecord {
  std::optional<int64_t> step;
  // saturation, underflow, scale_jump, shadow_loss, shadow_cosine, skipped_step, layer_to_bf16,
  // recalibration, mode_change, stop, info
  std::string kind;
  std::optional<std::string> layer;
  std::optional<std::string> tensor;
  std::optional<double> value;
  std::optional<double> threshold;
  std::string message;
};
using TelemetryRecord =
    std::variant<RunInfoRecord, StepRecord, ValidationRecord, TensorRecord, GemmRecord, PhaseRecord,
                 EventRecord, ShadowLossRecord, ShadowLayerRecord, RecalibrationRecord, LocalizationRecord>;

// What a resumed run takes over from the database: the alerts already raised (layer, tensor, kind), and the
// layers an alert moved to BF16 (with the reason) at or before the step the run resumes at.
struct TelemetryResume {
  std::set<std::tuple<std::string, std::string, std::string>> alerts_raised;
  std::vector<std::pair<std::string, std::string>> layers_in_bf16;
  bool has_gemms = false;     // the start's gemms rows are there already
  std::optional<int64_t> at;  // the steps done at the checkpoint resumed from
  std::string mode;           // the run table's mode before this run (empty when it had none)
  // The mode each (layer, gemm) runs in at step at + 1 as the gemms table has it (its newest row up to then),
  // so that a run resumed in another mode can say which GEMMs changed.
  std::map<std::pair<std::string, std::string>, std::string> gemm_modes;
};

class TelemetryStore {
 public:
  // Opens `path` (created when missing), creates the tables when missing and starts the writer thread.
  // With resume_at (the steps a resumed run has done), rows of later steps are deleted (events, gemms,
  // validation, phases) or replaced when written again (steps, tensor_stats); the localization rows are
  // deleted, for the resumed run to record the precision map it applies now. Throws octet::Error
  // (invalid input, exit code 2) naming the file when it cannot be opened or is not a telemetry database.
  explicit TelemetryStore(const std::filesystem::path& path, std::optional<int64_t> resume_at = std::nullopt);
  // Flushes and closes; never throws (call close() to see errors).
  ~TelemetryStore();
  TelemetryStore(const TelemetryStore&) = delete;
  TelemetryStore& operator=(const TelemetryStore&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const TelemetryResume& resumed() const { return resumed_; }

  // Queues a record for the writer; cheap. Throws the writer's error (training_failed) if writing failed.
  void add(TelemetryRecord record);
  // Blocks until everything queued so far is written.
  void flush();
  // Flushes, stops the writer and closes the database. Idempotent.
  void close();

 private:
  struct Writer;
  void run_writer();
  void throw_if_failed();

  std::filesystem::path path_;
  TelemetryResume resumed_;
  std::unique_ptr<Writer> writer_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable written_;
  std::vector<TelemetryRecord> queue_;
  uint64_t queued_ = 0;         // records ever queued
  uint64_t written_count_ = 0;  // records ever written
  bool stopping_ = false;
  std::string error_;
  std::thread thread_;
};

}  // namespace octet
