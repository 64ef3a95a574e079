// The comparator itself: it must fail on NaN and Inf disagreement and outside its tolerance, and its table
// must follow the formats' precision.
#include <cmath>

#include <gtest/gtest.h>

#include "compare.h"

namespace octet {
namespace {

using testing::all_close;
using testing::CompareOptions;

TEST(Comparator, NanNeverPassesForANumber) {
  const std::vector<float> nan = {NAN}, one = {1.0f};
  EXPECT_FALSE(all_close(nan, one, {}));
  EXPECT_FALSE(all_close(one, nan, {}));
  EXPECT_TRUE(all_close(nan, nan, {})) << "NaN where NaN is expected agrees";
}

TEST(Comparator, InfinitiesMustAgreeInSign) {
  const std::vector<float> inf = {INFINITY}, ninf = {-INFINITY}, big = {3e38f};
  EXPECT_TRUE(all_close(inf, inf, {}));
  EXPECT_FALSE(all_close(inf, ninf, {}));
  EXPECT_FALSE(all_close(inf, big, {}));
  EXPECT_FALSE(all_close(big, inf, {}));
}

TEST(Comparator, ToleranceIsOneUlpOfTheOutputPlusReductionError) {
  const std::vector<float> expected = {1.0f};
  // bf16: one ulp at 1.0 is 2^-7.
  EXPECT_TRUE(all_close(std::vector<float>{1.0f + 0.0078125f}, expected, {Dtype::bf16}));
  EXPECT_FALSE(all_close(std::vector<float>{1.0f + 0.0079f}, expected, {Dtype::bf16}));
  // f32 with a reduction of length 1024 over magnitude 100: 1024 * 2^-24 * 100 ~ 6.1e-3.
  const std::vector<float> mag = {100.0f};
  CompareOptions o{Dtype::f32, 1024, mag};
  EXPECT_TRUE(all_close(std::vector<float>{1.006f}, expected, o));
  EXPECT_FALSE(all_close(std::vector<float>{1.007f}, expected, o));
  EXPECT_FALSE(all_close(std::vector<float>{1.0f, 2.0f}, expected, {})) << "sizes must match";
}

TEST(Comparator, TableFollowsTheFormats) {
  EXPECT_EQ(testing::tolerance_for(Dtype::f32).rtol, std::ldexp(1.0, -23));
  EXPECT_EQ(testing::tolerance_for(Dtype::bf16).rtol, std::ldexp(1.0, -7));
  EXPECT_EQ(testing::tolerance_for(Dtype::f16).rtol, std::ldexp(1.0, -10));
  EXPECT_EQ(testing::tolerance_for(Dtype::e4m3).rtol, std::ldexp(1.0, -3));
  EXPECT_EQ(testing::tolerance_for(Dtype::e5m2).atol, std::ldexp(1.0, -16));
  EXPECT_EQ(testing::tolerance_for(Dtype::f32, 4096).accumulation, 4096 * std::ldexp(1.0, -24));
}

TEST(Comparator, BytesAndNonZero) {
  const std::vector<uint8_t> a = {1, 2, 3}, b = {1, 2, 4};
  EXPECT_TRUE(testing::bytes_equal(a, a));
  EXPECT_FALSE(testing::bytes_equal(a, b));
  EXPECT_FALSE(testing::has_nonzero(std::vector<float>{0.0f, -0.0f, NAN}));
  EXPECT_TRUE(testing::has_nonzero(std::vector<float>{0.0f, 1e-30f}));
}

}  // namespace
}  // namespace octet
