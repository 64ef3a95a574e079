// Every op of the Backend interface on the CUDA backend against the CPU reference, on fresh seeded inputs
// over odd and prime shapes (the harness is backend_ops_harness.h; attention and the linear layers have their
// own files). One maker per op builds its cases: operands, the call, and per output the comparison with its
// tolerance's rationale in one line. Exact ops must match bit for bit; reductions get float32 tolerances
// scaled by their length. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Activation;
using octet::Backend;
using octet::ConstTensorView;
using octet::Normalization;
using octet::TensorView;
using octet::testing::random_normal;
using octet::testing::random_uniform;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<double> none() {
  return {};
}

// Element counts for the elementwise ops: one, odd, prime, and past one pass of a typical grid.
const std::vector<int64_t> kCounts = {1, 7, 91, 3221, 65537, (1 << 20) + 3};

// --- embeddings ---

struct EmbeddingShape {
  int64_t B, T, C, V;
};
// The last has few tokens for many positions, so that the backward's sums over repeated tokens are long.
const std::vector<EmbeddingShape> kEmbeddingShapes = {
    {1, 1, 1, 1}, {1, 1, 8, 3}, {2, 37, 24, 11}, {3, 64, 48, 97}, {2, 257, 96, 5}};

// With learned positions (GPT-2's wpe) and without (a view without data: a model with rotary positions).
std::vector<OpCase> embedding_forward_cases() {
  std::vector<OpCase> cases;
  for (const bool positions : {true, false}) {
    for (const auto& [B, T, C, V] : kEmbeddingShapes) {
      const std::string op = positions ? "embedding_forward" : "embedding_forward without positions";
      OpCase c{op, shape_label({{"B", B}, {"T", T}, {"C", C}, {"V", V}}), {}, {}, {}};
      const uint64_t seed = seed_of(c.op, c.shape);
      std::vector<float> table = random_normal(V * C, seed + 1);
      table[0] = -0.0f;  // copied as it is where there are no positions (not -0 + 0 = +0)
      c.operands = {output("out", B * T * C), input_ints("tokens", random_indices(B * T, seed, V)),
                    input("table", table), input("positions", random_normal(T * C, seed + 2))};
      c.run = [=](Backend& b, const std::vector<void*>& p) {
        const ConstTensorView position_table(positions ? floats_at(p, 3) : nullptr, octet::Dtype::f32,
                                             {T, C});
        b.embedding_forward(TensorView(floats_at(p, 0), {B, T, C}), ints_at(p, 1),
                            ConstTensorView(floats_at(p, 2), {V, C}), position_table);
        return none();
      };
      c.checks = {exact("out", positions
                                   ? "one float32 addition per element: the same bits on any IEEE machine"
                                   : "the table's rows, copied")};
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

std::vector<OpCase> embedding_backward_cases() {
  std::vector<OpCase> cases;
  for (const bool positions : {true, false}) {
    for (const auto& [B, T, C, V] : kEmbeddingShapes) {
      const std::string op = positions ? "embedding_backward" : "embedding_backward without positions";
      OpCase c{op, shape_label({{"B", B}, {"T", T}, {"C", C}, {"V", V}}), {}, {}, {}};
      const uint64_t seed = seed_of(c.op, c.shape);
      const std::vector<int32_t> tokens = random_indices(B * T, seed, V);  // few V: tokens repeat
      const std::vector<float> dwte = random_normal(V * C, seed + 1), dwpe = random_normal(T * C, seed + 2);
      const std::vector<float> dout = random_normal(B * T * C, seed + 3);
      // What flows into each accumulated element: its old value and every dout row added to it.
      std::vector<float> wte_terms(dwte.size()), wpe_terms(dwpe.size());
      for (size_t i = 0; i < dwte.size(); ++i) wte_terms[i] = std::fabs(dwte[i]);
      for (size_t i = 0; i < dwpe.size(); ++i) wpe_terms[i] = std::fabs(dwpe[i]);
      for (int64_t n = 0; n < B * T; ++n) {
        for (int64_t i = 0; i < C; ++i) {
          wte_terms[tokens[n] * C + i] += std::fabs(dout[n * C + i]);
          wpe_terms[(n % T) * C + i] += std::fabs(dout[n * C + i]);
        }
      }
      c.operands = {in_out("dtable", dwte), in_out("dpositions", dwpe), input("dout", dout),
                    input_ints("tokens", tokens)};
      c.run = [=](Backend& b, const std::vector<void*>& p) {
        const TensorView dpositions(positions ? floats_at(p, 1) : nullptr, octet::Dtype::f32, {T, C});
        b.embedding_backward(TensorView(floats_at(p, 0), {V, C}), dpositions,
                             ConstTensorView(floats_at(p, 2), {B, T, C}), ints_at(p, 3));
        return none();
      };
      c.checks = {close("dtable", B * T + 1, wte_terms, "a float32 sum of at most B*T+1 terms in any order")};
      if (positions) {
        c.checks.push_back(close("dpositions", B + 1, wpe_terms, "a float32 sum of B+1 terms in any order"));
      } else {
        c.checks.push_back(exact("dpositions", "no positions: left as they were"));
      }
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// --- LayerNorm ---

struct RowStats {
  std::vector<float> mean, rstd, mean_abs;
};

// Mean, 1/sqrt(var + 1e-5) and mean |x| of every row, in float64.
RowStats row_stats(const std::vector<float>& x, int64_t N, int64_t C) {
  RowStats s;
  for (int64_t n = 0; n < N; ++n) {
    double sum = 0.0, sum_abs = 0.0, var = 0.0;
    for (int64_t i = 0; i < C; ++i) sum += x[n * C + i], sum_abs += std::fabs(x[n * C + i]);
    const double m = sum / static_cast<double>(C);
    for (int64_t i = 0; i < C; ++i) var += (x[n * C + i] - m) * (x[n * C + i] - m);
    s.mean.push_back(static_cast<float>(m));
    s.rstd.push_back(static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(C) + 1e-5)));
    s.mean_abs.push_back(static_cast<float>(sum_abs / static_cast<double>(C)));
  }
  return s;
}

const std::vector<std::pair<int64_t, int64_t>> kLayerNormShapes = {{1, 1},    {13, 7},   {74, 24},
                                                                   {37, 768}, {3, 3221}, {256, 64}};

OpCase layernorm_forward_case(int64_t N, int64_t C, std::vector<float> x, const std::string& label) {
  OpCase c{"layernorm_forward", label, {}, {}, {}};
  const uint64_t seed = seed_of(c.op, c.shape);
  const std::vector<float> w = random_normal(C, seed + 1), bias = random_normal(C, seed + 2);
  const RowStats s = row_stats(x, N, C);
  // The output's error: the mean's (C 2^-24 mean|x|) and rstd's (relative (C+4) 2^-24), through |w| rstd.
  std::vector<float> out_terms(static_cast<size_t>(N * C));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < C; ++i) {
      out_terms[n * C + i] =
          std::fabs(w[i]) * s.rstd[n] * (s.mean_abs[n] + std::fabs(x[n * C + i] - s.mean[n])) +
          std::fabs(bias[i]);
    }
  }
  c.operands = {output("out", N * C), output("mean", N),  output("rstd", N),
                input("inp", x),      input("weight", w), input("bias", bias)};
  c.run = [=](Backend& b, const std::vector<void*>& p) {
    b.normalization_forward(Normalization::layernorm, TensorView(floats_at(p, 0), {N, C}), floats_at(p, 1),
                            floats_at(p, 2), ConstTensorView(floats_at(p, 3), {N, C}), floats_at(p, 4),
                            floats_at(p, 5), {});
    return none();
  };
  c.checks = {close("mean", C, s.mean_abs, "a sum of C float32 terms: C 2^-24 of mean |x|"),
              close("rstd", C + 4, {}, "sum of C squares, then sqrt and a division: relative (C+4) 2^-24"),
              close("out", C + 4, out_terms, "the mean's and rstd's errors carried through |w| rstd")};
  return c;
}

std::vector<OpCase> layernorm_forward_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, C] : kLayerNormShapes) {
    const std::string label = shape_label({{"N", N}, {"C", C}});
    std::vector<float> x = random_normal(N * C, seed_of("layernorm_forward inp", label), 2.0f);
    for (float& v : x) v += 0.5f;  // a non-zero mean, so that subtracting it matters
    cases.push_back(layernorm_forward_case(N, C, x, label));
  }
  return cases;
}

