// Causal self-attention on the CUDA backend against the CPU reference (harness: backend_ops_harness.h): the
// forward's output and log-sum-exp, the backward's dqkv, over head sizes 8, 12 and 64, T = 1 and primes past
// a tile. Tolerances follow the reductions: hs-term dot products for the scores, T-term sums over keys, each
// with the magnitudes of its terms, computed here in float64. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Backend;
using octet::ConstTensorView;
using octet::TensorView;
using octet::testing::random_normal;

struct AttentionShape {
  int64_t B, T, C, NH;
};
// Head sizes 8 (C=8, C=24), 12 (C=36), 64 (C=128, 64, 192); T = 1, primes, and past 128.
const std::vector<AttentionShape> kShapes = {{1, 1, 8, 1},    {2, 37, 24, 3},  {1, 17, 36, 3},
                                             {2, 33, 128, 2}, {1, 131, 64, 1}, {3, 64, 192, 3}};

// float64 attention over qkv: the forward's results (to feed the backward consistent inputs) and the
// magnitudes of the terms behind every output.
struct Attention {
  int64_t B, T, C, NH, hs;
  double scale;
  const std::vector<float>& qkv;

  const float* q(int64_t b, int64_t t, int64_t h) const { return qkv.data() + (b * T + t) * 3 * C + h * hs; }
  const float* k(int64_t b, int64_t t, int64_t h) const { return q(b, t, h) + C; }
  const float* v(int64_t b, int64_t t, int64_t h) const { return q(b, t, h) + 2 * C; }
  double score(int64_t b, int64_t t, int64_t t2, int64_t h) const {
    double dot = 0.0;
    for (int64_t i = 0; i < hs; ++i) dot += static_cast<double>(q(b, t, h)[i]) * k(b, t2, h)[i];
    return dot * scale;
  }
  // scale * sum |q_i k_i|: what a score's dot product rounds relative to.
  double score_terms(int64_t b, int64_t t, int64_t t2, int64_t h) const {
    double s = 0.0;
    for (int64_t i = 0; i < hs; ++i) s += std::fabs(static_cast<double>(q(b, t, h)[i]) * k(b, t2, h)[i]);
    return s * scale;
  }
  double lse(int64_t b, int64_t t, int64_t h) const {
    double max = -INFINITY, sum = 0.0;
    for (int64_t t2 = 0; t2 <= t; ++t2) max = std::max(max, score(b, t, t2, h));
    for (int64_t t2 = 0; t2 <= t; ++t2) sum += std::exp(score(b, t, t2, h) - max);
    return max + std::log(sum);
  }
};

Attention attention_of(const AttentionShape& s, const std::vector<float>& qkv) {
  const int64_t hs = s.C / s.NH;
  return {s.B, s.T, s.C, s.NH, hs, 1.0 / std::sqrt(static_cast<double>(hs)), qkv};
}

struct ForwardMagnitudes {
  std::vector<float> out, lse, out_values, lse_values;
};

ForwardMagnitudes forward_magnitudes(const Attention& a) {
  ForwardMagnitudes m;
  m.out.assign(static_cast<size_t>(a.B * a.T * a.C), 0.0f);
  m.out_values.assign(m.out.size(), 0.0f);
  m.lse.assign(static_cast<size_t>(a.B * a.NH * a.T), 0.0f);
  m.lse_values.assign(m.lse.size(), 0.0f);
  for (int64_t b = 0; b < a.B; ++b) {
    for (int64_t h = 0; h < a.NH; ++h) {
      for (int64_t t = 0; t < a.T; ++t) {
        const double lse = a.lse(b, t, h);
        double largest_terms = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2)
          largest_terms = std::max(largest_terms, a.score_terms(b, t, t2, h));
        const size_t row = static_cast<size_t>((b * a.NH + h) * a.T + t);
        m.lse[row] = static_cast<float>(std::fabs(lse) + 2.0 * largest_terms);
        m.lse_values[row] = static_cast<float>(lse);
        std::vector<double> terms(static_cast<size_t>(a.hs), 0.0), values(static_cast<size_t>(a.hs), 0.0);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double p = std::exp(a.score(b, t, t2, h) - lse);
          // p's relative error: its score's and the log-sum-exp's, each within the scores' term magnitudes.
          const double p_terms = p * (1.0 + 2.0 * largest_terms);
          for (int64_t i = 0; i < a.hs; ++i) {
            terms[i] += p_terms * std::fabs(a.v(b, t2, h)[i]);
            values[i] += p * a.v(b, t2, h)[i];
          }
        }
        for (int64_t i = 0; i < a.hs; ++i) {
          const size_t o = static_cast<size_t>((b * a.T + t) * a.C + h * a.hs + i);
          m.out[o] = static_cast<float>(terms[i]);
          m.out_values[o] = static_cast<float>(values[i]);
        }
      }
    }
  }
  return m;
}

