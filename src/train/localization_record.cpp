// A precision map's telemetry rows (see localization_record.h).
#include "localization_record.h"

#include <fmt/format.h>

namespace octet {

std::vector<LocalizationRecord> localization_records(const PrecisionMapFile& map) {
  std::vector<LocalizationRecord> rows;
  int64_t position = 0;
  for (const LocalizedLayer& l : map.layers) {
    LocalizationRecord row;
    row.layer = l.name;
    row.position = position++;
    if (!l.excluded.empty()) {
      row.choice = "excluded";
      row.reason = l.excluded;
    } else {
      row.choice = l.fp8 ? "fp8" : "bf16";
      row.reason = l.reason;
      row.fp8_loss_change = l.alone_in_fp8.loss_change;
      row.bf16_loss_change = l.alone_in_bf16.loss_change;
      row.fp8_gradient_cosine = l.alone_in_fp8.layer_gradient_cosine;
      row.bf16_gradient_cosine = l.alone_in_bf16.layer_gradient_cosine;
      row.bf16_ms = l.bf16_ms;
      row.fp8_ms = l.fp8_gemm_ms + l.fp8_cast_ms;
      for (size_t k = 0; k < 3; ++k) row.sqnr_db[k] = l.numerics[k].sqnr_db;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string localization_summary(const PrecisionMapFile& map) {
  int64_t fp8 = 0;
  for (const LocalizedLayer& l : map.layers) fp8 += l.excluded.empty() && l.fp8 ? 1 : 0;
  return fmt::format(
      "budget {:.3g}%, predicted loss change {:+.3g}%, saving {:.3g} ms per micro-batch ({}); {} of {} "
      "layers in "
      "FP8; made by octet {} over {} batches of {} x {} tokens",
      map.budget * 100.0, map.predicted_loss_change * 100.0, map.saving_ms, map.gain_basis, fp8,
      map.layers.size(), map.octet_version, map.batches, map.batch_size, map.seq_len);
}

}  // namespace octet