std::vector<OpCase> layernorm_backward_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, C] : kLayerNormShapes) {
    OpCase c{"layernorm_backward", shape_label({{"N", N}, {"C", C}}), {}, {}, {}};
    const uint64_t seed = seed_of(c.op, c.shape);
    const std::vector<float> x = random_normal(N * C, seed), w = random_normal(C, seed + 1);
    const std::vector<float> dout = random_normal(N * C, seed + 2);
    const std::vector<float> dinp = random_normal(N * C, seed + 3), dw = random_normal(C, seed + 4),
                             db = random_normal(C, seed + 5);
    const RowStats s = row_stats(x, N, C);
    std::vector<float> dinp_terms(dinp.size()), dw_terms(C), db_terms(C);
    for (int64_t i = 0; i < C; ++i) dw_terms[i] = std::fabs(dw[i]), db_terms[i] = std::fabs(db[i]);
    for (int64_t n = 0; n < N; ++n) {
      double mean_dnorm = 0.0, mean_dnorm_norm = 0.0;
      for (int64_t i = 0; i < C; ++i) {
        const double norm = (x[n * C + i] - s.mean[n]) * s.rstd[n], dnorm = w[i] * dout[n * C + i];
        mean_dnorm += std::fabs(dnorm) / static_cast<double>(C);
        mean_dnorm_norm += std::fabs(dnorm * norm) / static_cast<double>(C);
        dw_terms[i] += static_cast<float>(std::fabs(norm * dout[n * C + i]));
        db_terms[i] += std::fabs(dout[n * C + i]);
      }
      for (int64_t i = 0; i < C; ++i) {
        const double norm = (x[n * C + i] - s.mean[n]) * s.rstd[n], dnorm = w[i] * dout[n * C + i];
        dinp_terms[n * C + i] =
            static_cast<float>(std::fabs(dinp[n * C + i]) + s.rstd[n] * (std::fabs(dnorm) + mean_dnorm +
                                                                         std::fabs(norm) * mean_dnorm_norm));
      }
    }
    OpCase joint = c;
    c.operands = {in_out("dinp", dinp), in_out("dweight", dw), in_out("dbias", db),   input("dout", dout),
                  input("inp", x),      input("weight", w),    input("mean", s.mean), input("rstd", s.rstd)};
    c.run = [=](Backend& b, const std::vector<void*>& p) {
      b.normalization_backward(Normalization::layernorm, floats_at(p, 0), floats_at(p, 1), floats_at(p, 2),
                               ConstTensorView(floats_at(p, 3), {N, C}), floats_at(p, 4), floats_at(p, 5),
                               floats_at(p, 6), floats_at(p, 7));
      return none();
    };
    c.checks = {close("dbias", N + 1, db_terms, "a float32 sum over N rows plus the old value"),
                close("dweight", N + 4, dw_terms, "a sum over N rows of norm * dout (norm: 2 roundings)"),
                close("dinp", C + 4, dinp_terms, "two row sums of C terms, carried through rstd")};
    cases.push_back(std::move(c));
    // dweight and dbias side by side, as a LayerNorm's parameters lie in the model (a backend may sum both
    // in one pass there).
    joint.shape += ", dbias after dweight";
    std::vector<float> dw_db = dw, dw_db_terms = dw_terms;
    dw_db.insert(dw_db.end(), db.begin(), db.end());
    dw_db_terms.insert(dw_db_terms.end(), db_terms.begin(), db_terms.end());
    joint.operands = {
        in_out("dinp", dinp), in_out("dweight, dbias", dw_db), input("dout", dout),  input("inp", x),
        input("weight", w),   input("mean", s.mean),           input("rstd", s.rstd)};
    joint.run = [=](Backend& b, const std::vector<void*>& p) {
      b.normalization_backward(Normalization::layernorm, floats_at(p, 0), floats_at(p, 1),
                               floats_at(p, 1) + C, ConstTensorView(floats_at(p, 2), {N, C}), floats_at(p, 3),
                               floats_at(p, 4), floats_at(p, 5), floats_at(p, 6));
      return none();
    };
    joint.checks = {close("dweight, dbias", N + 4, dw_db_terms, "the sums above, side by side"),
                    close("dinp", C + 4, dinp_terms, "two row sums of C terms, carried through rstd")};
    cases.push_back(std::move(joint));
  }
  return cases;
}

