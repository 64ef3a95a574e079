// What the telemetry recorder (recorder.h) reads from a training run, as plain data and one small interface:
// the numbers of each optimizer step (StepStatistics), and the model's linear layers with, for those in FP8,
// their scaling state and cast telemetry (Fp8LayerSource). Nothing here names a model or a trainer: the
// training side adapts its own types to these (train/telemetry_source.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/precision.h"
#include "octet/numerics/scaling.h"

namespace octet {

// One optimizer step as the run's step table records it.
struct StepStatistics {
  int64_t step = 0;   // 0-based index of this optimizer step
  float loss = 0.0f;  // mean over the step's micro-batches
  float learning_rate = 0.0f;
  float grad_norm = 0.0f;   // global norm of the unscaled gradient, before clipping
  float loss_scale = 1.0f;  // used by this step
  bool skipped = false;
  std::string skip_reason;  // e.g. "non-finite gradient in h.3.mlp.c_fc.weight"
  int64_t fp8_gemms = 0;    // GEMMs of this step that ran in FP8
  int64_t other_gemms = 0;  // and the others
  int64_t tokens = 0;
};

// How one linear layer's three GEMMs run now, and why.
struct LinearLayerPrecision {
  std::string name;  // as the model names the layer, e.g. "h.0.attn.c_attn"
  GemmMode forward = GemmMode::f32;
  GemmMode input_gradient = GemmMode::f32;
  GemmMode weight_gradient = GemmMode::f32;
  std::string reason;  // why the layer runs as it does
  // True when any of the layer's GEMMs runs in FP8.
  bool fp8() const {
    return forward == GemmMode::fp8 || input_gradient == GemmMode::fp8 || weight_gradient == GemmMode::fp8;
  }
};

// A model's FP8 linear layers as telemetry sees them.
class Fp8LayerSource {
 public:
  virtual ~Fp8LayerSource() = default;
  // Every linear layer, in the model's order, as it runs now.
  virtual std::vector<LinearLayerPrecision> linear_layers() const = 0;
  // The per-layer precision map as JSON (what RUN_DIR/precision_map.json holds).
  virtual std::string precision_map_json() const = 0;
  // The FP8 scaling recipe (null when no layer runs in FP8).
  virtual const ScalingRecipe* scaling_recipe() const = 0;
  // Whether the FP8 casts keep running totals of what they saw, and whether they also add the signal and
  // noise energies behind each cast's SQNR (a dequantizing pass per cast).
  virtual void set_cast_telemetry(bool collect, bool measure_sqnr) = 0;
  // The scaling state and the cast telemetry's running totals of an FP8 layer (null when the layer is not in
  // FP8), brought up to date from the backend first: a copy from the device on a GPU, so call them on
  // telemetry steps only.
  virtual const Fp8LinearState* fp8_state(std::string_view layer) = 0;
  virtual const Fp8LinearTelemetry* cast_telemetry(std::string_view layer) = 0;
  // Runs all three GEMMs of `layer` in BF16 from the next step on, with `reason` as the layer's reason in the
  // precision map.
  virtual void move_layer_to_bf16(std::string_view layer, std::string reason) = 0;
};

}  // namespace octet
