// The BF16 shadow of an FP8 run (docs/localization.md, "Shadow checks" and "Recalibration in a run"): a
// second model of the same shape in BF16, on the run's backend seen through an observing backend
// (calibration_observer.h), into which the FP8 model's weights are copied whenever it is used. It runs a
// step's first micro-batch again to compare the FP8 loss and weight gradients with BF16's, and measures the
// FP8 operands' statistics for a recalibration. It changes nothing of the FP8 model, its trainer or the data:
// its weights, gradients and activations are its own. Internal to the engine (training_run.cpp, tests).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "calibration_observer.h"
#include "octet/config/run_config.h"
#include "octet/model/calibration.h"
#include "octet/model/model.h"
#include "octet/telemetry/alerts.h"
#include "octet/train/trainer.h"

namespace octet {

// The cosine of two vectors in float64; nullopt where both are zero, 0 where one of them is, NaN where a
// value is not finite.
std::optional<double> gradient_cosine(const std::vector<float>& a, const std::vector<float>& b);

class ShadowModel {
 public:
  // `config`: the run's configuration (validated); the shadow takes its model shape, batch shape and seed.
  explicit ShadowModel(const RunConfig& config);
  ~ShadowModel();
  ShadowModel(const ShadowModel&) = delete;
  ShadowModel& operator=(const ShadowModel&) = delete;

  // The shadow check of `batch`, the first micro-batch of the step that makes `steps_done` steps, which
  // `model` (in fp8 mode) has just run forward and backward: the same tokens forward and backward in BF16
  // with model's weights, the two losses, and the weight-gradient cosine of every layer model runs in FP8.
  ShadowReading check(Model& model, const MicroBatch& batch, int64_t steps_done);
  // The statistics and calibrated scales (calibrate_layers: the amax, fp8.margin) of every operand of the
  // layers `model` runs in FP8, measured in BF16 on one micro-batch with model's current weights and the
  // gradient `dloss` (the run's, loss scale included).
  std::vector<CalibratedLayer> measure(Model& model, const std::vector<int32_t>& tokens,
                                       const std::vector<int32_t>& targets, float dloss);
  // Frees the shadow model (a precision schedule's switch may replace the run's backend); the next use
  // builds it again.
  void release();

 private:
  // The shadow model on model's backend, holding model's weights.
  Model& prepare(Model& model);

  RunConfig bf16_;
  int64_t B_ = 0;
  int64_t T_ = 0;
  Backend* built_on_ = nullptr;
  std::unique_ptr<ObservingBackend> observer_;
  std::unique_ptr<Model> shadow_;
};

}  // namespace octet