// --- elementwise ---

// GELU computes a cube, a polynomial, tanh (the CPU: std::tanh, at most 2 ulps on glibc) or its logistic
// form (the CUDA backend: approximate exp2 and reciprocal, about 2 and 1 ulps) and products.
constexpr int64_t kGeluRoundings = 8;
constexpr float kGeluScale = 0.7978845608028654f;
// Where results are subnormal a rounding costs up to half a subnormal step, 2^-150 = 2^-24 * 2^-126: a term
// of magnitude 2^-126 (the smallest normal) in every element covers it.
const float kSubnormalStep = std::ldexp(1.0f, -126);

OpCase gelu_forward_case(const std::vector<float>& x, const std::string& label) {
  OpCase c{"gelu_forward", label, {}, {}, {}};
  std::vector<float> terms(x.size());
  for (size_t i = 0; i < x.size(); ++i) terms[i] = std::fabs(x[i]) + kSubnormalStep;
  const auto n = static_cast<int64_t>(x.size());
  c.operands = {output("out", x.size()), input("inp", x)};
  c.run = [=](Backend& b, const std::vector<void*>& p) {
    b.activation_forward(Activation::gelu, TensorView(floats_at(p, 0), {n}),
                         ConstTensorView(floats_at(p, 1), {n}), {});
    return none();
  };
  c.checks = {
      close("out", kGeluRoundings, terms, "a few float32 roundings and tanh's ulps, each of |x| + 2^-126")};
  return c;
}

