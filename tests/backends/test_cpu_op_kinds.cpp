// The CPU reference's op kinds for Llama-style blocks, each against an independent computation: RMSNorm and
// SwiGLU against float64 formulas (and their backwards against central differences of those formulas), the
// rotary embedding on angles whose cos and sin are exact, grouped-query attention against multi-head
// attention with the key and value heads repeated, and the refusals of arguments a kind does not take.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "errors.h"
#include "octet/backend/cpu_backend.h"
#include "octet/numerics/random.h"

namespace octet {
namespace {

using testing::error_of;

std::vector<float> uniform(int64_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  const CounterRng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] =
        lo + (hi - lo) * static_cast<float>(rng.bits(static_cast<uint64_t>(i), 0) >> 8) / 16777216.0f;
  }
  return x;
}

double rms_out(const std::vector<float>& x, const std::vector<float>& w, int64_t n, int64_t C, int64_t i) {
  double squares = 0.0;
  for (int64_t j = 0; j < C; ++j) squares += static_cast<double>(x[n * C + j]) * x[n * C + j];
  return x[n * C + i] / std::sqrt(squares / static_cast<double>(C) + 1e-5) * w[i];
}

TEST(CpuOpKinds, RmsNormMatchesTheFormulaAndItsDerivative) {
  const int64_t N = 3, C = 8;
  const auto cpu = make_cpu_backend();
  std::vector<float> x = uniform(N * C, 1), w = uniform(C, 2, 0.5f, 1.5f), y(N * C), rstd(N);
  cpu->normalization_forward(Normalization::rmsnorm, TensorView(y.data(), {N, C}), nullptr, rstd.data(),
                             ConstTensorView(x.data(), {N, C}), w.data(), nullptr, {});
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < C; ++i) EXPECT_NEAR(y[n * C + i], rms_out(x, w, n, C, i), 1e-5) << n << "," << i;
  }
  // The gradient of sum(dout * y) with respect to x and w, against central differences in float64.
  const std::vector<float> dout = uniform(N * C, 3);
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  cpu->normalization_backward(Normalization::rmsnorm, dx.data(), dw.data(), nullptr,
                              ConstTensorView(dout.data(), {N, C}), x.data(), w.data(), nullptr, rstd.data());
  auto objective = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < C; ++i) sum += dout[n * C + i] * rms_out(xs, ws, n, C, i);
    }
    return sum;
  };
  const float h = 1e-3f;
  for (int64_t k = 0; k < N * C; ++k) {
    std::vector<float> plus = x, minus = x;
    plus[k] += h;
    minus[k] -= h;
    const double numeric = (objective(plus, w) - objective(minus, w)) / (plus[k] - minus[k]);
    EXPECT_NEAR(dx[k], numeric, 2e-3) << "dx " << k;
  }
  for (int64_t i = 0; i < C; ++i) {
    std::vector<float> plus = w, minus = w;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (objective(x, plus) - objective(x, minus)) / (plus[i] - minus[i]);
    EXPECT_NEAR(dw[i], numeric, 2e-3) << "dw " << i;
  }
}

double swiglu_out(const std::vector<float>& x, int64_t n, int64_t C, int64_t i) {
  const double g = x[n * 2 * C + i], u = x[n * 2 * C + C + i];
  return g / (1.0 + std::exp(-g)) * u;
}

