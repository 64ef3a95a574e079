// AdamW (see optimizer.h): weight decay on matrices only; the weights with copies are updated in one call,
// every other tensor in one segmented update.
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
  // The weights with copies in one call (each update remakes its copy); every other tensor in another.
  std::vector<Backend::WeightUpdate> weights;
  std::vector<Backend::AdamWSegment> others;
  for (const ParameterInfo& p : parameters_) {
    const float decay = p.weight_decay ? settings_.weight_decay : 0.0f;
    const auto slot = std::find_if(copies.begin(), copies.end(),
                                   [&](const Model::WeightCopySlot& s) { return s.offset == p.offset; });
    if (slot == copies.end()) {
      // A linear layer's bias names its layer's copy, where the backend may keep the bias's GEMM copy.
      const auto layer = std::find_if(copies.begin(), copies.end(), [&](const Model::WeightCopySlot& s) {
        return s.bias_offset == p.offset;
      });
      OCTET_CHECK(p.grad_type == Dtype::f32, "the gradient of {} in float32", p.name);
      others.push_back(
          {p.offset, p.count, decay, layer == copies.end() ? nullptr : layer->copy->get(), p.grad_offset});
      continue;
    }
    OCTET_CHECK(slot->rows * slot->cols == p.count, "the weight copy of {} covers the whole parameter",
                p.name);
    Backend::WeightUpdate w{p.offset, slot->rows, slot->cols, decay, slot->copy, slot->exec};
    if (p.grad_type == Dtype::bf16) {
      OCTET_CHECK(grads_bf16 != nullptr, "the bf16 gradients of {}", p.name);
      w.grads_bf16 = static_cast<const uint16_t*>(grads_bf16) + p.grad_offset;
    } else {
      w.grad_offset = p.grad_offset;
    }
    weights.push_back(w);
  }
  backend_.adamw_update_weights(params, m_->floats(), v_->floats(), grads, weights, learning_rate,
                                settings_.beta1, settings_.beta2, settings_.eps, steps_, grad_scale);
  backend_.adamw_update_segments(params, m_->floats(), v_->floats(), grads, others, learning_rate,
                                 settings_.beta1, settings_.beta2, settings_.eps, steps_, grad_scale);
}

}  // namespace octet
