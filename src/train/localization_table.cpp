// `octet localize`'s table (localization.h): a line per layer.
#include <fmt/format.h>

#include "octet/train/layer_chooser.h"
#include "octet/train/localization.h"

namespace octet {
namespace {

std::string sqnr(const CastNumerics& n) {
  return n.sqnr_db ? fmt::format("{:.1f}", *n.sqnr_db) : std::string("-");
}

}  // namespace

std::string precision_map_table(const PrecisionMapFile& map) {
  size_t width = 5;
  for (const LocalizedLayer& l : map.layers) width = std::max(width, l.name.size());
  std::string out =
      fmt::format("{:<{}}  {:<6} {:>10} {:>10} {:>19} {:>9} {:>9}  {}\n", "layer", width, "choice",
                  "alone fp8", "alone bf16", "SQNR dB act/wt/grad", "bf16 ms", "fp8 ms", "reason");
  for (const LocalizedLayer& l : map.layers) {
    if (!l.excluded.empty()) {
      out += fmt::format("{:<{}}  {:<6} {:>10} {:>10} {:>19} {:>9} {:>9}  {}\n", l.name, width, "-", "", "",
                         "", "", "", l.excluded);
      continue;
    }
    out += fmt::format("{:<{}}  {:<6} {:>10} {:>10} {:>19} {:>9.3g} {:>9.3g}  {}\n", l.name, width,
                       l.fp8 ? "fp8" : "bf16", percent_change(l.alone_in_fp8.loss_change),
                       percent_change(l.alone_in_bf16.loss_change),
                       fmt::format("{}/{}/{}", sqnr(l.numerics[0]), sqnr(l.numerics[1]), sqnr(l.numerics[2])),
                       l.bf16_ms, l.fp8_gemm_ms + l.fp8_cast_ms, l.reason);
  }
  return out;
}

}  // namespace octet
