// The BF16 shadow of an FP8 run (see shadow_check.h).
#include "shadow_check.h"

#include <bit>
#include <cmath>
#include <map>
#include <string>

#include "cosine_sums.h"
#include "octet/check.h"

namespace octet {
namespace {

// The parameter whose elements hold params() offset `offset`.
const ParameterInfo& parameter_at(const Model& model, int64_t offset) {
  for (const ParameterInfo& p : model.parameters()) {
    if (p.offset <= offset && offset < p.offset + p.count) return p;
  }
  OCTET_CHECK(false, "a parameter at offset {}", offset);
  return model.parameters().front();
}

// Elements [first, first + count) of p's gradient in `model`, as float32 on the host.
std::vector<float> host_gradient(Model& model, const ParameterInfo& p, int64_t first, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  const void* gradient = model.gradient(p);
  if (p.grad_type == Dtype::f32) {
    model.backend().copy_to_host(values.data(), static_cast<const float*>(gradient) + first,
                                 values.size() * sizeof(float));
    return values;
  }
  OCTET_CHECK(p.grad_type == Dtype::bf16, "a gradient in f32 or bf16, got {}", dtype_name(p.grad_type));
  std::vector<uint16_t> bits(values.size());
  model.backend().copy_to_host(bits.data(), static_cast<const uint16_t*>(gradient) + first,
                               bits.size() * sizeof(uint16_t));
  for (size_t i = 0; i < bits.size(); ++i)
    values[i] = std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16);
  return values;
}

}  // namespace

std::optional<double> gradient_cosine(const std::vector<float>& a, const std::vector<float>& b) {
  OCTET_CHECK(a.size() == b.size(), "two gradients of one size, got {} and {}", a.size(), b.size());
  CosineSums sums;
  sums.add(a, b);
  if (sums.both_zero()) return std::nullopt;  // no angle to speak of
  return sums.cosine();
}

ShadowModel::ShadowModel(const RunConfig& config)
    : bf16_(config_in_mode(config, MixedPrecision::bf16)),
      B_(config.train.batch_size),
      T_(config.train.seq_len) {
  bf16_.precision.calibration.clear();
}

ShadowModel::~ShadowModel() = default;

void ShadowModel::release() {
  shadow_.reset();
  observer_.reset();
  built_on_ = nullptr;
}

Model& ShadowModel::prepare(Model& model) {
  if (!shadow_ || built_on_ != &model.backend()) {
    release();
    observer_ = std::make_unique<ObservingBackend>(model.backend());
    shadow_ =
        make_model(bf16_.model, *observer_, PrecisionPolicy(bf16_.precision, bf16_.model, B_ * T_), B_, T_);
    shadow_->set_telemetry(false, false);
    built_on_ = &model.backend();
  }
  OCTET_CHECK(shadow_->parameter_count() == model.parameter_count(),
              "a shadow model of the run's {} parameters, got {}", model.parameter_count(),
              shadow_->parameter_count());
  // Through the host: a copy of the weights every shadow_every steps, not every step.
  std::vector<float> params(static_cast<size_t>(model.parameter_count()));
  model.backend().copy_to_host(params.data(), model.params(), params.size() * sizeof(float));
  shadow_->backend().copy_from_host(shadow_->params(), params.data(), params.size() * sizeof(float));
  shadow_->refresh_weight_copies();
  return *shadow_;
}

ShadowReading ShadowModel::check(Model& model, const MicroBatch& batch, int64_t steps_done) {
  OCTET_CHECK(batch.B == B_ && batch.T == T_, "a micro-batch of {} x {}, got {} x {}", B_, T_, batch.B,
              batch.T);
  Model& shadow = prepare(model);
  shadow.zero_grad();
  const float bf16_loss = shadow.forward(batch.tokens, batch.targets, B_, T_, batch.dloss);
  shadow.backward(batch.dloss);
  ShadowReading reading;
  reading.step = steps_done;
  reading.fp8_loss = batch.loss;
  reading.bf16_loss = bf16_loss;
  // A layer's weight may be more than one copy slot (one per expert): its cosine is over all of them.
  std::vector<std::string> order;
  std::map<std::string, CosineSums> sums;
  for (const Model::WeightCopySlot& slot : model.weight_copy_slots()) {
    if (!model.policy().layer(slot.layer).fp8()) continue;
    const ParameterInfo& fp8_parameter = parameter_at(model, slot.offset);
    const ParameterInfo& bf16_parameter = shadow.parameter(fp8_parameter.name);
    const int64_t first = slot.offset - fp8_parameter.offset, count = slot.rows * slot.cols;
    const std::string layer(slot.layer);
    if (!sums.contains(layer)) order.push_back(layer);
    sums[layer].add(host_gradient(model, fp8_parameter, first, count),
                    host_gradient(shadow, bf16_parameter, first, count));
  }
  for (const std::string& layer : order) {
    const CosineSums& s = sums[layer];
    reading.cosines.emplace_back(layer, s.both_zero() ? std::nullopt : std::optional<double>(s.cosine()));
  }
  return reading;
}

std::vector<CalibratedLayer> ShadowModel::measure(Model& model, const std::vector<int32_t>& tokens,
                                                  const std::vector<int32_t>& targets, float dloss) {
  OCTET_CHECK(tokens.size() == static_cast<size_t>(B_ * T_) && targets.size() == tokens.size(),
              "a micro-batch of {} x {} tokens, got {}", B_, T_, tokens.size());
  Model& shadow = prepare(model);
  observer_->clear_watched();
  CalibrationPass pass;
  pass.batches = 1;
  pass.batch_size = B_;
  pass.seq_len = T_;
  pass.dloss = dloss;
  pass.statistic = CalibrationStatistic::amax;
  pass.margin = bf16_.precision.margin;
  std::vector<CalibratedLayer> layers = calibrate_layers(
      shadow, *observer_, model.policy(),
      [&](int32_t* t, int32_t* g) {
        std::copy(tokens.begin(), tokens.end(), t);
        std::copy(targets.begin(), targets.end(), g);
      },
      pass);
  observer_->clear_watched();
  return layers;
}

}  // namespace octet
