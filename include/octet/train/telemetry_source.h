// The training side of telemetry's source (telemetry/source.h): a model's linear layers as an Fp8LayerSource,
// and a trainer's step result as the step's statistics. Thin adapters, so that telemetry reads a run without
// knowing the model or the trainer.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "octet/model/model.h"
#include "octet/telemetry/source.h"
#include "octet/train/trainer.h"

namespace octet {

class ModelLayerSource final : public Fp8LayerSource {
 public:
  // `model` must outlive this source.
  explicit ModelLayerSource(Model& model) : model_(&model) {}
  // The layers of `model` from now on, which replaced the model this source read (a run's switch of
  // precision mode, precision_schedule.h); it must outlive this source too.
  void rebind(Model& model) { model_ = &model; }

  std::vector<LinearLayerPrecision> linear_layers() const override;
  std::string precision_map_json() const override;
  const ScalingRecipe* scaling_recipe() const override;
  void set_cast_telemetry(bool collect, bool measure_sqnr) override;
  const Fp8LinearState* fp8_state(std::string_view layer) override;
  const Fp8LinearTelemetry* cast_telemetry(std::string_view layer) override;
  void move_layer_to_bf16(std::string_view layer, std::string reason) override;

 private:
  Model* model_;
};

}  // namespace octet
