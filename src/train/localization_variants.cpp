// See localization_variants.h.
#include "localization_variants.h"

#include <bit>
#include <cmath>
#include <limits>

#include "octet/check.h"

namespace octet {

VariantRunner::VariantRunner(const ModelConfig& model, Backend& backend, const VariantBatches& batches,
                             std::vector<float> weights)
    : model_(model), backend_(backend), batches_(batches), weights_(std::move(weights)) {}

VariantResult VariantRunner::run(PrecisionPolicy policy, bool measure_numerics) {
  const int64_t B = batches_.batch_size, T = batches_.seq_len;
  const std::unique_ptr<Model> model = make_model(model_, backend_, std::move(policy), B, T);
  OCTET_CHECK(static_cast<size_t>(model->parameter_count()) == weights_.size(),
              "{} weights for the variant's model, got {}", model->parameter_count(), weights_.size());
  // Telemetry first: the weight casts happen when the copies are made.
  model->set_telemetry(measure_numerics, measure_numerics);
  backend_.copy_from_host(model->params(), weights_.data(), weights_.size() * sizeof(float));
  model->refresh_weight_copies();
  model->zero_grad();
  double loss = 0.0;
  for (size_t b = 0; b < batches_.tokens.size(); ++b) {
    loss += model->forward(batches_.tokens[b].data(), batches_.targets[b].data(), B, T, batches_.dloss);
    model->backward(batches_.dloss);
  }
  backend_.synchronize();
  VariantResult result;
  result.loss = loss / static_cast<double>(batches_.tokens.size());

  // Each linear layer's weight: the parameter that holds it (a tied head's is the token embedding).
  model->grads();  // zeroes the weight gradients no backward wrote
  const std::vector<Model::WeightCopySlot> slots = model->weight_copy_slots();
  const bool first = ranges_.empty();
  size_t at = 0;
  std::map<std::string, std::vector<float>> fetched;  // parameter name -> its gradient on the host
  for (const Model::WeightCopySlot& slot : slots) {
    const ParameterInfo* holder = nullptr;
    for (const ParameterInfo& p : model->parameters()) {
      if (slot.offset >= p.offset && slot.offset < p.offset + p.count) holder = &p;
    }
    OCTET_CHECK(holder != nullptr, "the parameter holding layer {}'s weight", slot.layer);
    auto it = fetched.find(holder->name);
    if (it == fetched.end()) {
      std::vector<float> g(static_cast<size_t>(holder->count));
      const void* device = model->gradient(*holder);
      if (holder->grad_type == Dtype::f32) {
        backend_.copy_to_host(g.data(), device, g.size() * sizeof(float));
      } else {
        std::vector<uint16_t> bits(g.size());
        backend_.copy_to_host(bits.data(), device, bits.size() * sizeof(uint16_t));
        for (size_t i = 0; i < g.size(); ++i)
          g[i] = std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16);
      }
      it = fetched.emplace(holder->name, std::move(g)).first;
    }
    const auto begin = static_cast<size_t>(slot.offset - holder->offset);
    const auto count = static_cast<size_t>(slot.rows * slot.cols);
    result.gradients.insert(result.gradients.end(), it->second.begin() + static_cast<std::ptrdiff_t>(begin),
                            it->second.begin() + static_cast<std::ptrdiff_t>(begin + count));
    if (first) ranges_.push_back({std::string(slot.layer), at, count});
    at += count;
  }
  if (measure_numerics) {
    for (const LinearPlan& p : model->policy().layers()) {
      if (!p.fp8()) continue;
      if (const Fp8LinearTelemetry* t = model->telemetry(p.name)) result.telemetry[p.name] = *t;
    }
  }
  return result;
}

double gradient_cosine(const std::vector<float>& a, const std::vector<float>& b, size_t begin, size_t count) {
  double dot = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = begin; i < begin + count; ++i) {
    const double x = a[i], y = b[i];
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  if (!std::isfinite(dot) || !std::isfinite(aa) || !std::isfinite(bb)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (aa == 0.0 && bb == 0.0) return 1.0;
  if (aa == 0.0 || bb == 0.0) return 0.0;
  return std::clamp(dot / std::sqrt(aa * bb), -1.0, 1.0);
}

}  // namespace octet
