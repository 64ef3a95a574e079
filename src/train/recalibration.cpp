// Recalibration in a run (see recalibration.h).
#include "recalibration.h"

#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/numerics/scaling.h"

namespace octet {

std::vector<RecalibrationRecord> install_calibrated_scales(Model& model,
                                                           const std::vector<CalibratedLayer>& measured,
                                                           int64_t steps_done, const std::string& reason) {
  const ScalingRecipe* recipe = model.policy().recipe();
  OCTET_CHECK(recipe != nullptr && recipe->kind() == RecipeKind::static_scale,
              "recalibration under the static recipe, got {}",
              recipe != nullptr ? recipe->describe() : "none");
  std::vector<RecalibrationRecord> rows;
  for (const CalibratedLayer& layer : measured) {
    if (!layer.excluded.empty()) continue;
    Fp8LinearState* state = model.fp8_state(layer.name);  // brought up to date from the backend
    if (state == nullptr) continue;                       // moved to BF16 since
    ScalingState* operands[3] = {&state->activation, &state->weight, &state->gradient};
    for (size_t k = 0; k < 3; ++k) {
      const CalibratedOperand& o = layer.operands[k];
      RecalibrationRecord row;
      row.step = steps_done;
      row.layer = layer.name;
      row.tensor = std::string(kOperandNames[k]);
      row.scale_before = operands[k]->scale;
      if (!o.fallback) row.amax = o.statistics.amax;
      if (!o.fallback && is_valid_scale(o.scale)) {
        operands[k]->scale = o.scale;
        operands[k]->scale_inv = 1.0f / o.scale;
      }
      row.scale_after = operands[k]->scale;
      row.reason = reason;
      rows.push_back(std::move(row));
    }
    model.backend().publish_scaling(*state);
  }
  // The weight copies of the next step are cast with the new weight scales (the optimizer made them with the
  // old ones); the copy's scale is what a checkpoint keeps to remake the same copy on resume.
  model.refresh_weight_copies();
  return rows;
}

std::string recalibration_line(int64_t steps_done, const std::vector<RecalibrationRecord>& rows,
                               const std::string& reason) {
  int64_t changed = 0;
  const RecalibrationRecord* largest = nullptr;
  double largest_factor = 1.0;
  for (const RecalibrationRecord& row : rows) {
    if (row.scale_after == row.scale_before) continue;
    ++changed;
    const double factor = row.scale_after / row.scale_before;
    const double size = std::max(factor, 1.0 / factor);
    if (largest == nullptr || size > std::max(largest_factor, 1.0 / largest_factor)) {
      largest = &row;
      largest_factor = factor;
    }
  }
  return fmt::format("step {}: FP8 scales recalibrated ({}): {} of {} operand scales changed{}", steps_done,
                     reason, changed, rows.size(),
                     largest != nullptr ? fmt::format(", the largest change x {:.4g} ({} {})", largest_factor,
                                                      largest->layer, largest->tensor)
                                        : std::string());
}

}  // namespace octet
