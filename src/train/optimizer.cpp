// AdamW (see optimizer.h): weight decay on matrices only; every parameter in one backend call, a segment
// each, the weights with copies remaking them.
#include "octet/train/optimizer.h"

#include <algorithm>

#include "octet/check.h"

namespace octet {

AdamW::AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
             AdamWSettings settings)
    : backend_(backend), parameters_(parameters), settings_(settings) {
  m_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
  v_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
}

void AdamW::step(float* params, const float* grads, float learning_rate, float grad_scale,
                 std::span<const Model::WeightCopySlot> copies, const void* grads_bf16) {
  ++steps_;
  // The weights with copies first (each update remakes its copy), then every other tensor, in one call.
  std::vector<Backend::UpdateSegment> weights;
  std::vector<Backend::UpdateSegment> others;
  for (const ParameterInfo& p : parameters_) {
    Backend::UpdateSegment segment{.offset = p.offset,
                                   .count = p.count,
                                   .weight_decay = p.weight_decay ? settings_.weight_decay : 0.0f,
                                   .grad_offset = p.grad_offset};
    const auto slot = std::find_if(copies.begin(), copies.end(),
                                   [&](const Model::WeightCopySlot& s) { return s.offset == p.offset; });
    if (slot == copies.end()) {
      // A linear layer's bias names its layer's copy, where the backend may keep the bias's GEMM copy.
      const auto layer = std::find_if(copies.begin(), copies.end(), [&](const Model::WeightCopySlot& s) {
        return s.bias_offset == p.offset;
      });
      OCTET_CHECK(p.grad_type == Dtype::f32, "the gradient of {} in float32", p.name);
      if (layer != copies.end()) segment.bias_of = layer->copy->get();
      others.push_back(segment);
      continue;
    }
    OCTET_CHECK(slot->rows * slot->cols == p.count, "the weight copy of {} covers the whole parameter",
                p.name);
    segment.copy = slot->copy;
    segment.exec = slot->exec;
    segment.rows = slot->rows;
    segment.cols = slot->cols;
    if (p.grad_type == Dtype::bf16) {
      OCTET_CHECK(grads_bf16 != nullptr, "the bf16 gradients of {}", p.name);
      segment.grads_bf16 = static_cast<const uint16_t*>(grads_bf16) + p.grad_offset;
      segment.grad_offset = -1;
    }
    weights.push_back(segment);
  }
  weights.insert(weights.end(), others.begin(), others.end());
  const Backend::AdamWStep hyper{.learning_rate = learning_rate,
                                 .beta1 = settings_.beta1,
                                 .beta2 = settings_.beta2,
                                 .eps = settings_.eps,
                                 .step = steps_,
                                 .grad_scale = grad_scale};
  backend_.optimizer_update(hyper, {params, m_->floats(), v_->floats(), grads}, weights);
}

}  // namespace octet
