// A GPT and its trainer as telemetry's source (see telemetry_source.h).
#include "octet/train/telemetry_source.h"

#include <utility>

namespace octet {

std::vector<LinearLayerPrecision> ModelLayerSource::linear_layers() const {
  std::vector<LinearLayerPrecision> layers;
  layers.reserve(model_->policy().layers().size());
  for (const LinearPlan& plan : model_->policy().layers()) {
    layers.push_back({.name = plan.name,
                      .forward = plan.forward,
                      .input_gradient = plan.input_gradient,
                      .weight_gradient = plan.weight_gradient,
                      .reason = plan.reason});
  }
  return layers;
}

std::string ModelLayerSource::precision_map_json() const {
  return octet::precision_map_json(*model_);
}

const ScalingRecipe* ModelLayerSource::scaling_recipe() const {
  return model_->policy().recipe();
}

void ModelLayerSource::set_cast_telemetry(bool collect, bool measure_sqnr) {
  model_->set_telemetry(collect, measure_sqnr);
}

const Fp8LinearState* ModelLayerSource::fp8_state(std::string_view layer) {
  return model_->fp8_state(layer);
}

const Fp8LinearTelemetry* ModelLayerSource::cast_telemetry(std::string_view layer) {
  return model_->telemetry(layer);
}

void ModelLayerSource::move_layer_to_bf16(std::string_view layer, std::string reason) {
  model_->move_layer_to_bf16(layer, std::move(reason));
}

}  // namespace octet
