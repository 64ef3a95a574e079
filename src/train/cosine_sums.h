// The float64 sums behind the cosine of two gradients, internal to src/train: the BF16 shadow checks
// (shadow_check.h) and `octet localize`'s variants (localization_variants.h) compare gradients with them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

namespace octet {

// x.y, x.x and y.y of two gradients x and y, and whether every value was finite. Sums over several stretches
// (layers, experts, chunks) add.
struct CosineSums {
  double dot = 0.0, xx = 0.0, yy = 0.0;
  bool finite = true;

  CosineSums& operator+=(const CosineSums& o) {
    dot += o.dot;
    xx += o.xx;
    yy += o.yy;
    finite = finite && o.finite;
    return *this;
  }
  // Adds x[i] y[i], x[i]^2 and y[i]^2 over the two stretches, which have one length.
  void add(std::span<const float> x, std::span<const float> y) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double a = x[i], b = y[i];
      dot += a * b;
      xx += a * a;
      yy += b * b;
    }
    finite = finite && std::isfinite(dot) && std::isfinite(xx) && std::isfinite(yy);
  }
  bool both_zero() const { return finite && xx == 0.0 && yy == 0.0; }
  // 1 where both are zero, 0 where one is, NaN where either held a non-finite value (never a passing cosine).
  double cosine() const {
    if (!finite || !std::isfinite(dot) || !std::isfinite(xx) || !std::isfinite(yy)) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    if (xx == 0.0 && yy == 0.0) return 1.0;
    if (xx == 0.0 || yy == 0.0) return 0.0;
    return std::clamp(dot / std::sqrt(xx * yy), -1.0, 1.0);
  }
};

}  // namespace octet
