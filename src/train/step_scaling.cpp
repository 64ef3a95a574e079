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
  operands_.clear();
  const PrecisionPolicy& policy = model_.policy();
  if (policy.recipe() == nullptr) return;
  const Fp8Formats formats = policy.formats();
  for (const LinearPlan& plan : policy.layers()) {
    const Fp8LinearState* state = model_.fp8_state(plan.name);
    if (state == nullptr) continue;
    operands_.push_back({plan.name, &Fp8LinearState::activation, formats.activation, state->activation});
    operands_.push_back({plan.name, &Fp8LinearState::gradient, formats.gradient, state->gradient});
  }
}

void StepScaling::after_micro_batch() {
  for (Operand& o : operands_) {
    Fp8LinearState* live = model_.fp8_state(o.layer);
    OCTET_CHECK(live != nullptr, "{} in FP8 for the whole step", o.layer);
    ScalingState& state = live->*o.state;
    const int64_t casts = state.updates - o.at_begin.updates;
    // One cast of each operand a micro-batch: a second would have cast with a scale the first had moved.
    OCTET_CHECK(casts == 0 || casts == 1, "one scaling update of an operand of {} per micro-batch, saw {}",
                o.layer, casts);
    if (casts == 0) continue;
    o.step_amax = o.cast ? larger(o.step_amax, state.last_amax) : state.last_amax;
    o.cast = true;
    state = o.at_begin;
    model_.backend().publish_scaling(*live);
  }
}

void StepScaling::finish(dist::Communicator* communicator) {
  if (operands_.empty()) return;
  if (communicator != nullptr) {
    // An operand no micro-batch cast (a layer whose GEMMs that read it are not FP8) takes no update on any
    // rank: every rank runs the same layers. Its amax stays 0 here and is ignored below.
    std::vector<float> amaxes;
    amaxes.reserve(operands_.size());
    for (const Operand& o : operands_) amaxes.push_back(o.step_amax);
    communicator->all_reduce_max(amaxes);
    for (size_t i = 0; i < operands_.size(); ++i) operands_[i].step_amax = amaxes[i];
  }
  const ScalingRecipe& recipe = *model_.policy().recipe();
  for (const Operand& o : operands_) {
    if (!o.cast) continue;
    Fp8LinearState* live = model_.fp8_state(o.layer);
    ScalingState& state = live->*o.state;
    state = o.at_begin;
    recipe.update(state, o.step_amax, o.format);
    model_.backend().publish_scaling(*live);
  }
}

}  // namespace octet