TEST(CpuOpKinds, SwigluMatchesTheFormulaAndItsDerivative) {
  const int64_t N = 2, C = 5;
  const auto cpu = make_cpu_backend();
  std::vector<float> x = uniform(N * 2 * C, 4, -4.0f, 4.0f), y(N * C);
  cpu->activation_forward(Activation::swiglu, TensorView(y.data(), {N, C}),
                          ConstTensorView(x.data(), {N, 2 * C}), {});
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < C; ++i) EXPECT_NEAR(y[n * C + i], swiglu_out(x, n, C, i), 1e-5);
  }
  const std::vector<float> dout = uniform(N * C, 5);
  std::vector<float> dx(N * 2 * C);
  cpu->activation_backward(Activation::swiglu, TensorView(dx.data(), {N, 2 * C}),
                           ConstTensorView(x.data(), {N, 2 * C}), ConstTensorView(dout.data(), {N, C}),
                           nullptr, {});
  const float h = 1e-3f;
  for (int64_t k = 0; k < N * 2 * C; ++k) {
    std::vector<float> plus = x, minus = x;
    plus[k] += h;
    minus[k] -= h;
    double numeric = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < C; ++i) {
        numeric += dout[n * C + i] * (swiglu_out(plus, n, C, i) - swiglu_out(minus, n, C, i));
      }
    }
    numeric /= plus[k] - minus[k];
    EXPECT_NEAR(dx[k], numeric, 2e-3) << "dx " << k;
  }
  // The output must be [N, C] for an input of [N, 2C].
  EXPECT_NE(error_of([&] {
              cpu->activation_forward(Activation::swiglu, TensorView(y.data(), {N, 2 * C}),
                                      ConstTensorView(x.data(), {N, 2 * C}), {});
            }).find("activation_forward: out has shape [2, 10], expected 2 rows of 5"),
            std::string::npos);
}

TEST(CpuOpKinds, RotaryEmbeddingRotatesTheFirstHeadsOfEachRow) {
  // B = 1, T = 2, head size 4, rows of three heads; the first two rotate. Position 0: angle 0 (cos 1, sin 0);
  // position 1: a quarter turn for the first pair, a half turn for the second: exact values.
  const int64_t T = 2, hs = 4, W = 3 * hs;
  const auto cpu = make_cpu_backend();
  const std::vector<float> table = {1, 1,  0, 0,   // t = 0: cos, cos, sin, sin
                                    0, -1, 1, 0};  // t = 1
  std::vector<float> x(T * W);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i + 1);
  const std::vector<float> original = x;
  cpu->rotary_embedding(TensorView(x.data(), {1, T, W}), ConstTensorView(table.data(), {T, hs}), 2, false);
  for (int64_t i = 0; i < W; ++i) EXPECT_EQ(x[i], original[i]) << i;  // position 0 unchanged
  for (int64_t h = 0; h < 3; ++h) {
    const float* o = original.data() + W + h * hs;
    const float* r = x.data() + W + h * hs;
    if (h == 2) {  // not rotated
      for (int64_t i = 0; i < hs; ++i) EXPECT_EQ(r[i], o[i]);
      continue;
    }
    // Pair 0 (x0, x2), a quarter turn: (-x2, x0). Pair 1 (x1, x3), a half turn: (-x1, -x3).
    EXPECT_EQ(r[0], -o[2]);
    EXPECT_EQ(r[2], o[0]);
    EXPECT_EQ(r[1], -o[1]);
    EXPECT_EQ(r[3], -o[3]);
  }
  cpu->rotary_embedding(TensorView(x.data(), {1, T, W}), ConstTensorView(table.data(), {T, hs}), 2, true);
  EXPECT_EQ(x, original);
  EXPECT_NE(error_of([&] {
              cpu->rotary_embedding(TensorView(x.data(), {1, T, W}), ConstTensorView(table.data(), {T, hs}),
                                    4, false);
            }).find("4 heads of 4 fit in a row of x"),
            std::string::npos);
}

