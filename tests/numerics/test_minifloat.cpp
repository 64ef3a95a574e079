// The format codec against the slow reference written from the specifications' formulas: every code of
// every format decodes and re-encodes to itself, and every boundary (largest finite, smallest normal and
// subnormal, each halfway point between neighbours, signed zero) rounds as the reference says.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "compare.h"
#include "octet/numerics/format.h"
#include "random.h"
#include "spec_reference.h"

namespace octet {
namespace {

using testing::SpecClass;
using testing::SpecFormat;

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint32_t nan_code(Dtype d) {
  return canonical_nan(minifloat_spec(d));
}

class SignedFormat : public ::testing::TestWithParam<Dtype> {};

TEST_P(SignedFormat, EveryCodeDecodesAsTheSpecificationSays) {
  const Dtype d = GetParam();
  const SpecFormat ref(d);
  for (uint32_t c = 0; c < ref.code_count(); ++c) {
    const float v = decode(d, c);
    const double expected = ref.value(c);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(v)) << std::hex << c;
      EXPECT_EQ(classify(d, c), CodeClass::nan);
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), expected) << dtype_name(d) << " code 0x" << std::hex << c;
    EXPECT_EQ(std::signbit(v), std::signbit(expected)) << std::hex << c;
    const SpecClass k = ref.classify(c);
    const CodeClass want = k == SpecClass::zero        ? CodeClass::zero
                           : k == SpecClass::subnormal ? CodeClass::subnormal
                           : k == SpecClass::normal    ? CodeClass::normal
                                                       : CodeClass::infinity;
    EXPECT_EQ(classify(d, c), want) << std::hex << c;
  }
}

TEST_P(SignedFormat, EveryCodeReencodesToItself) {
  const Dtype d = GetParam();
  const SpecFormat ref(d);
  for (uint32_t c = 0; c < ref.code_count(); ++c) {
    const float v = decode(d, c);
    const uint32_t want = std::isnan(v) ? nan_code(d) : c;
    ASSERT_EQ(encode(d, v, Overflow::non_saturating), want) << dtype_name(d) << " 0x" << std::hex << c;
    if (!std::isinf(v)) {
      ASSERT_EQ(encode(d, v, Overflow::saturate), want) << std::hex << c;
    }
  }
}