OpCase gelu_backward_case(const std::vector<float>& x, const std::vector<float>& dout,
                          const std::string& label) {
  OpCase c{"gelu_backward", label, {}, {}, {}};
  std::vector<float> terms(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float slope = std::fabs(x[i]) * kGeluScale * (1.0f + 3.0f * 0.044715f * x[i] * x[i]);
    terms[i] = std::fabs(dout[i]) * (1.0f + slope) + kSubnormalStep;
  }
  const auto n = static_cast<int64_t>(x.size());
  c.operands = {output("dinp", x.size()), input("inp", x), input("dout", dout)};
  c.run = [=](Backend& b, const std::vector<void*>& p) {
    b.activation_backward(Activation::gelu, TensorView(floats_at(p, 0), {n}),
                          ConstTensorView(floats_at(p, 1), {n}), ConstTensorView(floats_at(p, 2), {n}),
                          nullptr, {});
    return none();
  };
  c.checks = {
      close("dinp", kGeluRoundings + 4, terms, "GELU's roundings and the derivative's terms, times |dout|")};
  return c;
}

OpCase add_case(const std::vector<float>& a, const std::vector<float>& b_values, const std::string& label) {
  OpCase c{"add", label, {}, {}, {}};
  const auto n = static_cast<int64_t>(a.size());
  c.operands = {output("out", a.size()), input("a", a), input("b", b_values)};
  c.run = [=](Backend& b, const std::vector<void*>& p) {
    b.add(TensorView(floats_at(p, 0), {n}), ConstTensorView(floats_at(p, 1), {n}),
          ConstTensorView(floats_at(p, 2), {n}));
    return none();
  };
  c.checks = {exact("out", "one float32 addition per element")};
  return c;
}

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> cases;
  for (const int64_t n : kCounts) {
    const std::string label = shape_label({{"n", n}});
    const uint64_t seed = seed_of("elementwise", label);
    const std::vector<float> x = random_normal(n, seed, 3.0f), y = random_normal(n, seed + 1);
    cases.push_back(gelu_forward_case(x, label));
    cases.push_back(gelu_backward_case(x, y, label));
    cases.push_back(add_case(x, y, label));

    OpCase acc{"add into a", label, {in_out("a", x), input("b", y)}, {}, {}};
    acc.run = [=](Backend& b, const std::vector<void*>& p) {
      b.add(TensorView(floats_at(p, 0), {n}), ConstTensorView(floats_at(p, 0), {n}),
            ConstTensorView(floats_at(p, 1), {n}));
      return none();
    };
    acc.checks = {exact("a", "one float32 addition per element")};
    cases.push_back(std::move(acc));

    OpCase scale{"scale", label, {in_out("x", x)}, {}, {}};
    scale.run = [=](Backend& b, const std::vector<void*>& p) {
      b.scale(floats_at(p, 0), n, 0.7f);  // not a power of two: the product is rounded
      return none();
    };
    scale.checks = {exact("x", "one float32 multiplication per element")};
    cases.push_back(std::move(scale));

    OpCase zero{"fill_zero", label, {in_out("x", x)}, {}, {}};
    zero.run = [=](Backend& b, const std::vector<void*>& p) {
      b.fill_zero(floats_at(p, 0), n);
      return none();
    };
    zero.checks = {exact("x", "zeros")};
    cases.push_back(std::move(zero));
  }
  return cases;
}

