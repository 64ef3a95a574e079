// AdamW over float32 master weights with decoupled weight decay on matrices only (every 2-D parameter), as
// torch.optim.AdamW applies it: p -= lr * wd * p, then the Adam update with bias-corrected moments. Parameter
// groups (AdamWSettings::groups, by name glob, the first match holding a parameter) scale the learning rate
// of their parameters and may set their own weight decay, as torch's param groups' lr and weight_decay do.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/config/train_settings.h"
#include "octet/dist/communicator.h"
#include "octet/model/model.h"

namespace octet {

class AdamW {
 public:
  // Throws invalid_input naming a group whose glob matches no parameter, or holds none (earlier groups hold
  // every parameter it matches).
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
  // Throws invalid_input where a weight copy covers parameters of different groups (a fused layer's, such as
  // Llama's q, k and v projections, which one pass updates): they must share a learning rate and decay.
  void check_groups(std::span<const Model::WeightCopySlot> copies) const;
  // One line for the startup log: each group, its settings and how many parameters (and values) it holds,
  // and the parameters no group holds; empty without groups.
  std::string groups_line() const;
  // A parameter's learning-rate multiplier and weight decay (0 for those that do not decay), by its index in
  // the parameters.
  float learning_rate_scale(size_t parameter) const { return lr_scales_[parameter]; }
  float weight_decay(size_t parameter) const { return decays_[parameter]; }
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
  void step_shard(float* params, const float* grads, const Backend::AdamWStep& hyper, const void* grads_bf16);
  // Each parameter's group (-1: none), learning-rate multiplier and weight decay.
  void assign_groups();

  Backend& backend_;
  std::vector<ParameterInfo> parameters_;
  AdamWSettings settings_;
  std::vector<int> groups_;  // per parameter
  std::vector<float> lr_scales_;
  std::vector<float> decays_;
  std::unique_ptr<Buffer> m_;
  std::unique_ptr<Buffer> v_;
  int64_t steps_ = 0;
  bool sharded_ = false;
  dist::ShardRange shard_;  // every element when not sharded
};

}  // namespace octet