// Each halfway point between neighbouring values, the points one float32 step either side of it, the
// neighbours themselves, and the same beyond the largest finite value, in both overflow modes.
TEST_P(SignedFormat, BoundariesAndHalfwayPointsMatchTheReference) {
  const Dtype d = GetParam();
  const SpecFormat ref(d);
  const uint32_t sign_bit = 1u << (ref.exponent_bits() + ref.mantissa_bits());
  std::vector<double> positives;
  for (uint32_t c = 0; c < sign_bit; ++c) {
    const SpecClass k = ref.classify(c);
    if (k != SpecClass::nan && k != SpecClass::infinity) positives.push_back(ref.value(c));
  }
  std::sort(positives.begin(), positives.end());
  const double top_step = positives.back() - positives[positives.size() - 2];
  positives.push_back(positives.back() + top_step);  // the first value past the range
  int64_t checked = 0;
  for (size_t i = 0; i + 1 < positives.size(); ++i) {
    const float mid = static_cast<float>((positives[i] + positives[i + 1]) / 2);
    ASSERT_EQ(static_cast<double>(mid), (positives[i] + positives[i + 1]) / 2) << "midpoint not exact";
    for (const float x :
         {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), static_cast<float>(positives[i])}) {
      for (const float s : {x, -x}) {
        for (const bool sat : {true, false}) {
          const uint32_t want = ref.encode(s, sat, nan_code(d));
          const uint32_t got = encode(d, s, sat ? Overflow::saturate : Overflow::non_saturating);
          ASSERT_EQ(got, want) << dtype_name(d) << " x=" << s << (sat ? " saturating" : " non-saturating");
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 8 * 100);
}

TEST_P(SignedFormat, RandomBitPatternsMatchTheReference) {
  const Dtype d = GetParam();
  const SpecFormat ref(d);
  std::mt19937 rng(20240520u + static_cast<unsigned>(d));
  std::vector<float> inputs = testing::special_values();
  for (int i = 0; i < 400000; ++i) inputs.push_back(bits_to_float(static_cast<uint32_t>(rng())));
  // Uniform bit patterns are mostly far outside an 8-bit range; add values near it too.
  for (const float v : testing::random_log_uniform(400000, 7, -30, 20)) inputs.push_back(v);
  for (const float x : inputs) {
    for (const bool sat : {true, false}) {
      ASSERT_EQ(encode(d, x, sat ? Overflow::saturate : Overflow::non_saturating),
                ref.encode(x, sat, nan_code(d)))
          << dtype_name(d) << " x=" << x << " bits=0x" << std::hex << std::bit_cast<uint32_t>(x);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SignedFormat,
                         ::testing::Values(Dtype::e4m3, Dtype::e5m2, Dtype::bf16, Dtype::f16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// The facts users rely on, spelled out (OCP 8-bit floating point specification, IEEE 754 for FP16/BF16).
TEST(FormatFacts, LimitsOfEachFormat) {
  EXPECT_EQ(dtype_info(Dtype::e4m3).max_finite, 448.0f);
  EXPECT_EQ(dtype_info(Dtype::e4m3).min_normal, std::ldexp(1.0f, -6));
  EXPECT_EQ(dtype_info(Dtype::e4m3).min_subnormal, std::ldexp(1.0f, -9));
  EXPECT_FALSE(dtype_info(Dtype::e4m3).has_infinity);
  EXPECT_EQ(dtype_info(Dtype::e5m2).max_finite, 57344.0f);
  EXPECT_EQ(dtype_info(Dtype::e5m2).min_normal, std::ldexp(1.0f, -14));
  EXPECT_EQ(dtype_info(Dtype::e5m2).min_subnormal, std::ldexp(1.0f, -16));
  EXPECT_TRUE(dtype_info(Dtype::e5m2).has_infinity);
  EXPECT_EQ(dtype_info(Dtype::f16).max_finite, 65504.0f);
  EXPECT_EQ(dtype_info(Dtype::bf16).max_finite, bits_to_float(0x7F7F0000u));
  EXPECT_EQ(dtype_info(Dtype::e8m0).max_finite, std::ldexp(1.0f, 127));
  EXPECT_EQ(dtype_info(Dtype::e8m0).min_normal, std::ldexp(1.0f, -127));
}

TEST(FormatFacts, SpecialCodes) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_EQ(float_to_e5m2(INFINITY, Overflow::non_saturating), 0x7C);
  EXPECT_EQ(float_to_e5m2(-INFINITY, Overflow::non_saturating), 0xFC);
  EXPECT_EQ(float_to_e5m2(INFINITY, Overflow::saturate), 0x7B);
  EXPECT_EQ(float_to_e5m2(NAN), 0x7F);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isinf(e5m2_to_float(0x7C)));
  EXPECT_TRUE(std::isnan(e5m2_to_float(0x7D)));
}

TEST(FormatFacts, OverflowThresholdsFollowTiesToEven) {
  // E4M3: 448 has an even mantissa (110), so the tie at 464 stays finite; anything above overflows.
  EXPECT_EQ(float_to_e4m3(464.0f, Overflow::non_saturating), 0x7E);
  EXPECT_EQ(float_to_e4m3(std::nextafter(464.0f, INFINITY), Overflow::non_saturating), 0x7F);
  EXPECT_EQ(float_to_e4m3(std::nextafter(464.0f, INFINITY), Overflow::saturate), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e30f, Overflow::saturate), 0x7E);
  // E5M2: 57344 has an odd mantissa (11), so the tie at 61440 rounds up to infinity, as in IEEE 754.
  EXPECT_EQ(float_to_e5m2(61440.0f, Overflow::non_saturating), 0x7C);
  EXPECT_EQ(float_to_e5m2(std::nextafter(61440.0f, 0.0f), Overflow::non_saturating), 0x7B);
  EXPECT_EQ(float_to_e5m2(61440.0f, Overflow::saturate), 0x7B);
  // Halfway between zero and the smallest subnormal rounds to (signed) zero, just above it rounds up.
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
}

TEST(FormatFacts, Bf16AndF16CarryRoundingAcrossBinades) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even keeps 1.0.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3F81);
  // The largest float32 rounds past bf16's largest finite to infinity.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7C00);  // tie above 65504 goes to the even neighbour: infinity
  EXPECT_EQ(float_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_bf16(NAN), 0x7FFF);
  EXPECT_EQ(float_to_f16(NAN), 0x7FFF);
}

// The bit-level BF16 and FP16 roundings of the hot path against the generic encoder: every pattern whose
// discarded bits are a tie or next to one, for all upper halves, and a stride through all other patterns.
TEST(FormatFacts, FastRoundingsEqualTheEncoder) {
  auto check = [](uint32_t bits) {
    const float x = bits_to_float(bits);
    for (const Dtype d : {Dtype::bf16, Dtype::f16}) {
      const float fast = d == Dtype::bf16 ? round_to_bf16(x) : round_to_f16(x);
      const float slow = decode(d, encode(d, x, Overflow::non_saturating));
      if (std::isnan(slow) ? !std::isnan(fast)
                           : std::bit_cast<uint32_t>(fast) != std::bit_cast<uint32_t>(slow)) {
        return ::testing::AssertionFailure() << dtype_name(d) << " x=" << x << " bits 0x" << std::hex << bits
                                             << ": fast " << fast << ", encoder " << slow;
      }
    }
    return ::testing::AssertionSuccess();
  };
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (const uint32_t lo : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      ASSERT_TRUE(check(hi << 16 | lo));
    }
  }
  // FP16's ties sit at bit 12 in its normal range and move down through its subnormal range.
  for (uint32_t e = 0x60; e < 0x72; ++e) {
    for (uint32_t m = 0; m < (1u << 23); m += 97) ASSERT_TRUE(check(e << 23 | m));
  }
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 251)
    ASSERT_TRUE(check(static_cast<uint32_t>(bits)));
}

