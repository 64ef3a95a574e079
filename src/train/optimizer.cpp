// AdamW (see optimizer.h): weight decay on matrices only; every parameter in one backend call, a segment
// each, the weights with copies remaking them.
#include "octet/train/optimizer.h"

#include <algorithm>

#include "octet/check.h"

namespace octet {

AdamW::AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
             AdamWSettings settings)
    : backend_(backend),
      parameters_(parameters),
      settings_(settings),
      shard_(dist::shard_range(parameter_count, 0, 1)) {
  m_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
  v_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
}

AdamW::AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
             AdamWSettings settings, dist::ShardRange shard)
    : backend_(backend), parameters_(parameters), settings_(settings), sharded_(true), shard_(shard) {
  OCTET_CHECK(shard.begin >= 0 && shard.begin <= shard.end && shard.end <= parameter_count,
              "a shard within the {} parameters, got {} .. {}", parameter_count, shard.begin, shard.end);
  // At least one element each, so that a rank whose shard is empty still holds buffers.
  const auto bytes = static_cast<size_t>(std::max<int64_t>(shard.size(), 1)) * sizeof(float);
  m_ = backend_.allocate(bytes);
  v_ = backend_.allocate(bytes);
}

void AdamW::step_shard(float* params, const float* grads, const Backend::AdamWStep& hyper) {
  // Each parameter's part within the shard, one plain segment each; the moments hold the shard only, so
  // offsets count from the shard's start, while the gradients are the whole buffer.
  std::vector<Backend::UpdateSegment> segments;
  for (const ParameterInfo& p : parameters_) {
    const int64_t begin = std::max(p.offset, shard_.begin), end = std::min(p.offset + p.count, shard_.end);
    if (begin >= end) continue;
    OCTET_CHECK(p.grad_type == Dtype::f32, "the gradient of {} in float32 for a sharded optimizer", p.name);
    segments.push_back({.offset = begin - shard_.begin,
                        .count = end - begin,
                        .weight_decay = p.weight_decay ? settings_.weight_decay : 0.0f,
                        .grad_offset = p.grad_offset + (begin - p.offset)});
  }
  if (segments.empty()) return;
  backend_.optimizer_update(hyper, {params + shard_.begin, m_->floats(), v_->floats(), grads}, segments);
}

void AdamW::step(float* params, const float* grads, float learning_rate, float grad_scale,
                 std::span<const Model::WeightCopySlot> copies, const void* grads_bf16) {
  ++steps_;
  const Backend::AdamWStep hyper{.learning_rate = learning_rate,
                                 .beta1 = settings_.beta1,
                                 .beta2 = settings_.beta2,
                                 .eps = settings_.eps,
                                 .step = steps_,
                                 .grad_scale = grad_scale};
  if (sharded_) {
    step_shard(params, grads, hyper);
    return;
  }
  // The weights with copies first (each update remakes its copy), then every other tensor, in one call.
  std::vector<Backend::UpdateSegment> weights;
  std::vector<Backend::UpdateSegment> others;
  // A weight copy may cover several parameters stored one after another (a fused layer's: Llama's q, k and v
  // projections): one segment for all of them, which lie one after another in the gradients too.
  int64_t covered_until = 0;
  for (const ParameterInfo& p : parameters_) {
    if (p.offset < covered_until) continue;
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
    const int64_t count = slot->rows * slot->cols;
    for (const ParameterInfo& q : parameters_) {
      if (q.offset < p.offset || q.offset >= p.offset + count) continue;
      OCTET_CHECK(q.offset + q.count <= p.offset + count && q.grad_type == p.grad_type &&
                      q.grad_offset - p.grad_offset == q.offset - p.offset &&
                      q.weight_decay == p.weight_decay,
                  "the weight copy at {} covers {} whole, its gradient beside the others' and decayed alike",
                  p.name, q.name);
    }
    segment.count = count;
    covered_until = p.offset + count;
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
  backend_.optimizer_update(hyper, {params, m_->floats(), v_->floats(), grads}, weights);
}

}  // namespace octet
