// Stochastic rounding: always one of the two neighbours, exact values untouched, unbiased on average,
// reproducible from the seed.
#include <cmath>

#include <gtest/gtest.h>

#include "octet/numerics/quantize.h"
#include "random.h"

namespace octet {
namespace {

uint8_t sr(Dtype d, float x, uint32_t bits, Overflow o = Overflow::saturate) {
  return static_cast<uint8_t>(encode(minifloat_spec(d), x, o, &bits));
}

TEST(StochasticRounding, ExactValuesNeverMove) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    for (const uint32_t bits : {0u, 1u, 0x80000000u, 0xFFFFFFFFu}) EXPECT_EQ(sr(Dtype::e4m3, v, bits), c);
  }
}

TEST(StochasticRounding, ResultIsAlwaysANeighbour) {
  const std::vector<float> xs = testing::random_log_uniform(20000, 3, -12, 9);
  const CounterRng rng(5);
  for (const Dtype d : {Dtype::e4m3, Dtype::e5m2}) {
    // The positive finite values of the format, scanned from its codes.
    std::vector<float> values;
    for (uint32_t c = 0; c < 128; ++c) {
      const float v = decode(d, c);
      if (std::isfinite(v)) values.push_back(v);
    }
    for (size_t i = 0; i < xs.size(); ++i) {
      const float a = std::fabs(xs[i]);
      float below = 0.0f, above = dtype_info(d).max_finite;  // saturating: nothing lies above the largest
      for (const float v : values) {
        if (v <= a && v > below) below = v;
        if (v >= a && v < above) above = v;
      }
      const float got = std::fabs(decode(d, sr(d, xs[i], rng.bits(i))));
      EXPECT_TRUE(got == below || got == above)
          << "x=" << xs[i] << " got " << got << " between " << below << " and " << above;
    }
  }
}

TEST(StochasticRounding, ExtremeRandomBitsPickEachSide) {
  // 1.1 lies between E4M3's 1.0 and 1.125. Bits 0 always round away from zero, all-ones never do.
  EXPECT_EQ(e4m3_to_float(sr(Dtype::e4m3, 1.1f, 0u)), 1.125f);
  EXPECT_EQ(e4m3_to_float(sr(Dtype::e4m3, 1.1f, 0xFFFFFFFFu)), 1.0f);
  EXPECT_EQ(e4m3_to_float(sr(Dtype::e4m3, -1.1f, 0u)), -1.125f);
  // Past the largest finite: saturate or overflow as the mode says.
  EXPECT_EQ(sr(Dtype::e4m3, 447.0f, 0u, Overflow::saturate), 0x7E);
  EXPECT_EQ(sr(Dtype::e4m3, 449.0f, 0u, Overflow::non_saturating), 0x7F);
  EXPECT_EQ(sr(Dtype::e5m2, 57345.0f, 0u, Overflow::non_saturating), 0x7C);
}

TEST(StochasticRounding, UnbiasedOnAverage) {
  // x = 1.1 in E4M3: rounds to 1.125 with probability 0.8. The mean of N draws has standard error
  // 0.125 * sqrt(0.8 * 0.2 / N).
  const int n = 200000;
  const std::vector<float> x(n, 1.1f);
  CastOptions options;
  options.rounding = Rounding::stochastic;
  options.seed = 1234;
  const QuantizedTensor q = quantize_with_scale(x, 1, n, Dtype::e4m3, 1.0f, options);
  double sum = 0;
  for (const float v : dequantize(q)) sum += v;
  const double mean = sum / n;
  const double standard_error = 0.125 * std::sqrt(0.8 * 0.2 / n);
  EXPECT_NEAR(mean, 1.1, 5 * standard_error);
  // Round to nearest is biased here by construction: everything goes to 1.125.
  const QuantizedTensor nearest = quantize_with_scale(x, 1, n, Dtype::e4m3, 1.0f);
  EXPECT_EQ(dequantize(nearest)[0], 1.125f);
}

TEST(StochasticRounding, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::vector<float> x = testing::random_normal(4096, 11);
  CastOptions options;
  options.rounding = Rounding::stochastic;
  options.seed = 7;
  const QuantizedTensor a = quantize_with_scale(x, 64, 64, Dtype::e4m3, 100.0f, options);
  const QuantizedTensor b = quantize_with_scale(x, 64, 64, Dtype::e4m3, 100.0f, options);
  EXPECT_EQ(a.data, b.data);
  options.seed = 8;
  const QuantizedTensor c = quantize_with_scale(x, 64, 64, Dtype::e4m3, 100.0f, options);
  EXPECT_NE(a.data, c.data);
}

TEST(CounterRng, BitsDependOnSeedAndIndexOnly) {
  const CounterRng a(42), b(42), c(43);
  EXPECT_EQ(a.bits(17), b.bits(17));
  EXPECT_NE(a.bits(17), c.bits(17));
  EXPECT_NE(a.bits(17), a.bits(18));
  EXPECT_NE(a.bits(17, 0), a.bits(17, 1));
  // Roughly uniform: the mean of many draws is near 2^31.
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) sum += a.bits(i);
  EXPECT_NEAR(sum / 100000 / 4294967296.0, 0.5, 0.01);
}

}  // namespace
}  // namespace octet
