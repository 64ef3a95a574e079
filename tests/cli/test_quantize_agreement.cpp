// `octet fp8 quantize` on a million values against the specification reference (SpecFormat): every code,
// every dequantized value and the summary's counts, for both formats, a fixed non-power-of-two scale, the
// non-saturating cast, the current-scaling recipe and the default scale. Values span 2^-40 .. 2^40, so many
// saturate and many underflow; the special values and, at scale 1, every FP8 value and every midpoint
// between neighbours (the ties) are included. The input is written with varied spellings and whitespace.
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_output.h"
#include "octet/numerics/format.h"
#include "process.h"
#include "random.h"
#include "spec_reference.h"

namespace octet {
namespace {

using testing::SpecClass;
using testing::SpecFormat;

constexpr size_t kRandomValues = 1'000'000;
constexpr uint32_t kCanonicalNan = 0x7F;  // what every octet encoder writes for NaN, E4M3 and E5M2 alike

struct AgreementCase {
  const char* name;
  Dtype format;
  std::vector<std::string> options;  // after "fp8 quantize --format F"
  bool saturate;
  bool current_recipe;  // scale from amax; otherwise `scale`
  float scale;          // the fixed scale; unused with the recipe
  int min_exponent, max_exponent;
  bool specials;       // special_values() included
  bool grid_and_ties;  // every FP8 value and every midpoint between neighbours (exact at scale 1)
};

// Every positive finite value of the format, each midpoint to its successor, and their negatives.
std::vector<float> grid_and_midpoints(const SpecFormat& ref) {
  std::vector<double> values;
  for (uint32_t c = 0; c < ref.code_count() / 2; ++c) {
    const SpecClass k = ref.classify(c);
    if (k != SpecClass::nan && k != SpecClass::infinity) values.push_back(ref.value(c));
  }
  std::vector<float> out;
  for (size_t i = 0; i < values.size(); ++i) {
    out.push_back(static_cast<float>(values[i]));
    if (i + 1 < values.size()) out.push_back(static_cast<float>((values[i] + values[i + 1]) / 2));
  }
  // Past the largest finite: its midpoint to the next step of an unbounded range, and beyond it.
  const double top_step = values.back() - values[values.size() - 2];
  out.push_back(static_cast<float>(values.back() + top_step / 2));
  out.push_back(static_cast<float>(values.back() + top_step));
  const size_t positive = out.size();
  for (size_t i = 0; i < positive; ++i) out.push_back(-out[i]);
  return out;
}

std::vector<float> make_inputs(const AgreementCase& c, const SpecFormat& ref) {
  std::vector<float> x = testing::random_log_uniform(kRandomValues, 2024, c.min_exponent, c.max_exponent);
  if (c.specials) {
    const std::vector<float> s = testing::special_values();
    x.insert(x.begin(), s.begin(), s.end());  // first, last and scattered: position must not matter
    x.insert(x.end(), s.begin(), s.end());
    for (size_t k = 0; k < s.size(); ++k) x[(k + 1) * 60000] = s[k];
  }
  if (c.grid_and_ties) {
    const std::vector<float> g = grid_and_midpoints(ref);
    x.insert(x.end(), g.begin(), g.end());
  }
  return x;
}

// The input text: %.9g round-trips every float32; specials and a leading '+' in several spellings; mixed
// whitespace between tokens.
std::string input_text(const std::vector<float>& x) {
  static const char* const kNan[] = {"nan", "NaN", "NAN", "-nan", "+nan"};
  static const char* const kInf[] = {"inf", "+inf", "infinity", "Infinity", "+INF"};
  static const char* const kMinusInf[] = {"-inf", "-infinity", "-INF"};
  static const char* const kSeparators[] = {" ", "\n", "\t", " \r\n", "  "};
  std::string text = "\n ";
  text.reserve(x.size() * 18);
  char buffer[40];
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    if (std::isnan(v)) {
      text += kNan[i % 5];
    } else if (std::isinf(v)) {
      text += v > 0 ? kInf[i % 5] : kMinusInf[i % 3];
    } else {
      const int n = std::snprintf(buffer, sizeof buffer, "%s%.9g", (v > 0 && i % 7 == 0) ? "+" : "",
                                  static_cast<double>(v));
      text.append(buffer, static_cast<size_t>(n));
    }
    text += kSeparators[i % 5];
  }
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Test names show the case's name rather than its bytes.
void PrintTo(const AgreementCase& c, std::ostream* os) {
  *os << c.name;
}

class QuantizeAgreement : public ::testing::TestWithParam<AgreementCase> {};

TEST_P(QuantizeAgreement, CodesValuesAndCountsMatchTheSpecReference) {
  const AgreementCase& c = GetParam();
  const SpecFormat ref(c.format);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> x = make_inputs(c, ref);
  const testing::TempFile input(input_text(x));

  std::vector<std::string> args = {"fp8", "quantize", "--format", std::string(dtype_name(c.format))};
  args.insert(args.end(), c.options.begin(), c.options.end());
  const auto t_run = std::chrono::steady_clock::now();
  const testing::ProcessResult r = testing::run_octet_with_input_file(args, input.path());
  const double run_seconds = seconds_since(t_run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  testing::QuantizeOutput out;
  ASSERT_TRUE(testing::parse_quantize_output(r.out, out));
  ASSERT_EQ(out.codes.size(), x.size());

  // The scale, from the spec formula when the recipe chooses it: fp8_max / amax, with an amax of 0, Inf or
  // NaN giving no scale (1 kept), and a float32 overflow clamped to the largest float32.
  float amax = 0.0f;
  bool any_nan = false;
  for (const float v : x) {
    any_nan |= std::isnan(v);
    if (std::fabs(v) > amax) amax = std::fabs(v);
  }
  if (any_nan) amax = NAN;
  float scale = c.scale;
  bool degenerate = false;
  if (c.current_recipe) {
    degenerate = !(amax > 0.0f) || !std::isfinite(amax);
    const double s = degenerate ? 1.0 : ref.max_finite() / static_cast<double>(amax);
    scale = s > FLT_MAX ? FLT_MAX : static_cast<float>(s);
  }
  const float scale_inv = 1.0f / scale;

  const uint32_t sign_bit = 1u << (ref.exponent_bits() + ref.mantissa_bits());
  int64_t saturated = 0, underflow = 0, nans = 0, nonzero = 0, mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float scaled = x[i] * scale;  // in float32, as the cast computes it
    const uint32_t code = ref.encode(scaled, c.saturate, kCanonicalNan);
    const float value = static_cast<float>(ref.value(code)) * scale_inv;
    if (out.codes[i] != code || !testing::same_float(out.values[i], value)) {
      if (++mismatches <= 8) {
        ADD_FAILURE() << "value " << i + 1 << " x=" << x[i] << " scaled=" << scaled << ": got code "
                      << int{out.codes[i]} << " value " << out.values[i] << ", want code " << code
                      << " value " << value;
      }
    }
    if (std::isnan(x[i])) {
      ++nans;
      continue;
    }
    const SpecClass unclamped = ref.classify(ref.encode(scaled, false, kCanonicalNan));
    saturated += (unclamped == SpecClass::infinity || unclamped == SpecClass::nan) ? 1 : 0;
    underflow += (x[i] != 0.0f && (code & ~sign_bit) == 0) ? 1 : 0;
    nonzero += (std::isfinite(value) && value != 0.0f) ? 1 : 0;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(nonzero, static_cast<int64_t>(x.size() / 10));  // not a run of zeros agreeing with zeros

  std::map<std::string, std::string> summary;
  ASSERT_TRUE(testing::parse_summary(r.err, summary));
  EXPECT_EQ(summary["values"], std::to_string(x.size()));
  EXPECT_EQ(summary["format"], dtype_name(c.format));
  EXPECT_EQ(summary["recipe"], c.current_recipe ? "current" : "none");
  EXPECT_EQ(summary["saturated"], std::to_string(saturated));
  EXPECT_EQ(summary["underflow"], std::to_string(underflow));
  EXPECT_EQ(summary["nan"], std::to_string(nans));
  const auto printed = [&](const char* key) { return testing::parse_printed_float(summary[key]); };
  ASSERT_TRUE(printed("scale") && printed("scale_inv") && printed("amax")) << r.err;
  EXPECT_TRUE(testing::same_float(*printed("scale"), scale)) << summary["scale"] << " vs " << scale;
  EXPECT_TRUE(testing::same_float(*printed("scale_inv"), scale_inv)) << summary["scale_inv"];
  EXPECT_TRUE(testing::same_float(*printed("amax"), amax)) << summary["amax"];
  // A recipe that cannot derive a scale says so on its own line; otherwise the summary is all there is.
  const size_t stderr_lines = testing::split_lines(r.err).size();
  EXPECT_EQ(stderr_lines, degenerate ? 2u : 1u) << r.err;
  if (degenerate) {
    EXPECT_NE(r.err.find("note: amax is"), std::string::npos) << r.err;
  }

  // The cases are built so that both edges of the range are exercised.
  if (!c.current_recipe) {
    EXPECT_GT(saturated, 1000);
  }
  EXPECT_GT(underflow, 1000);
  std::printf(
      "[ timing   ] %s: %zu values, octet %.2f s, whole test %.2f s; saturated %lld, underflow %lld\n",
      c.name, x.size(), run_seconds, seconds_since(t0), static_cast<long long>(saturated),
      static_cast<long long>(underflow));
}

// Designated initializers: a case reads as what it runs.
const AgreementCase kCases[] = {
    {.name = "e4m3_scale_3_75",
     .format = Dtype::e4m3,
     .options = {"--scale", "3.75"},
     .saturate = true,
     .current_recipe = false,
     .scale = 3.75f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = false},
    {.name = "e5m2_scale_3_75",
     .format = Dtype::e5m2,
     .options = {"--scale", "3.75"},
     .saturate = true,
     .current_recipe = false,
     .scale = 3.75f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = false},
    {.name = "e4m3_scale_3_75_no_saturate",
     .format = Dtype::e4m3,
     .options = {"--no-saturate", "--scale", "3.75"},
     .saturate = false,
     .current_recipe = false,
     .scale = 3.75f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = false},
    {.name = "e5m2_scale_3_75_no_saturate",
     .format = Dtype::e5m2,
     .options = {"--scale", "3.75", "--no-saturate"},
     .saturate = false,
     .current_recipe = false,
     .scale = 3.75f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = false},
    {.name = "e4m3_default_scale_with_ties",
     .format = Dtype::e4m3,
     .options = {},
     .saturate = true,
     .current_recipe = false,
     .scale = 1.0f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = true},
    {.name = "e5m2_default_scale_no_saturate_with_ties",
     .format = Dtype::e5m2,
     .options = {"--no-saturate"},
     .saturate = false,
     .current_recipe = false,
     .scale = 1.0f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = true},
    // Finite inputs only, so that the recipe derives a scale (amax near 2^8; the smallest values underflow).
    {.name = "e4m3_recipe_current",
     .format = Dtype::e4m3,
     .options = {"--recipe", "current"},
     .saturate = true,
     .current_recipe = true,
     .scale = 0.0f,
     .min_exponent = -24,
     .max_exponent = 8,
     .specials = false,
     .grid_and_ties = false},
    {.name = "e5m2_recipe_current",
     .format = Dtype::e5m2,
     .options = {"--recipe", "current"},
     .saturate = true,
     .current_recipe = true,
     .scale = 0.0f,
     .min_exponent = -30,
     .max_exponent = 8,
     .specials = false,
     .grid_and_ties = false},
    // Inf and NaN inputs: amax cannot give a scale, so the scale is 1 and a note says why.
    {.name = "e4m3_recipe_current_with_specials",
     .format = Dtype::e4m3,
     .options = {"--recipe", "current", "--no-saturate"},
     .saturate = false,
     .current_recipe = true,
     .scale = 0.0f,
     .min_exponent = -40,
     .max_exponent = 40,
     .specials = true,
     .grid_and_ties = false},
};

INSTANTIATE_TEST_SUITE_P(Cases, QuantizeAgreement, ::testing::ValuesIn(kCases),
                         [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace octet