std::vector<OpCase> attention_forward_cases() {
  std::vector<OpCase> cases;
  for (const AttentionShape& s : kShapes) {
    OpCase c{
        "attention_forward", shape_label({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"NH", s.NH}}), {}, {}, {}};
    // Scores of a few units: softmax rows neither uniform nor one-hot.
    const std::vector<float> qkv = random_normal(s.B * s.T * 3 * s.C, seed_of(c.op, c.shape), 1.5f);
    const ForwardMagnitudes m = forward_magnitudes(attention_of(s, qkv));
    c.operands = {output("out", s.B * s.T * s.C), output("lse", s.B * s.NH * s.T), input("qkv", qkv)};
    c.run = [s](Backend& b, const std::vector<void*>& p) {
      b.attention_forward(TensorView(floats_at(p, 0), {s.B, s.T, s.C}), floats_at(p, 1),
                          ConstTensorView(floats_at(p, 2), octet::Dtype::f32, {s.B, s.T, 3 * s.C}), s.NH);
      return std::vector<double>{};
    };
    const int64_t hs = s.C / s.NH, K = hs + s.T + 4;
    c.checks = {
        close("lse", K, m.lse, "hs-term dot products (scores), then a sum of T exponentials"),
        close("out", K, m.out, "a sum over T keys of p |v|, p carrying its score's and lse's errors")};
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<OpCase> attention_backward_cases() {
  std::vector<OpCase> cases;
  for (const AttentionShape& s : kShapes) {
    OpCase c{
        "attention_backward", shape_label({{"B", s.B}, {"T", s.T}, {"C", s.C}, {"NH", s.NH}}), {}, {}, {}};
    const uint64_t seed = seed_of(c.op, c.shape);
    const std::vector<float> qkv = random_normal(s.B * s.T * 3 * s.C, seed, 1.5f);
    const std::vector<float> dout = random_normal(s.B * s.T * s.C, seed + 1);
    const Attention a = attention_of(s, qkv);
    const ForwardMagnitudes f = forward_magnitudes(a);  // out and lse in float64, rounded once
    const std::vector<float>& out = f.out_values;
    std::vector<float> dqkv_terms(qkv.size(), 0.0f);
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t h = 0; h < s.NH; ++h) {
        for (int64_t t = 0; t < s.T; ++t) {
          const float* d = dout.data() + (b * s.T + t) * s.C + h * a.hs;
          const float* o = out.data() + (b * s.T + t) * s.C + h * a.hs;
          const double lse = f.lse_values[static_cast<size_t>((b * s.NH + h) * s.T + t)];
          double delta = 0.0, delta_terms = 0.0;
          for (int64_t i = 0; i < a.hs; ++i) delta += d[i] * o[i], delta_terms += std::fabs(d[i] * o[i]);
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const double p = std::exp(a.score(b, t, t2, h) - lse), p_error = 1.0 + a.score_terms(b, t, t2, h);
            double dp = 0.0, dp_terms = 0.0;
            for (int64_t i = 0; i < a.hs; ++i) {
              dp += d[i] * a.v(b, t2, h)[i];
              dp_terms += std::fabs(d[i] * a.v(b, t2, h)[i]);
            }
            // ds = p (dp - delta) scale: dp's and delta's sums, and p's own error on dp - delta.
            const double ds_terms = p * a.scale * (dp_terms + delta_terms + std::fabs(dp - delta) * p_error);
            for (int64_t i = 0; i < a.hs; ++i) {
              const size_t row_q = static_cast<size_t>((b * s.T + t) * 3 * s.C + h * a.hs + i);
              const size_t row_k = static_cast<size_t>((b * s.T + t2) * 3 * s.C + s.C + h * a.hs + i);
              dqkv_terms[row_q] += static_cast<float>(ds_terms * std::fabs(a.k(b, t2, h)[i]));
              dqkv_terms[row_k] += static_cast<float>(ds_terms * std::fabs(a.q(b, t, h)[i]));
              dqkv_terms[row_k + s.C] += static_cast<float>(p * p_error * std::fabs(d[i]));
            }
          }
        }
      }
    }
    c.operands = {output("dqkv", qkv.size()), input("dout", dout), input("qkv", qkv), input("out", out),
                  input("lse", f.lse_values)};
    c.run = [s](Backend& b, const std::vector<void*>& p) {
      b.attention_backward(TensorView(floats_at(p, 0), {s.B, s.T, 3 * s.C}),
                           ConstTensorView(floats_at(p, 1), {s.B, s.T, s.C}),
                           ConstTensorView(floats_at(p, 2), octet::Dtype::f32, {s.B, s.T, 3 * s.C}),
                           ConstTensorView(floats_at(p, 3), {s.B, s.T, s.C}), floats_at(p, 4), s.NH);
      return std::vector<double>{};
    };
    const int64_t hs = s.C / s.NH;
    c.checks = {
        close("dqkv", hs + s.T + 4, dqkv_terms,
              "hs-term sums (dp, delta, scores) and T-term sums over keys or queries, with their terms")};
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(BackendOps, AttentionForward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  for (const OpCase& c : attention_forward_cases()) run_case(*reference, *tested, c);
}

TEST(BackendOps, AttentionBackward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  for (const OpCase& c : attention_backward_cases()) run_case(*reference, *tested, c);
}

}  // namespace