TEST(CpuOpKinds, GroupedQueryAttentionIsMultiHeadAttentionWithSharedKeysAndValues) {
  // 4 query heads, 2 kv heads: the same as multi-head attention whose k and v heads 0, 1, 2, 3 are the kv
  // heads 0, 0, 1, 1.
  const int64_t B = 2, T = 5, NH = 4, KV = 2, hs = 3, C = NH * hs, kvC = KV * hs;
  const auto cpu = make_cpu_backend();
  const std::vector<float> gqa = uniform(B * T * (C + 2 * kvC), 6);
  std::vector<float> mha(static_cast<size_t>(B * T * 3 * C));
  for (int64_t r = 0; r < B * T; ++r) {
    const float* g = gqa.data() + r * (C + 2 * kvC);
    float* m = mha.data() + r * 3 * C;
    for (int64_t i = 0; i < C; ++i) m[i] = g[i];
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < hs; ++i) {
        m[C + h * hs + i] = g[C + h / 2 * hs + i];
        m[2 * C + h * hs + i] = g[C + kvC + h / 2 * hs + i];
      }
    }
  }
  std::vector<float> out_g(B * T * C), out_m(B * T * C), lse_g(B * NH * T), lse_m(B * NH * T);
  cpu->attention_forward(TensorView(out_g.data(), {B, T, C}), lse_g.data(),
                         ConstTensorView(gqa.data(), {B, T, C + 2 * kvC}), AttentionHeads(NH, KV));
  cpu->attention_forward(TensorView(out_m.data(), {B, T, C}), lse_m.data(),
                         ConstTensorView(mha.data(), {B, T, 3 * C}), NH);
  EXPECT_EQ(out_g, out_m);
  EXPECT_EQ(lse_g, lse_m);
  const std::vector<float> dout = uniform(B * T * C, 7);
  std::vector<float> d_g(gqa.size()), d_m(mha.size());
  cpu->attention_backward(TensorView(d_g.data(), {B, T, C + 2 * kvC}),
                          ConstTensorView(dout.data(), {B, T, C}),
                          ConstTensorView(gqa.data(), {B, T, C + 2 * kvC}),
                          ConstTensorView(out_g.data(), {B, T, C}), lse_g.data(), AttentionHeads(NH, KV));
  cpu->attention_backward(TensorView(d_m.data(), {B, T, 3 * C}), ConstTensorView(dout.data(), {B, T, C}),
                          ConstTensorView(mha.data(), {B, T, 3 * C}),
                          ConstTensorView(out_m.data(), {B, T, C}), lse_m.data(), NH);
  for (int64_t r = 0; r < B * T; ++r) {
    const float* g = d_g.data() + r * (C + 2 * kvC);
    const float* m = d_m.data() + r * 3 * C;
    for (int64_t i = 0; i < C; ++i) EXPECT_EQ(g[i], m[i]) << "dq " << r << "," << i;
    // A kv head's gradient is the sum of the gradients of the two heads that share it.
    for (int64_t k = 0; k < KV; ++k) {
      for (int64_t i = 0; i < hs; ++i) {
        const int64_t a = 2 * k * hs + i, b = (2 * k + 1) * hs + i;
        EXPECT_NEAR(g[C + k * hs + i], m[C + a] + m[C + b], 1e-5) << "dk " << r;
        EXPECT_NEAR(g[C + kvC + k * hs + i], m[2 * C + a] + m[2 * C + b], 1e-5) << "dv " << r;
      }
    }
  }
  EXPECT_NE(error_of([&] {
              cpu->attention_forward(TensorView(out_g.data(), {B, T, C}), lse_g.data(),
                                     ConstTensorView(gqa.data(), {B, T, C + 2 * kvC}), AttentionHeads(NH, 3));
            }).find("kv_heads (3) divides heads (4)"),
            std::string::npos);
}

TEST(CpuOpKinds, RmsNormTakesNoMeanAndNoBias) {
  const auto cpu = make_cpu_backend();
  std::vector<float> x(8, 1.0f), y(8), w(4, 1.0f), stat(2);
  EXPECT_NE(error_of([&] {
              cpu->normalization_forward(Normalization::rmsnorm, TensorView(y.data(), {2, 4}), stat.data(),
                                         stat.data(), ConstTensorView(x.data(), {2, 4}), w.data(), nullptr,
                                         {});
            }).find("normalization_forward: rmsnorm takes no mean and no bias"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              cpu->normalization_forward(Normalization::layernorm, TensorView(y.data(), {2, 4}), nullptr,
                                         stat.data(), ConstTensorView(x.data(), {2, 4}), w.data(), nullptr,
                                         {});
            }).find("normalization_forward: layernorm takes a mean and a bias"),
            std::string::npos);
}

}  // namespace
}  // namespace octet