// --- rounding to BF16 and FP16 (the logits of a BF16 LM head) ---

std::vector<OpCase> round_in_place_cases() {
  std::vector<OpCase> cases;
  for (const octet::Dtype dtype : {octet::Dtype::bf16, octet::Dtype::f16}) {
    const std::string name = std::string("round_in_place ") + std::string(octet::dtype_name(dtype));
    for (const int64_t n : kCounts) {
      const std::string label = shape_label({{"n", n}});
      std::vector<float> x = random_normal(n, seed_of(name, label), 3.0f);
      // First: ties of both formats (to even), FP16's overflow and subnormals, and the special values.
      const float bf16_tie = 1.0f + std::ldexp(1.0f, -8), f16_tie = 1.0f + std::ldexp(1.0f, -11);
      const std::vector<float> specials = {bf16_tie,  3.0f * bf16_tie - 2.0f,
                                           f16_tie,   65520.0f,
                                           -70000.0f, 3e-6f,
                                           1e-40f,    -0.0f,
                                           kNaN,      kInf,
                                           -kInf,     3.4e38f};
      for (size_t i = 0; i < specials.size() && i < x.size(); ++i) x[i] = specials[i];
      OpCase c{name, label, {in_out("x", x)}, {}, {}};
      c.run = [=](Backend& b, const std::vector<void*>& p) {
        b.round_in_place(floats_at(p, 0), n, dtype);
        return none();
      };
      c.checks = {exact("x", "one rounding to nearest even per element, octet's shared minifloat code")};
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// --- loss ---

// Softmax cross-entropy on rows of Vp logits (the first V real); `logits` may hold planted NaN or -Inf.
OpCase softmax_cross_entropy_case(int64_t N, int64_t V, int64_t Vp, float dloss, std::vector<float> logits,
                                  const std::vector<int32_t>& targets, const std::string& label) {
  OpCase c{"softmax_cross_entropy", label, {}, {}, {}};
  std::vector<float> loss_terms(N), grad_terms(logits.size(), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits.data() + n * Vp;
    float max = -kInf;
    for (int64_t v = 0; v < V; ++v) max = row[v] > max ? row[v] : max;
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
    const double log_sum = std::log(sum), loss = log_sum - (row[targets[n]] - max);
    // log-sum-exp: V exponentials summed, an absolute error of about (V+4) 2^-24, plus rounding of the loss.
    loss_terms[n] = static_cast<float>(1.0 + std::fabs(loss) + std::fabs(log_sum));
    for (int64_t v = 0; v < V; ++v) {
      const double prob = std::exp(static_cast<double>(row[v]) - max) / sum;
      grad_terms[n * Vp + v] = static_cast<float>(std::fabs(dloss) * (prob + (v == targets[n] ? 1.0 : 0.0)));
    }
  }
  c.operands = {output("losses", N), in_out("logits", logits), input_ints("targets", targets)};
  c.run = [=](Backend& b, const std::vector<void*>& p) {
    b.softmax_cross_entropy(floats_at(p, 0), TensorView(floats_at(p, 1), {N, Vp}), ints_at(p, 2), V, dloss);
    return none();
  };
  c.checks = {close("losses", V + 4, loss_terms, "a sum of V exponentials: absolute (V+4) 2^-24 on the log")};
  if (dloss == 0.0f) {
    c.checks.push_back(exact("logits", "dloss 0: the logits are left as they are"));
  } else {
    c.checks.push_back(close("logits", V + 4, grad_terms,
                             "p relative to the sum's (V+4) 2^-24, times |dloss|; padded columns exactly 0"));
  }
  return c;
}

std::vector<OpCase> softmax_cross_entropy_cases() {
  std::vector<OpCase> cases;
  struct LossShape {
    int64_t N, V, Vp;
  };
  // Rows the CUDA backend stages in shared memory (whole 16-byte copies), rows of Vp % 4 != 0 (one logit per
  // load), and float32 rows just inside and just past what shared memory holds.
  for (const auto& [N, V, Vp] : std::vector<LossShape>{{1, 1, 1},
                                                       {13, 97, 128},
                                                       {37, 61, 64},
                                                       {5, 61, 63},
                                                       {4, 1000, 1024},
                                                       {3, 50257, 50304},
                                                       {2, 56999, 57000},
                                                       {2, 60000, 60000}}) {
    for (const float dloss : {0.0f, 1.0f / static_cast<float>(N), 1024.0f / static_cast<float>(N)}) {
      const std::string label =
          shape_label({{"N", N}, {"V", V}, {"Vp", Vp}}) + " dloss=" + std::to_string(dloss);
      const uint64_t seed = seed_of("softmax_cross_entropy", label);
      cases.push_back(softmax_cross_entropy_case(N, V, Vp, dloss, random_normal(N * Vp, seed, 3.0f),
                                                 random_indices(N, seed + 1, V), label));
    }
  }
  return cases;
}

// --- optimizer and gradient utilities ---

std::vector<OpCase> reduction_cases() {
  std::vector<OpCase> cases;
  for (const int64_t n : kCounts) {
    const std::string label = shape_label({{"n", n}});
    const std::vector<float> x = random_normal(n, seed_of("sum_of_squares", label));
    OpCase sum{"sum_of_squares", label, {input("x", x)}, {}, {}};
    sum.run = [=](Backend& b, const std::vector<void*>& p) {
      return std::vector<double>{b.sum_of_squares(ConstTensorView(floats_at(p, 0), {n}))};
    };
    sum.checks = {close("result", n, {}, "a sum of n non-negative terms: relative n 2^-24 at worst")};
    cases.push_back(std::move(sum));

    // all_finite with nothing planted, then an Inf or a NaN in the last element and -Inf in the first.
    struct Plant {
      const char* what;
      int64_t index;  // -1: nothing planted
      float value;
    };
    for (const auto& [what, index, value] : std::vector<Plant>{{"finite", -1, 0.0f},
                                                               {"+Inf last", n - 1, kInf},
                                                               {"NaN last", n - 1, kNaN},
                                                               {"-Inf first", 0, -kInf}}) {
      std::vector<float> planted = x;
      if (index >= 0) planted[index] = value;
      OpCase finite{"all_finite", label + " " + what, {input("x", planted)}, {}, {}};
      finite.run = [=](Backend& b, const std::vector<void*>& p) {
        return std::vector<double>{b.all_finite(floats_at(p, 0), n) ? 1.0 : 0.0};
      };
      finite.checks = {exact("result", "a yes or no")};
      cases.push_back(std::move(finite));
    }
  }
  return cases;
}

// optimizer_update over plain segments of params, m and v [n] (no weight copies: backend_ops_optimizer.cpp
// has those), each segment's gradient at its grad_at() in grads [n].
OpCase adamw_case(const std::string& label, int64_t n, const std::vector<Backend::UpdateSegment>& segments) {
  OpCase c{"optimizer_update", label, {}, {}, {}};
  const uint64_t seed = seed_of(c.op, c.shape);
  const std::vector<float> params = random_normal(n, seed), m = random_normal(n, seed + 1, 0.1f);
  const std::vector<float> v = random_uniform(n, seed + 2, 0.0f, 0.01f), grads = random_normal(n, seed + 3);
  const Backend::AdamWStep h{
      .learning_rate = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .step = 7, .grad_scale = 0.5f};
  c.operands = {in_out("params", params), in_out("m", m), in_out("v", v), input("grads", grads)};
  c.run = [=](Backend& b, const std::vector<void*>& p) {
    b.optimizer_update(h, {floats_at(p, 0), floats_at(p, 1), floats_at(p, 2), floats_at(p, 3)}, segments);
    return none();
  };
  c.checks = adamw_checks(h, segments, params, m, v, grads);
  return c;
}

std::vector<OpCase> adamw_cases() {
  std::vector<OpCase> cases;
  // One segment over the whole tensor, with weight decay.
  for (const int64_t n : kCounts) {
    cases.push_back(
        adamw_case(shape_label({{"n", n}}), n, {{.offset = 0, .count = n, .weight_decay = 0.1f}}));
  }
  // Segments as the optimizer passes a model's biases and LayerNorms: odd lengths and offsets, one decay
  // besides none, a gap left alone, and the gradients in another order than the tensors (grad_offset).
  for (const int64_t n : {int64_t{3221}, int64_t{65537}}) {
    const int64_t a = n / 3, gap = 5, b = n - a - gap;
    const std::vector<Backend::UpdateSegment> segments = {
        {.offset = 0, .count = a, .weight_decay = 0.1f, .grad_offset = b + gap},
        {.offset = a + gap, .count = b, .weight_decay = 0.0f, .grad_offset = 0}};
    cases.push_back(
        adamw_case(shape_label({{"n", n}}) + " two segments, a gap, gradients swapped", n, segments));
  }
  return cases;
}

// --- NaN and Inf propagation: the backends must agree on which outputs are NaN or infinite ---

std::vector<OpCase> non_finite_cases() {
  std::vector<OpCase> cases;
  const std::string label = "n=16 with NaN, +-Inf, +-1e20, +-0, a subnormal";
  std::vector<float> x = random_normal(16, seed_of("non-finite", label), 2.0f);
  x[1] = kNaN, x[3] = kInf, x[4] = -kInf, x[6] = 1e20f, x[7] = -1e20f, x[9] = 0.0f, x[10] = -0.0f,
  x[12] = 1e-40f;
  std::vector<float> y = random_normal(16, seed_of("non-finite dout", label));
  y[2] = kNaN, y[3] = -kInf, y[5] = kInf, y[8] = kNaN;
  cases.push_back(gelu_forward_case(x, label));
  cases.push_back(gelu_backward_case(x, y, label));
  cases.push_back(add_case(x, y, label));  // includes Inf + -Inf

  // LayerNorm with a NaN in row 2 of 5: that row all NaN (mean and rstd too), the others untouched.
  std::vector<float> rows = random_normal(5 * 7, seed_of("non-finite layernorm", label));
  rows[2 * 7 + 3] = kNaN;
  cases.push_back(layernorm_forward_case(5, 7, rows, "N=5 C=7, NaN in row 2"));

  // Softmax rows: a NaN logit (row NaN), a NaN in a padded column (ignored), -Inf in column 0 (p = 0; a
  // running maximum that starts at -Inf must not make it NaN).
  const int64_t N = 4, V = 13, Vp = 16;
  std::vector<float> logits = random_normal(N * Vp, seed_of("non-finite softmax", label), 2.0f);
  const std::vector<int32_t> targets = {5, 6, 7, 8};
  logits[0 * Vp + 4] = kNaN;
  logits[1 * Vp + 14] = kNaN;
  logits[2 * Vp + 0] = -kInf;
  cases.push_back(softmax_cross_entropy_case(N, V, Vp, 0.25f, logits, targets,
                                             "N=4 V=13 Vp=16, NaN logit / NaN padding / -Inf in column 0"));
  return cases;
}

TEST(BackendOps, EmbeddingForward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(embedding_forward_cases());
}

TEST(BackendOps, EmbeddingBackward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(embedding_backward_cases());
}

TEST(BackendOps, LayerNormForward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(layernorm_forward_cases());
}

TEST(BackendOps, LayerNormBackward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(layernorm_backward_cases());
}

TEST(BackendOps, ElementwiseGeluAddScaleFillZero) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(elementwise_cases());
}

TEST(BackendOps, RoundInPlace) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(round_in_place_cases());
}

TEST(BackendOps, SoftmaxCrossEntropy) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(softmax_cross_entropy_cases());
}

