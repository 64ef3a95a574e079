// Which layers `octet localize` runs in FP8: the set that saves the most time while the predicted change of
// the loss stays within a budget. The predictor is additive: the loss change of a set of FP8 layers is taken
// as the sum of each layer's change when it alone runs in FP8 (a negative change counted as 0, so that no
// layer's luck pays for another's harm). The choice is greedy by saving per unit of predicted change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace octet {

struct ChooserCandidate {
  std::string name;
  double loss_change = 0.0;  // relative, this layer alone in FP8 against every layer in BF16
  double saving_ms = 0.0;    // BF16 time less FP8 time (casts included) per micro-batch
};

struct ChooserDecision {
  bool fp8 = false;
  std::string reason;  // "fp8: saves 0.012 ms, loss +0.01% alone in FP8" or "bf16: ..."
};

struct LayerChoice {
  std::vector<ChooserDecision> decisions;  // in the order of the candidates
  double predicted_loss_change = 0.0;      // the sum over the FP8 layers
  double saving_ms = 0.0;                  // the sum over the FP8 layers
};

// Layers that do not save time (saving <= 0) stay in BF16. The others are taken in order of saving divided
// by max(loss change, 0) (a layer that costs nothing first; ties by larger saving, then by the candidates'
// order), each while the running predicted change stays within `budget` (a fraction: 0.005 is 0.5%). A
// non-finite loss change never fits. Deterministic.
LayerChoice choose_fp8_layers(const std::vector<ChooserCandidate>& candidates, double budget);

// A relative change in percent with its sign: "+0.123%", "-0.004%".
std::string percent_change(double fraction);

}  // namespace octet
