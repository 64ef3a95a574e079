// Quantize and dequantize against the specification reference, over odd and prime shapes, for every scale
// layout, with the counts a cast reports.
#include <cmath>

#include <gtest/gtest.h>

#include "compare.h"
#include "octet/check.h"
#include "octet/numerics/quantize.h"
#include "random.h"
#include "spec_reference.h"

namespace octet {
namespace {

using testing::odd_shapes;
using testing::SpecFormat;

// Reference counts for one element cast with `scale`.
void count(const SpecFormat& ref, float x, float scale, bool saturate, CastStats& s) {
  const float scaled = x * scale;
  if (std::isnan(x)) {
    s.nan_inputs++;
    return;
  }
  const uint32_t non_saturating = ref.encode(scaled, false, 0x7F);
  const uint32_t sign_bit = 1u << (ref.exponent_bits() + ref.mantissa_bits());
  const double v = ref.value(non_saturating);
  if (std::isinf(scaled) || std::isnan(v) || std::isinf(v)) s.saturated++;
  if (x != 0.0f && (ref.encode(scaled, saturate, 0x7F) & ~sign_bit) == 0) s.underflowed++;
}

class QuantizeFormats : public ::testing::TestWithParam<Dtype> {};

TEST_P(QuantizeFormats, PerTensorMatchesTheReferenceOnOddShapes) {
  const Dtype d = GetParam();
  const SpecFormat ref(d);
  uint64_t seed = 100;
  for (const auto& shape : odd_shapes()) {
    const size_t n = static_cast<size_t>(shape.rows * shape.cols);
    std::vector<float> x = testing::random_log_uniform(n, seed++, -26, 18);
    const std::vector<float> specials = testing::special_values();
    for (size_t i = 0; i < std::min(n, specials.size()); ++i) x[i * 7 % n] = specials[i];
    for (const bool saturate : {true, false}) {
      const float scale = 3.75f;
      CastOptions options;
      options.overflow = saturate ? Overflow::saturate : Overflow::non_saturating;
      const QuantizedTensor q = quantize_with_scale(x, shape.rows, shape.cols, d, scale, options);
      std::vector<uint8_t> want(n);
      CastStats stats;
      for (size_t i = 0; i < n; ++i) {
        want[i] = static_cast<uint8_t>(ref.encode(x[i] * scale, saturate, 0x7F));
        count(ref, x[i], scale, saturate, stats);
      }
      ASSERT_TRUE(testing::bytes_equal(q.data, want, d)) << shape.rows << "x" << shape.cols;
      EXPECT_EQ(q.stats.saturated, stats.saturated);
      EXPECT_EQ(q.stats.underflowed, stats.underflowed);
      EXPECT_EQ(q.stats.nan_inputs, stats.nan_inputs);
      EXPECT_EQ(q.stats.elements, static_cast<int64_t>(n));
      const std::vector<float> back = dequantize(q);
      for (size_t i = 0; i < n; ++i) {
        const double v = ref.value(want[i]) * static_cast<double>(1.0f / scale);
        if (std::isnan(v)) {
          ASSERT_TRUE(std::isnan(back[i]));
        } else {
          ASSERT_EQ(back[i], static_cast<float>(v)) << i;
        }
      }
    }
  }
}

TEST_P(QuantizeFormats, BlockLayoutsMatchTheReferenceOnOddShapes) {
  const Dtype d = GetParam();
  const SpecFormat ref(d);
  const BlockScaling block;
  const BlockScaling block_pow2(true);
  const MxScaling mx;
  struct Case {
    const ScalingRecipe* recipe;
    TensorRole role;
  };
  const Case cases[] = {{&block, TensorRole::activation},
                        {&block, TensorRole::weight},
                        {&block_pow2, TensorRole::gradient},
                        {&mx, TensorRole::activation}};
  uint64_t seed = 500;
  for (const Case& c : cases) {
    for (const auto& shape : odd_shapes()) {
      const size_t n = static_cast<size_t>(shape.rows * shape.cols);
      // Rows of very different magnitudes: the point of per-block scales.
      std::vector<float> x = testing::random_normal(n, seed++);
      for (int64_t r = 0; r < shape.rows; ++r) {
        for (int64_t col = 0; col < shape.cols; ++col)
          x[static_cast<size_t>(r * shape.cols + col)] *= std::ldexp(1.0f, static_cast<int>(r % 29) - 14);
      }
      if (n > 3) x[3] = 0.0f;
      ScalingState unused;
      const QuantizedTensor q = quantize(x, shape.rows, shape.cols, d, c.role, *c.recipe, unused);
      const ScaleGranularity g = c.recipe->granularity(c.role);
      ASSERT_EQ(q.granularity, g);
      const BlockShape bs = block_shape(g);
      const int64_t grid_rows = (shape.rows + bs.rows - 1) / bs.rows,
                    grid_cols = (shape.cols + bs.cols - 1) / bs.cols;
      ASSERT_EQ(q.scale_inv.size(), static_cast<size_t>(grid_rows * grid_cols));
      for (int64_t br = 0; br < grid_rows; ++br) {
        for (int64_t bc = 0; bc < grid_cols; ++bc) {
          float amax = 0.0f;
          for (int64_t r = br * bs.rows; r < std::min(shape.rows, (br + 1) * bs.rows); ++r) {
            for (int64_t col = bc * bs.cols; col < std::min(shape.cols, (bc + 1) * bs.cols); ++col) {
              amax = std::max(amax, std::fabs(x[static_cast<size_t>(r * shape.cols + col)]));
            }
          }
          bool degenerate = false;
          const float scale = c.recipe->block_scale(amax, d, &degenerate);
          ASSERT_EQ(q.scale_inv[static_cast<size_t>(br * grid_cols + bc)], 1.0f / scale);
          for (int64_t r = br * bs.rows; r < std::min(shape.rows, (br + 1) * bs.rows); ++r) {
            for (int64_t col = bc * bs.cols; col < std::min(shape.cols, (bc + 1) * bs.cols); ++col) {
              const size_t i = static_cast<size_t>(r * shape.cols + col);
              ASSERT_EQ(q.data[i], ref.encode(x[i] * scale, true, 0x7F)) << "element " << r << "," << col;
            }
          }
        }
      }
      EXPECT_EQ(q.stats.saturated, 0) << "block scales come from the block's own amax";
      if (g == ScaleGranularity::mx_1x32) {
        for (size_t i = 0; i < q.scale_inv.size(); ++i)
          EXPECT_EQ(decode(Dtype::e8m0, q.scale_e8m0[i]), q.scale_inv[i]);
      }
      // Dequantized values are within half a unit in the last place of E4M3/E5M2 of x (relative), except
      // those that fell into the subnormal range.
      const std::vector<float> back = dequantize(q);
      const double half_ulp = std::ldexp(1.0, -minifloat_spec(d).mantissa_bits - 1);
      for (size_t i = 0; i < n; ++i) {
        const float scaled = std::fabs(x[i] / q.scale_inv_at(static_cast<int64_t>(i) / shape.cols,
                                                             static_cast<int64_t>(i) % shape.cols));
        if (scaled < dtype_info(d).min_normal) continue;
        ASSERT_LE(std::fabs(back[i] - x[i]), half_ulp * std::fabs(x[i]) * (1 + 1e-6)) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fp8, QuantizeFormats, ::testing::Values(Dtype::e4m3, Dtype::e5m2),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST(Quantize, AmaxPropagatesNanAndCountsIt) {
  const std::vector<float> x = {1.0f, NAN, -3.0f, INFINITY};
  const QuantizedTensor q = quantize_with_scale(x, 2, 2, Dtype::e4m3, 1.0f);
  EXPECT_TRUE(std::isnan(q.amax));
  EXPECT_EQ(q.stats.nan_inputs, 1);
  EXPECT_EQ(q.stats.saturated, 1);  // Inf clamps to 448
  EXPECT_EQ(q.data[3], 0x7E);
  EXPECT_EQ(compute_amax(std::vector<float>{-2.0f, 1.0f}), 2.0f);
}

TEST(Quantize, UnderflowCountsNonZeroInputsThatBecomeZero) {
  const std::vector<float> x = {1e-6f, -1e-6f, 0.0f, -0.0f, 1.0f};
  const QuantizedTensor q = quantize_with_scale(x, 1, 5, Dtype::e4m3, 1.0f);
  EXPECT_EQ(q.stats.underflowed, 2);
  EXPECT_EQ(q.data[1], 0x80) << "the sign survives underflow";
}

TEST(Quantize, BadArgumentsAreInvalidInput) {
  const std::vector<float> x(6, 1.0f);
  EXPECT_THROW(quantize_with_scale(x, 2, 2, Dtype::e4m3, 1.0f), Error);
  EXPECT_THROW(quantize_with_scale(x, 2, 3, Dtype::bf16, 1.0f), Error);
  for (const float bad : {0.0f, -2.0f, NAN, INFINITY, 1e-39f}) {
    try {
      quantize_with_scale(x, 2, 3, Dtype::e4m3, bad);
      FAIL() << "accepted scale " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find("positive finite"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace octet