// GCC's _Float16 conversion (x86 SSE2 soft-float or F16C) is a second, independent FP16 reference.
TEST(FormatFacts, F16AgreesWithTheCompilersConversion) {
  std::mt19937 rng(99);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t r = static_cast<uint32_t>(rng());
    const float x = bits_to_float(i < 1000000 ? r : (r & 0x80000000u) | (0x30000000u + (r % 0x18000000u)));
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t bits;
    std::memcpy(&bits, &h, sizeof bits);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(f16_to_float(float_to_f16(x))));
      continue;
    }
    ASSERT_EQ(float_to_f16(x), bits) << "x=" << x;
  }
}

TEST(E8m0, EveryCodeIsAPowerOfTwoAndReencodes) {
  for (uint32_t c = 0; c < 255; ++c) {
    const float v = decode(Dtype::e8m0, c);
    EXPECT_EQ(v, std::ldexp(1.0f, static_cast<int>(c) - 127)) << c;
    EXPECT_EQ(encode(Dtype::e8m0, v, Overflow::non_saturating), c);
    EXPECT_EQ(classify(Dtype::e8m0, c), CodeClass::normal);
  }
  EXPECT_TRUE(std::isnan(decode(Dtype::e8m0, 0xFF)));
  EXPECT_EQ(classify(Dtype::e8m0, 0xFF), CodeClass::nan);
}

TEST(E8m0, RoundsToNearestPowerOfTwoAndHasNoZeroOrSign) {
  EXPECT_EQ(encode(Dtype::e8m0, 1.4f, Overflow::non_saturating), 127u);    // nearer 1 than 2
  EXPECT_EQ(encode(Dtype::e8m0, 1.5f, Overflow::non_saturating), 128u);    // tie: the even code (2)
  EXPECT_EQ(encode(Dtype::e8m0, 3.0f, Overflow::non_saturating), 129u);    // tie between 2 and 4: 4
  EXPECT_EQ(encode(Dtype::e8m0, 0.0f, Overflow::non_saturating), 0xFFu);   // no zero: NaN
  EXPECT_EQ(encode(Dtype::e8m0, -2.0f, Overflow::non_saturating), 0xFFu);  // no sign: NaN
  EXPECT_EQ(encode(Dtype::e8m0, 0.0f, Overflow::saturate), 0x00u);         // or the least value
  EXPECT_EQ(encode(Dtype::e8m0, std::ldexp(1.0f, -140), Overflow::saturate), 0x00u);
  EXPECT_EQ(encode(Dtype::e8m0, INFINITY, Overflow::saturate), 0xFEu);
  EXPECT_EQ(encode(Dtype::e8m0, INFINITY, Overflow::non_saturating), 0xFFu);
}

TEST(Dtype, NamesRoundTrip) {
  for (const Dtype d : {Dtype::f32, Dtype::bf16, Dtype::f16, Dtype::e4m3, Dtype::e5m2, Dtype::e8m0}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_FALSE(parse_dtype("E4M3").has_value());
  EXPECT_FALSE(parse_dtype("fp8").has_value());
}

}  // namespace
}  // namespace octet
