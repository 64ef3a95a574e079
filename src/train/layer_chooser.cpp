// See layer_chooser.h.
#include "octet/train/layer_chooser.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace octet {

std::string percent_change(double fraction) {
  if (!std::isfinite(fraction)) return fraction > 0 ? "+inf%" : "nan%";
  return fmt::format("{:+.3f}%", fraction * 100.0);
}

LayerChoice choose_fp8_layers(const std::vector<ChooserCandidate>& candidates, double budget) {
  LayerChoice choice;
  choice.decisions.resize(candidates.size());
  auto cost = [&](size_t i) { return std::max(candidates[i].loss_change, 0.0); };
  std::vector<size_t> order;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const ChooserCandidate& c = candidates[i];
    if (!(c.saving_ms > 0.0)) {
      choice.decisions[i].reason =
          fmt::format("bf16: no gain, fp8 would take {:.3g} ms more per micro-batch", -c.saving_ms);
    } else if (std::isnan(c.loss_change) || std::isinf(c.loss_change)) {
      choice.decisions[i].reason = "bf16: the loss was not finite with this layer alone in FP8";
    } else {
      order.push_back(i);
    }
  }
  // Saving per unit of predicted change, compared without dividing: a / b > c / d as a d > c b (b, d >= 0).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double left = candidates[a].saving_ms * cost(b), right = candidates[b].saving_ms * cost(a);
    if (left != right) return left > right;
    return candidates[a].saving_ms > candidates[b].saving_ms;
  });
  for (const size_t i : order) {
    const ChooserCandidate& c = candidates[i];
    ChooserDecision& d = choice.decisions[i];
    const double total = choice.predicted_loss_change + cost(i);
    if (total <= budget) {
      d.fp8 = true;
      choice.predicted_loss_change = total;
      choice.saving_ms += c.saving_ms;
      d.reason = fmt::format("fp8: saves {:.3g} ms, loss {} alone in FP8", c.saving_ms,
                             percent_change(c.loss_change));
    } else if (cost(i) > budget) {
      d.reason = fmt::format("bf16: loss {} alone in FP8, over the budget of {}",
                             percent_change(c.loss_change), percent_change(budget).substr(1));
    } else {
      d.reason = fmt::format(
          "bf16: loss {} alone in FP8 would take the predicted change to {}, over the "
          "budget of {}",
          percent_change(c.loss_change), percent_change(total), percent_change(budget).substr(1));
    }
  }
  return choice;
}

}  // namespace octet
