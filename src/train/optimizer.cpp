// AdamW (see optimizer.h): weight decay on matrices only; every parameter in one backend call, a segment
// each, the weights with copies remaking them; parameter groups' learning-rate multipliers and weight decays
// carried per segment.
#include "octet/train/optimizer.h"

#include <algorithm>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/model/precision_policy.h"

namespace octet {

AdamW::AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
             AdamWSettings settings)
    : backend_(backend),
      parameters_(parameters),
      settings_(settings),
      shard_(dist::shard_range(parameter_count, 0, 1)) {
  assign_groups();
  m_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
  v_ = backend_.allocate(static_cast<size_t>(parameter_count) * sizeof(float));
}

AdamW::AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
             AdamWSettings settings, dist::ShardRange shard)
    : backend_(backend), parameters_(parameters), settings_(settings), sharded_(true), shard_(shard) {
  OCTET_CHECK(shard.begin >= 0 && shard.begin <= shard.end && shard.end <= parameter_count,
              "a shard within the {} parameters, got {} .. {}", parameter_count, shard.begin, shard.end);
  assign_groups();
  // At least one element each, so that a rank whose shard is empty still holds buffers.
  const auto bytes = static_cast<size_t>(std::max<int64_t>(shard.size(), 1)) * sizeof(float);
  m_ = backend_.allocate(bytes);
  v_ = backend_.allocate(bytes);
}

void AdamW::assign_groups() {
  const std::vector<ParameterGroup>& groups = settings_.groups;
  std::vector<int64_t> matched(groups.size(), 0), held(groups.size(), 0);
  for (const ParameterInfo& p : parameters_) {
    int group = -1;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!glob_match(groups[g].match, p.name)) continue;
      ++matched[g];
      if (group < 0) group = static_cast<int>(g), ++held[g];
    }
    groups_.push_back(group);
    lr_scales_.push_back(group < 0 ? 1.0f : groups[group].lr_scale);
    const float decay =
        group >= 0 && groups[group].weight_decay ? *groups[group].weight_decay : settings_.weight_decay;
    decays_.push_back(p.weight_decay ? decay : 0.0f);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    OCTET_REQUIRE(matched[g] > 0,
                  "optimizer.groups: entry {} (match = \"{}\") matches no parameter; parameters are named as "
                  "\"{}\" and \"{}\" are",
                  g + 1, groups[g].match, parameters_.empty() ? "" : parameters_.front().name,
                  parameters_.size() < 2 ? "" : parameters_[parameters_.size() / 2].name);
    OCTET_REQUIRE(
        held[g] > 0,
        "optimizer.groups: entry {} (match = \"{}\") holds no parameter: the {} it matches are held "
        "by earlier groups (the first group that matches a parameter holds it)",
        g + 1, groups[g].match, matched[g]);
  }
}

void AdamW::check_groups(std::span<const Model::WeightCopySlot> copies) const {
  for (const Model::WeightCopySlot& slot : copies) {
    const int64_t end = slot.offset + slot.rows * slot.cols;
    const ParameterInfo* first = nullptr;
    size_t first_index = 0;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      const ParameterInfo& q = parameters_[i];
      if (q.offset < slot.offset || q.offset >= end) continue;
      if (first == nullptr) {
        first = &q, first_index = i;
        continue;
      }
      OCTET_REQUIRE(
          lr_scales_[i] == lr_scales_[first_index] && decays_[i] == decays_[first_index],
          "optimizer.groups: {} and {} are updated together (one layer's weight, whose copy one pass "
          "makes) and must share a learning rate and weight decay, but the group \"{}\" puts them "
          "apart; match both or neither",
          first->name, q.name, settings_.groups[groups_[i] >= 0 ? groups_[i] : groups_[first_index]].match);
    }
  }
}

std::string AdamW::groups_line() const {
  if (settings_.groups.empty()) return {};
  std::vector<std::string> parts;
  for (int g = -1; g < static_cast<int>(settings_.groups.size()); ++g) {
    int64_t count = 0, values = 0;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (groups_[i] != g) continue;
      ++count;
      values += parameters_[i].count;
    }
    const std::string held = fmt::format("{} parameter{} ({} values)", count, count == 1 ? "" : "s", values);
    if (g < 0) {
      if (count > 0) parts.push_back(fmt::format("no group: {}", held));
      continue;
    }
    const ParameterGroup& group = settings_.groups[g];
    const std::string decay = group.weight_decay ? fmt::format(", weight decay {}", *group.weight_decay) : "";
    parts.push_back(fmt::format("\"{}\" (lr x {}{}): {}", group.match, group.lr_scale, decay, held));
  }
  // Groups first, in their order, then the rest.
  if (!parts.empty() && parts.front().rfind("no group", 0) == 0)
    std::rotate(parts.begin(), parts.begin() + 1, parts.end());
  return fmt::format("optimizer groups: {}", fmt::join(parts, "; "));
}

void AdamW::step_shard(float* params, const float* grads, const Backend::AdamWStep& hyper,
                       const void* grads_bf16) {
  // Each parameter's part within the shard, one plain segment each; the moments hold the shard only, so
  // offsets count from the shard's start, while the gradients are the whole buffers.
  std::vector<Backend::UpdateSegment> segments;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ParameterInfo& p = parameters_[i];
    const int64_t begin = std::max(p.offset, shard_.begin), end = std::min(p.offset + p.count, shard_.end);
    if (begin >= end) continue;
    Backend::UpdateSegment segment{.offset = begin - shard_.begin,
                                   .count = end - begin,
                                   .weight_decay = decays_[i],
                                   .grad_offset = p.grad_offset + (begin - p.offset),
                                   .learning_rate_scale = lr_scales_[i]};
    if (p.grad_type == Dtype::bf16) {
      OCTET_CHECK(grads_bf16 != nullptr, "the bf16 gradients of {}", p.name);
      segment.grads_bf16 = static_cast<const uint16_t*>(grads_bf16) + segment.grad_offset;
      segment.grad_offset = -1;
    }
    segments.push_back(segment);
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
    step_shard(params, grads, hyper, grads_bf16);
    return;
  }
  // The weights with copies first (each update remakes its copy), then every other tensor, in one call.
  std::vector<Backend::UpdateSegment> weights;
  std::vector<Backend::UpdateSegment> others;
  // A weight copy may cover several parameters stored one after another (a fused layer's: Llama's q, k and v
  // projections): one segment for all of them, which lie one after another in the gradients too.
  int64_t covered_until = 0;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ParameterInfo& p = parameters_[i];
    if (p.offset < covered_until) continue;
    Backend::UpdateSegment segment{.offset = p.offset,
                                   .count = p.count,
                                   .weight_decay = decays_[i],
                                   .grad_offset = p.grad_offset,
                                   .learning_rate_scale = lr_scales_[i]};
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
    for (size_t j = 0; j < parameters_.size(); ++j) {
      const ParameterInfo& q = parameters_[j];
      if (q.offset < p.offset || q.offset >= p.offset + count) continue;
      OCTET_CHECK(
          q.offset + q.count <= p.offset + count && q.grad_type == p.grad_type &&
              q.grad_offset - p.grad_offset == q.offset - p.offset && decays_[j] == decays_[i] &&
              lr_scales_[j] == lr_scales_[i],
          "the weight copy at {} covers {} whole, its gradient beside the others', decayed and scaled "
          "alike",
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
