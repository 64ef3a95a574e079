// AdamW (see optimizer.h): one backend update per parameter tensor, so that weight decay applies to
// matrices only.
#include "octet/train/optimizer.h"

namespace octet {

AdamW::AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
             AdamWSettings settings)
    : backend_(backend), parameters_(parameters), settings_(settings) {
  m_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
  v_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
}

void AdamW::step(float* params, const float* grads, float learning_rate, float grad_scale) {
  ++steps_;
  for (const ParameterInfo& p : parameters_) {
    backend_.adamw_update(params + p.offset, m_->floats() + p.offset, v_->floats() + p.offset,
                          grads + p.offset, p.count, learning_rate, settings_.beta1, settings_.beta2,
                          settings_.eps, p.weight_decay ? settings_.weight_decay : 0.0f, steps_, grad_scale);
  }
}

}  // namespace octet
