// See compare.h.
#include "compare.h"

#include <cmath>
#include <sstream>

namespace octet::testing {

Tolerance tolerance_for(Dtype output, int64_t reduction_length) {
  const MinifloatSpec s = minifloat_spec(output);
  Tolerance t{};
  t.rtol = std::ldexp(1.0, -s.mantissa_bits);  // one ulp of the output format
  t.atol = output == Dtype::f32 ? 0.0 : dtype_info(output).min_subnormal;
  t.accumulation = static_cast<double>(reduction_length) * std::ldexp(1.0, -24);
  return t;
}

::testing::AssertionResult all_close(std::span<const float> actual, std::span<const float> expected,
                                     const CompareOptions& options) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: actual " << actual.size() << ", expected " << expected.size();
  }
  if (!options.magnitude.empty() && options.magnitude.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "magnitude has " << options.magnitude.size() << " values, need " << expected.size();
  }
  const Tolerance tol = tolerance_for(options.dtype, options.reduction_length);
  std::ostringstream report;
  int64_t failures = 0;
  double worst = 0.0;
  size_t worst_index = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    bool ok;
    const char* why = "";
    if (std::isnan(a) || std::isnan(e)) {
      ok = std::isnan(a) && std::isnan(e);
      why = "NaN disagreement";
    } else if (std::isinf(a) || std::isinf(e)) {
      ok = a == e;
      why = "Inf disagreement";
    } else {
      const double magnitude = options.magnitude.empty() ? std::fabs(e) : options.magnitude[i];
      const double bound = tol.atol + tol.rtol * std::fabs(e) + tol.accumulation * magnitude;
      const double err = std::fabs(a - e);
      ok = err <= bound;  // written so that a NaN error could not pass
      why = "outside tolerance";
      if (bound > 0 && err / bound > worst) worst = err / bound, worst_index = i;
    }
    if (!ok) {
      if (failures < options.max_reported) {
        report << "\n  [" << i << "] actual " << a << ", expected " << e << " (" << why << ")";
      }
      ++failures;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << actual.size() << " elements differ (" << dtype_name(options.dtype)
         << ", K=" << options.reduction_length << "; worst error/bound " << worst << " at " << worst_index
         << "):" << report.str();
}

::testing::AssertionResult bytes_equal(std::span<const uint8_t> actual, std::span<const uint8_t> expected,
                                       Dtype dtype, int max_reported) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: actual " << actual.size() << ", expected " << expected.size();
  }
  std::ostringstream report;
  int64_t failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] == expected[i]) continue;
    if (failures < max_reported) {
      report << "\n  [" << i << "] actual 0x" << std::hex << int{actual[i]} << " ("
             << decode(dtype, actual[i]) << "), expected 0x" << int{expected[i]} << std::dec << " ("
             << decode(dtype, expected[i]) << ")";
    }
    ++failures;
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << actual.size() << " codes differ:" << report.str();
}

::testing::AssertionResult has_nonzero(std::span<const float> values) {
  for (const float v : values) {
    if (std::isfinite(v) && v != 0.0f) return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "all " << values.size() << " values are zero or non-finite";
}

}  // namespace octet::testing
