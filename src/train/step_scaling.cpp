// FP8 scaling once per optimizer step (see step_scaling.h).
#include "step_scaling.h"

#include <cmath>

#include "octet/check.h"

namespace octet {

namespace {

// The larger amax, NaN when either is: a NaN amax must count as it would have in one cast of the whole batch.
float larger(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return b > a ? b : a;
}

}  // namespace

StepScaling::StepScaling(Model& model) : model_(model) {}

void StepScaling::begin() {
  // The FP8 layers as they are now (an alert may have moved one to BF16 since the last step).
  names_.clear();
  restored_.clear();
  layers_.clear();
  const PrecisionPolicy& policy = model_.policy();
  if (policy.recipe() == nullptr) return;
  const Fp8Formats formats = policy.formats();
  std::vector<std::string> all;
  for (const LinearPlan& plan : policy.layers()) all.push_back(plan.name);
  const std::vector<Fp8LinearState*> states = model_.fp8_states(all);
  for (size_t i = 0; i < all.size(); ++i) {
    if (states[i] == nullptr) continue;
    names_.push_back(all[i]);
    layers_.push_back({{{&Fp8LinearState::activation, formats.activation, states[i]->activation},
                        {&Fp8LinearState::gradient, formats.gradient, states[i]->gradient}}});
  }
}

void StepScaling::after_micro_batch(bool last) {
  restored_.clear();
  if (names_.empty()) return;
  const std::vector<Fp8LinearState*> live = model_.fp8_states(names_);
  for (size_t i = 0; i < live.size(); ++i) {
    OCTET_CHECK(live[i] != nullptr, "{} in FP8 for the whole step", names_[i]);
    for (Operand& o : layers_[i].operands) {
      ScalingState& state = live[i]->*o.state;
      const int64_t casts = state.updates - o.at_begin.updates;
      // One cast of each operand a micro-batch: a second would have cast with a scale the first had moved.
      OCTET_CHECK(casts == 0 || casts == 1, "one scaling update of an operand of {} per micro-batch, saw {}",
                  names_[i], casts);
      if (casts == 0) continue;
      o.step_amax = o.cast ? larger(o.step_amax, state.last_amax) : state.last_amax;
      o.cast = true;
      state = o.at_begin;
    }
  }
  if (last) {
    restored_ = live;
    return;
  }
  publish(live);
}

void StepScaling::finish(dist::Communicator* communicator) {
  if (names_.empty()) return;
  if (communicator != nullptr) {
    // An operand is cast on some ranks only where its layer saw no rows on the others (an expert no token
    // of a rank's micro-batches reached): it takes the update on every rank if any rank cast it, as one rank
    // casting the whole batch would. A rank that cast nothing sends -1, below every amax (a NaN wins).
    std::vector<float> amaxes;
    amaxes.reserve(2 * layers_.size());
    for (const Layer& l : layers_) {
      for (const Operand& o : l.operands) amaxes.push_back(o.cast ? o.step_amax : -1.0f);
    }
    communicator->all_reduce_max(amaxes);
    size_t at = 0;
    for (Layer& l : layers_) {
      for (Operand& o : l.operands) {
        const float amax = amaxes[at++];
        o.cast = !(amax < 0.0f);
        if (o.cast) o.step_amax = amax;
      }
    }
  }
  const ScalingRecipe& recipe = *model_.policy().recipe();
  // The states the last micro-batch restored, still on the host; fetched where it sent them.
  const std::vector<Fp8LinearState*> live = restored_.empty() ? model_.fp8_states(names_) : restored_;
  restored_.clear();
  for (size_t i = 0; i < live.size(); ++i) {
    for (const Operand& o : layers_[i].operands) {
      if (!o.cast) continue;
      ScalingState& state = live[i]->*o.state;
      state = o.at_begin;
      recipe.update(state, o.step_amax, o.format);
    }
  }
  publish(live);
}

void StepScaling::publish(const std::vector<Fp8LinearState*>& live) {
  std::vector<const Fp8LinearState*> states(live.begin(), live.end());
  model_.backend().publish_scaling(std::span<const Fp8LinearState* const>(states));
}

}  // namespace octet
