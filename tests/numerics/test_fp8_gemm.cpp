// The CPU FP8 GEMM emulation: exact on small integers, within float32 reduction tolerance of a float64
// golden product on odd shapes, the same through the BLAS, for every scale layout and output type.
#include <cmath>

#include <gtest/gtest.h>

#include "compare.h"
#include "octet/check.h"
#include "octet/numerics/fp8_gemm.h"
#include "random.h"
#include "spec_reference.h"

namespace octet {
namespace {

using testing::CompareOptions;

// Golden D = A x B^T in float64 from the dequantized operands, and sum |a| |b| per element.
void golden(const QuantizedTensor& a, const QuantizedTensor& b, std::vector<float>& d,
            std::vector<float>& magnitude) {
  const std::vector<float> av = dequantize(a), bv = dequantize(b);
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  d.assign(static_cast<size_t>(m * n), 0.0f);
  magnitude.assign(d.size(), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double prod =
            static_cast<double>(av[static_cast<size_t>(i * k + p)]) * bv[static_cast<size_t>(j * k + p)];
        s += prod;
        mag += std::fabs(prod);
      }
      d[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
      magnitude[static_cast<size_t>(i * n + j)] = static_cast<float>(mag);
    }
  }
}

QuantizedTensor per_tensor(const std::vector<float>& x, int64_t rows, int64_t cols, Dtype d, float scale) {
  return quantize_with_scale(x, rows, cols, d, scale);
}

TEST(Fp8Gemm, SmallIntegersGiveTheExactProduct) {
  // Integers in [-8, 8] are exact in E4M3 and E5M2, and every partial sum here is exact in float32.
  const int64_t m = 13, n = 7, k = 131;
  const std::vector<float> a = testing::random_small_integers(m * k, 1, 8);
  const std::vector<float> b = testing::random_small_integers(n * k, 2, 8);
  for (const Dtype db : {Dtype::e4m3, Dtype::e5m2}) {
    for (const float sa : {1.0f, 4.0f}) {
      const QuantizedTensor qa = per_tensor(a, m, k, Dtype::e4m3, sa);  // powers of two: exact rescaling
      const QuantizedTensor qb = per_tensor(b, n, k, db, 0.5f);
      Fp8GemmArguments args;
      args.a = &qa;
      args.b = &qb;
      const GemmOutput out = fp8_gemm(args);
      ASSERT_TRUE(testing::has_nonzero(out.values));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          int64_t exact = 0;
          for (int64_t p = 0; p < k; ++p)
            exact += static_cast<int64_t>(a[i * k + p]) * static_cast<int64_t>(b[j * k + p]);
          ASSERT_EQ(out.values[static_cast<size_t>(i * n + j)], static_cast<float>(exact)) << i << "," << j;
        }
      }
    }
  }
}

TEST(Fp8Gemm, PerTensorMatchesFloat64GoldenOnOddShapes) {
  const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 11}, {13, 3, 129}, {31, 17, 300}, {2, 64, 1000}};
  uint64_t seed = 10;
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const QuantizedTensor qa = per_tensor(testing::random_normal(m * k, seed++), m, k, Dtype::e4m3, 96.0f);
    const QuantizedTensor qb =
        per_tensor(testing::random_normal(n * k, seed++, 0.01f), n, k, Dtype::e5m2, 3000.0f);
    std::vector<float> want, magnitude;
    golden(qa, qb, want, magnitude);
    Fp8GemmArguments args;
    args.a = &qa;
    args.b = &qb;
    args.alpha = 0.75f;
    for (float& w : want) w *= 0.75f;
    for (float& w : magnitude) w *= 0.75f;
    const GemmOutput out = fp8_gemm(args);
    ASSERT_TRUE(testing::has_nonzero(out.values));
    EXPECT_TRUE(testing::all_close(out.values, want, {Dtype::f32, k, magnitude}))
        << m << "x" << n << "x" << k;
  }
}

