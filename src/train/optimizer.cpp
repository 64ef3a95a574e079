// AdamW (see optimizer.h): one backend update per parameter tensor, so that weight decay applies to
// matrices only.
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
                 std::span<const Gpt2::WeightCopySlot> copies) {
  ++steps_;
  for (const ParameterInfo& p : parameters_) {
    const float decay = p.weight_decay ? settings_.weight_decay : 0.0f;
    const auto slot = std::find_if(copies.begin(), copies.end(),
                                   [&](const Gpt2::WeightCopySlot& s) { return s.offset == p.offset; });
    if (slot == copies.end()) {
      backend_.adamw_update(params + p.offset, m_->floats() + p.offset, v_->floats() + p.offset,
                            grads + p.offset, p.count, learning_rate, settings_.beta1, settings_.beta2,
                            settings_.eps, decay, steps_, grad_scale);
      continue;
    }
    OCTET_CHECK(slot->rows * slot->cols == p.count, "the weight copy of {} covers the whole parameter",
                p.name);
    backend_.adamw_update_weight(params + p.offset, m_->floats() + p.offset, v_->floats() + p.offset,
                                 grads + p.offset, slot->rows, slot->cols, learning_rate, settings_.beta1,
                                 settings_.beta2, settings_.eps, decay, steps_, grad_scale, *slot->copy,
                                 *slot->exec);
  }
}

}  // namespace octet
