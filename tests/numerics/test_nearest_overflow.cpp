// encode_from_saturated, the shortcut of the CUDA casts that take their codes from NVIDIA's saturating
// conversion, against the generic encoder: the overflow flag (one comparison with nearest_overflow_threshold)
// and the code in both overflow modes must be encode_checked's for every float32 near the edge of each
// format's range, for the special values and for millions of random bit patterns and magnitudes.
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "octet/numerics/format.h"
#include "random.h"

namespace octet {
namespace {

float bits_to_float(uint32_t u) {
  return std::bit_cast<float>(u);
}

// encode_from_saturated(x), fed the saturating code as the hardware would write it, equals encode_checked(x)
// in both modes: the code and the overflow flag.
::testing::AssertionResult shortcut_matches(Dtype d, uint32_t bits) {
  const MinifloatSpec s = minifloat_spec(d);
  const float x = bits_to_float(bits);
  const uint32_t saturated = encode(s, x, Overflow::saturate);
  for (const Overflow o : {Overflow::saturate, Overflow::non_saturating}) {
    const EncodeResult want = encode_checked(s, x, o);
    const EncodeResult got = encode_from_saturated(s, x, o, saturated);
    if (got.code != want.code || got.overflow != want.overflow) {
      return ::testing::AssertionFailure()
             << dtype_name(d) << (o == Overflow::saturate ? " saturate" : " non-saturating") << " x=" << x
             << " bits 0x" << std::hex << bits << ": code 0x" << got.code << " overflow " << got.overflow
             << ", encoder code 0x" << want.code << " overflow " << want.overflow;
    }
  }
  return ::testing::AssertionSuccess();
}

class NearestOverflow : public ::testing::TestWithParam<Dtype> {};

// The edges spelled out (docs/fp8.md): ties to even decide them.
TEST(NearestOverflowFacts, ThresholdsOfEachFormat) {
  const auto threshold = [](Dtype d) { return bits_to_float(nearest_overflow_threshold(minifloat_spec(d))); };
  EXPECT_EQ(threshold(Dtype::e4m3), std::nextafter(464.0f, INFINITY));  // 464 rounds to 448 (mantissa 110)
  EXPECT_EQ(threshold(Dtype::e5m2), 61440.0f);  // 61440 rounds up past 57344 (mantissa 11)
  EXPECT_EQ(threshold(Dtype::f16), 65520.0f);   // as IEEE 754: 65520 becomes infinity
  EXPECT_EQ(nearest_overflow_threshold(minifloat_spec(Dtype::bf16)), 0x7F7F8000u);
  const MinifloatSpec e4m3 = minifloat_spec(Dtype::e4m3);
  EXPECT_FALSE(encode_from_saturated(e4m3, 464.0f, Overflow::saturate, 0x7E).overflow);
  EXPECT_FALSE(encode_from_saturated(e4m3, -448.0f, Overflow::saturate, 0xFE).overflow);
  EXPECT_TRUE(encode_from_saturated(e4m3, INFINITY, Overflow::saturate, 0x7E).overflow);
  EXPECT_FALSE(encode_from_saturated(e4m3, NAN, Overflow::non_saturating, 0x7F).overflow);
  const EncodeResult minus_inf = encode_from_saturated(e4m3, -INFINITY, Overflow::non_saturating, 0xFE);
  EXPECT_TRUE(minus_inf.overflow);
  EXPECT_EQ(minus_inf.code, 0xFFu);  // E4M3 has no infinity: NaN with the value's sign
  const EncodeResult e5m2 =
      encode_from_saturated(minifloat_spec(Dtype::e5m2), -61440.0f, Overflow::non_saturating, 0xFB);
  EXPECT_TRUE(e5m2.overflow);
  EXPECT_EQ(e5m2.code, 0xFCu);  // -Inf
}

// Every float32 of the binade that holds the threshold (it also holds the largest finite value) and 2^20 on
// either side of it, with both signs.
TEST_P(NearestOverflow, EveryFloatNearTheEdgeOfTheRange) {
  const Dtype d = GetParam();
  const uint32_t binade = nearest_overflow_threshold(minifloat_spec(d)) >> 23;
  const uint32_t first = (binade << 23) - (1u << 20);
  const uint32_t last = ((binade + 1) << 23) + (1u << 20);  // at most 0x7F800000 + 2^20: NaNs, no wrap
  int64_t overflowed = 0;
  int64_t in_range = 0;
  for (uint32_t bits = first; bits < last; ++bits) {
    ASSERT_TRUE(shortcut_matches(d, bits));
    ASSERT_TRUE(shortcut_matches(d, bits | 0x80000000u));
    const bool overflows =
        encode_checked(minifloat_spec(d), bits_to_float(bits), Overflow::saturate).overflow;
    (overflows ? overflowed : in_range) += 1;
  }
  // Both sides of the edge were seen.
  EXPECT_GT(overflowed, 0);
  EXPECT_GT(in_range, 0);
}

TEST_P(NearestOverflow, SpecialValuesAndNans) {
  const Dtype d = GetParam();
  for (const float x : testing::special_values())
    ASSERT_TRUE(shortcut_matches(d, std::bit_cast<uint32_t>(x)));
  for (const uint32_t sign : {0u, 0x80000000u}) {
    for (const uint32_t magnitude : {0x7F800000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u,
                                     0x7FFFFFFFu, 0x7F7FFFFFu, 0x00000001u, 0x007FFFFFu, 0x00800000u}) {
      ASSERT_TRUE(shortcut_matches(d, sign | magnitude));
    }
  }
}

TEST_P(NearestOverflow, RandomBitPatternsAndMagnitudes) {
  const Dtype d = GetParam();
  std::mt19937 rng(20250611u + static_cast<unsigned>(d));
  for (int i = 0; i < 3000000; ++i) ASSERT_TRUE(shortcut_matches(d, static_cast<uint32_t>(rng())));
  // Uniform bit patterns are mostly far outside an 8-bit range; add magnitudes around it too.
  for (const float x : testing::random_log_uniform(2000000, 11 + static_cast<uint64_t>(d), -30, 20)) {
    ASSERT_TRUE(shortcut_matches(d, std::bit_cast<uint32_t>(x)));
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, NearestOverflow,
                         ::testing::Values(Dtype::e4m3, Dtype::e5m2, Dtype::bf16, Dtype::f16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

}  // namespace
}  // namespace octet
