// MXFP8: a power-of-two scale per 32 consecutive elements, stored as E8M0. Blackwell runs these natively;
// here they are emulated exactly.
#include <cmath>

#include "octet/numerics/scaling.h"

namespace octet {

std::string MxScaling::describe() const {
  return "mxfp8 (E8M0 scale per 1x32 block)";
}

float MxScaling::block_scale(float block_amax, Dtype format, bool* degenerate) const {
  if (!(block_amax > 0.0f) || !std::isfinite(block_amax)) {
    if (degenerate) *degenerate = true;
    return 1.0f;
  }
  if (degenerate) *degenerate = false;
  // The least e with block_amax <= fp8_max * 2^e; scale_inv = 2^e. Comparisons in double are exact.
  const double fp8_max = dtype_info(format).max_finite;
  const double amax = block_amax;
  int e = static_cast<int>(std::ceil(std::log2(amax / fp8_max)));
  while (std::ldexp(fp8_max, e) < amax) ++e;
  while (std::ldexp(fp8_max, e - 1) >= amax) --e;
  // E8M0 reaches 2^-127 .. 2^127.
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return static_cast<float>(std::ldexp(1.0, -e));
}

}  // namespace octet