TEST(BackendOps, SumOfSquaresAndAllFinite) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(reduction_cases());
}

TEST(BackendOps, AdamW) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(adamw_cases());
}

TEST(BackendOps, NanAndInfPropagateAlike) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(non_finite_cases());
}

// Op timing (set_op_timing, take_op_times), which `octet bench train` reads: with timing on, the work
// enqueued since the last take comes back as device milliseconds under its kind (a linear layer's BF16 GEMM
// under gemm_wide, the loss under loss, an add under other; nothing under a kind that did not run), every
// value finite and not negative; a take with nothing enqueued since, and every take while timing is off,
// is all zeros. The CPU backend, which cannot time, always returns zeros.
TEST(BackendOps, OpTimingAddsEachOpToItsKind) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  EXPECT_EQ(reference->take_op_times(), octet::OpTimes{});
  for (const octet::BackendFactory* factory : tested_backends()) {
    SCOPED_TRACE(std::string("backend ") + std::string(factory->name()));
    const auto b = factory->make(octet::BackendOptions{});
    const int64_t N = 256, C = 512, OC = 512, V = 1000, Vp = 1024;
    auto inp = b->allocate(static_cast<size_t>(N * C) * sizeof(float));
    auto weight = b->allocate(static_cast<size_t>(OC * C) * sizeof(float));
    auto out = b->allocate(static_cast<size_t>(N * OC) * sizeof(float));
    auto logits = b->allocate(static_cast<size_t>(N * Vp) * sizeof(float));
    auto losses = b->allocate(static_cast<size_t>(N) * sizeof(float));
    auto targets = b->allocate(static_cast<size_t>(N) * sizeof(int32_t));  // zeros: token 0
    octet::LinearExecution exec;
    exec.forward = exec.input_gradient = exec.weight_gradient = octet::GemmMode::bf16;
    std::unique_ptr<octet::WeightCopy> copy;
    b->prepare_weight(copy, weight->floats(), OC, C, exec);
    const auto run_ops = [&] {
      b->linear_forward(TensorView(out->floats(), {N, OC}), ConstTensorView(inp->floats(), {N, C}),
                        ConstTensorView(weight->floats(), {OC, C}), copy.get(), {}, exec);
      b->softmax_cross_entropy(losses->floats(), TensorView(logits->floats(), {N, Vp}), targets->ints(), V,
                               0.0f);
      b->add(TensorView(out->floats(), {N, OC}), ConstTensorView(out->floats(), {N, OC}),
             ConstTensorView(out->floats(), {N, OC}));
    };
    const auto kind = [](const octet::OpTimes& t, octet::OpKind k) { return t[static_cast<size_t>(k)]; };
    b->set_op_timing(true);
    b->take_op_times();
    run_ops();
    const octet::OpTimes timed = b->take_op_times();
    for (size_t k = 0; k < octet::kOpKinds; ++k) {
      SCOPED_TRACE(std::string(octet::op_kind_name(static_cast<octet::OpKind>(k))));
      EXPECT_TRUE(std::isfinite(timed[k]) && timed[k] >= 0.0) << timed[k];
    }
    EXPECT_GT(kind(timed, octet::OpKind::gemm_wide), 0.0);
    EXPECT_GT(kind(timed, octet::OpKind::loss), 0.0);
    EXPECT_GT(kind(timed, octet::OpKind::other), 0.0);
    EXPECT_EQ(kind(timed, octet::OpKind::gemm_fp8), 0.0);
    EXPECT_EQ(kind(timed, octet::OpKind::attention), 0.0);
    EXPECT_EQ(b->take_op_times(), octet::OpTimes{}) << "nothing enqueued since the last take";
    b->set_op_timing(false);
    run_ops();
    EXPECT_EQ(b->take_op_times(), octet::OpTimes{}) << "timing off";
  }
}

}  // namespace
