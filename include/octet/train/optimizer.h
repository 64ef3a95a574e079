// AdamW over float32 master weights with decoupled weight decay on matrices only (every 2-D parameter), as
// torch.optim.AdamW applies it: p -= lr * wd * p, then the Adam update with bias-corrected moments.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/config/train_settings.h"
#include "octet/dist/communicator.h"
#include "octet/model/model.h"

namespace octet {

class AdamW {
 public:
  AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
        AdamWSettings settings);
  // The same for one shard of the parameters (ZeRO stage 1, data_parallel.h): the moments of elements
  // shard.begin .. shard.end - 1 of the parameter buffer only, and step() updates those elements only.
  AdamW(Backend& backend, const std::vector<ParameterInfo>& parameters, int64_t parameter_count,
        AdamWSettings settings, dist::ShardRange shard);
  // One update of params from grads * grad_scale (grad_scale undoes loss scaling and applies clipping). The
  // weights of `copies` have their copies remade in the same pass (Backend::optimizer_update). Each
  // parameter's gradient is at its grad_offset in grads, or in grads_bf16 where its grad_type is bf16
  // (Model::grads(), Model::grads_bf16()). A sharded optimizer updates its shard of params (from the
  // gradients at the same places) and remakes no copies: the caller gathers the parameters and remakes them.
  void step(float* params, const float* grads, float learning_rate, float grad_scale,
            std::span<const Model::WeightCopySlot> copies = {}, const void* grads_bf16 = nullptr);
  int64_t steps() const { return steps_; }
  // For resuming from a checkpoint: the number of updates already made (the bias correction depends on it).
  void restore_steps(int64_t steps) { steps_ = steps; }
  const AdamWSettings& settings() const { return settings_; }
  // The moments of every parameter, or of the shard's elements only when sharded.
  float* first_moment() { return m_->floats(); }
  float* second_moment() { return v_->floats(); }
  bool sharded() const { return sharded_; }
  const dist::ShardRange& shard() const { return shard_; }

 private:
  void step_shard(float* params, const float* grads, const Backend::AdamWStep& hyper);

  Backend& backend_;
  std::vector<ParameterInfo> parameters_;
  AdamWSettings settings_;
  std::unique_ptr<Buffer> m_;
  std::unique_ptr<Buffer> v_;
  int64_t steps_ = 0;
  bool sharded_ = false;
  dist::ShardRange shard_;  // every element when not sharded
};

}  // namespace octet