TEST(Fp8Gemm, BlasAgreesWithThePlainLoop) {
  if (!blas_available()) GTEST_SKIP() << "built without a BLAS";
  const int64_t m = 67, n = 45, k = 515;
  const QuantizedTensor qa = per_tensor(testing::random_normal(m * k, 3), m, k, Dtype::e4m3, 64.0f);
  const QuantizedTensor qb = per_tensor(testing::random_normal(n * k, 4), n, k, Dtype::e4m3, 64.0f);
  Fp8GemmArguments args;
  args.a = &qa;
  args.b = &qb;
  const GemmOutput plain = fp8_gemm(args);
  args.accumulation = GemmAccumulation::blas;
  const GemmOutput blas = fp8_gemm(args);
  std::vector<float> want, magnitude;
  golden(qa, qb, want, magnitude);
  // Two float32 reduction orders: each within K * 2^-24 * sum |ab| of the exact result, so within twice that
  // of each other.
  for (float& v : magnitude) v *= 2;
  EXPECT_TRUE(testing::all_close(blas.values, plain.values, {Dtype::f32, k, magnitude}));
  EXPECT_TRUE(testing::has_nonzero(blas.values));
}

TEST(Fp8Gemm, BlockScaledOperandsPromotePartialSums) {
  // Activations in 1x128 tiles against weights in 128x128 blocks; K not a multiple of 128.
  const int64_t m = 37, n = 130, k = 300;
  std::vector<float> a = testing::random_normal(m * k, 5);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) a[i * k + p] *= std::ldexp(1.0f, static_cast<int>((i + p / 128) % 9) - 4);
  }
  const BlockScaling recipe;
  ScalingState unused;
  const QuantizedTensor qa = quantize(a, m, k, Dtype::e4m3, TensorRole::activation, recipe, unused);
  const QuantizedTensor qb =
      quantize(testing::random_normal(n * k, 6), n, k, Dtype::e4m3, TensorRole::weight, recipe, unused);
  ASSERT_EQ(qa.granularity, ScaleGranularity::tile_1x128);
  ASSERT_EQ(qb.granularity, ScaleGranularity::block_128x128);
  std::vector<float> want, magnitude;
  golden(qa, qb, want, magnitude);
  Fp8GemmArguments args;
  args.a = &qa;
  args.b = &qb;
  const GemmOutput out = fp8_gemm(args);
  EXPECT_TRUE(testing::all_close(out.values, want, {Dtype::f32, k, magnitude}));
  if (blas_available()) {
    args.accumulation = GemmAccumulation::blas;
    for (float& v : magnitude) v *= 2;
    EXPECT_TRUE(testing::all_close(fp8_gemm(args).values, out.values, {Dtype::f32, k, magnitude}));
  }
}

TEST(Fp8Gemm, MxScaledOperands) {
  const int64_t m = 9, n = 11, k = 100;
  const MxScaling recipe;
  ScalingState unused;
  const QuantizedTensor qa = quantize(testing::random_log_uniform(m * k, 7, -20, 20), m, k, Dtype::e4m3,
                                      TensorRole::activation, recipe, unused);
  const QuantizedTensor qb =
      quantize(testing::random_normal(n * k, 8), n, k, Dtype::e5m2, TensorRole::gradient, recipe, unused);
  std::vector<float> want, magnitude;
  golden(qa, qb, want, magnitude);
  Fp8GemmArguments args;
  args.a = &qa;
  args.b = &qb;
  EXPECT_TRUE(testing::all_close(fp8_gemm(args).values, want, {Dtype::f32, k, magnitude}));
}

