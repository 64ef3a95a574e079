// FP8 scaling that moves once per optimizer step rather than after every cast (internal to src/train/): what
// data-parallel training needs for every rank to cast with the same scales and to keep the same scaling
// state (data_parallel.h).
//
// The backend updates an operand's scaling state as it casts it. Between micro-batches, StepScaling takes the
// amax that the micro-batch's cast recorded and puts the state back as the step began, so that every
// micro-batch, on every rank, casts with the step's first scales; at the end of the step the largest amax of
// each operand over the micro-batches, and over the ranks (all_reduce_max), is recorded once, on every rank
// if any rank cast the operand (an expert may see no token on one rank and some on another). With one
// micro-batch on one rank this is exactly the per-cast update. Weights are left alone: every rank casts the
// same weights once a step.
#pragma once

#include <string>
#include <vector>

#include "octet/dist/communicator.h"
#include "octet/model/model.h"

namespace octet {

class StepScaling {
 public:
  explicit StepScaling(Model& model);

  // At the start of a step: remembers the activation and gradient scaling state of each layer in FP8 now.
  void begin();
  // After each micro-batch's forward and backward: folds the amaxes its casts recorded into the step's and
  // restores the states remembered by begin(). After the step's last micro-batch (`last`: finish() comes
  // next, and nothing casts before it) the restored states stay on the host: finish() sends them once,
  // updated, which spares the device a copy of every record each way.
  void after_micro_batch(bool last);
  // At the end of the step: takes the largest amaxes over the ranks (when there is a communicator) and
  // records each operand's once.
  void finish(dist::Communicator* communicator);

 private:
  struct Operand {
    ScalingState Fp8LinearState::*state;
    Dtype format;
    ScalingState at_begin;
    float step_amax = 0.0f;
    bool cast = false;  // whether any micro-batch of this step cast it
  };
  // An FP8 layer's activation and gradient operands.
  struct Layer {
    Operand operands[2];
  };
  void publish(const std::vector<Fp8LinearState*>& live);

  Model& model_;
  std::vector<std::string> names_;  // the layers in FP8 at begin(), fetched and published together
  std::vector<Layer> layers_;
  // The host states the last micro-batch restored and did not send (after_micro_batch(true)), for finish().
  std::vector<Fp8LinearState*> restored_;
};

}  // namespace octet