TEST(Fp8Gemm, BetaTimesCAndOutputTypes) {
  const int64_t m = 6, n = 5, k = 33;
  const QuantizedTensor qa = per_tensor(testing::random_normal(m * k, 9), m, k, Dtype::e4m3, 100.0f);
  const QuantizedTensor qb = per_tensor(testing::random_normal(n * k, 10), n, k, Dtype::e4m3, 100.0f);
  const std::vector<float> c = testing::random_normal(m * n, 11);
  Fp8GemmArguments args;
  args.a = &qa;
  args.b = &qb;
  const GemmOutput plain = fp8_gemm(args);
  args.beta = 0.5f;
  args.c = c;
  const GemmOutput with_c = fp8_gemm(args);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(with_c.values[i], plain.values[i] + 0.5f * c[i]);

  args.beta = 0.0f;
  args.output = Dtype::bf16;
  const GemmOutput bf16 = fp8_gemm(args);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(bf16.codes[i], float_to_bf16(plain.values[i]));
    EXPECT_EQ(bf16.values[i], bf16_to_float(bf16.codes[i]));
  }

  // FP8 output: cast(D * output_scale) with saturation; amax is max |D| before the scale.
  const testing::SpecFormat ref(Dtype::e4m3);
  args.output = Dtype::e4m3;
  args.output_scale = 448.0f / 2.0f;  // D values above 2 saturate
  const GemmOutput fp8 = fp8_gemm(args);
  int64_t saturated = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(fp8.codes[i], ref.encode(plain.values[i] * args.output_scale, true, 0x7F));
    saturated += std::fabs(plain.values[i] * args.output_scale) > 464.0f ? 1 : 0;
  }
  EXPECT_EQ(fp8.amax, compute_amax(plain.values));
  EXPECT_EQ(fp8.stats.saturated, saturated);
  EXPECT_GT(saturated, 0) << "the case should exercise saturation";
}

TEST(Fp8Gemm, RefusesWhatHopperCannotRun) {
  const std::vector<float> x(8 * 16, 1.0f);
  const QuantizedTensor e4 = per_tensor(x, 8, 16, Dtype::e4m3, 1.0f);
  const QuantizedTensor e5 = per_tensor(x, 8, 16, Dtype::e5m2, 1.0f);
  const QuantizedTensor other_k = per_tensor(std::vector<float>(8 * 32, 1.0f), 8, 32, Dtype::e4m3, 1.0f);
  ScalingState unused;
  const QuantizedTensor tiled =
      quantize(x, 8, 16, Dtype::e4m3, TensorRole::activation, BlockScaling(), unused);
  auto reason = [](const QuantizedTensor& a, const QuantizedTensor& b) {
    Fp8GemmArguments args;
    args.a = &a;
    args.b = &b;
    return fp8_gemm_can_implement(args);
  };
  EXPECT_EQ(reason(e4, e5), "");
  EXPECT_EQ(reason(e5, e4), "");
  EXPECT_NE(reason(e5, e5).find("e5m2 x e5m2"), std::string::npos);
  EXPECT_NE(reason(e4, other_k).find("same K"), std::string::npos);
  EXPECT_NE(reason(tiled, e4).find("do not pair"), std::string::npos);
  Fp8GemmArguments args;
  args.a = &e4;
  args.b = &e4;
  args.beta = 1.0f;
  EXPECT_NE(fp8_gemm_can_implement(args).find("C holds"), std::string::npos);
  args.beta = 0.0f;
  args.output = Dtype::e5m2;
  args.output_scale = 0.0f;
  EXPECT_NE(fp8_gemm_can_implement(args).find("output scale"), std::string::npos);
  try {
    fp8_gemm(args);
    FAIL() << "ran with a zero output scale";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(Fp8Gemm, DeterministicFromRunToRun) {
  const int64_t m = 40, n = 30, k = 200;
  const QuantizedTensor qa = per_tensor(testing::random_normal(m * k, 12), m, k, Dtype::e4m3, 50.0f);
  const QuantizedTensor qb = per_tensor(testing::random_normal(n * k, 13), n, k, Dtype::e4m3, 50.0f);
  Fp8GemmArguments args;
  args.a = &qa;
  args.b = &qb;
  args.output = Dtype::e4m3;
  args.output_scale = 10.0f;
  EXPECT_EQ(fp8_gemm(args).codes, fp8_gemm(args).codes);
}

}  // namespace
}  // namespace octet
