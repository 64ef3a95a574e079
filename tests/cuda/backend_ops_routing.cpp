// The mixture-of-experts routing ops (backend.h) on every tested backend against the CPU reference
// (harness: backend_ops_harness.h): the router's top-k softmax and its backward, the grouping of assignments
// by expert, the gather, combine, scatter and dot products of rows, and the column sums. Token counts of one,
// odd and prime sizes, E in {2, 8, 60}, k in {1, 2, E}, alignments 1 and 16, rows of odd widths and of
// multiples of
// 4. Integer outputs (experts, offsets, slots, positions) must be equal, and so must the gathered and
// combined rows, which round as the reference rounds; sums taken in another order (the softmax's, the dot
// products, the column sums) get float32 tolerances. Every float output must also be free of NaN and Inf.
// Then what the CUDA backend does with the indices out of range that the reference refuses. Every test skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Backend;
using octet::ConstTensorView;
using octet::grouped_rows;
using octet::TensorView;
using octet::testing::random_normal;
using octet::testing::random_uniform;

std::vector<double> none() {
  return {};
}

// --- the router ---

struct RouterShape {
  int64_t N, E, k;
};

// E in {2, 8, 60} with k in {1, 2, E}, over 1, 37 and 1031 tokens.
std::vector<RouterShape> router_shapes() {
  std::vector<RouterShape> shapes;
  for (const int64_t E : {2, 8, 60}) {
    std::vector<int64_t> ks = {1, 2, E};
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (const int64_t k : ks) {
      for (const int64_t N : {1, 37, 1031}) shapes.push_back({N, E, k});
    }
  }
  return shapes;
}

// Logits whose probabilities are never near a tie, so that both backends choose the same experts: a row is
// a shift plus a step times a permutation of 0 .. E - 1, the step at least 1e-3 (probabilities at least 0.1%
// apart, where the two softmaxes differ by a few ulps). Shifts of up to +-30 overflow exp unless the row's
// maximum is subtracted; steps of up to 0.5 spread the probabilities over e^-30.
std::vector<float> router_logits(int64_t N, int64_t E, uint64_t seed) {
  const std::vector<float> shift = random_uniform(N, seed, -30.0f, 30.0f);
  const std::vector<float> step = random_uniform(N, seed + 1, 1e-3f, 0.5f);
  const std::vector<float> keys = random_uniform(N * E, seed + 2, 0.0f, 1.0f);
  std::vector<float> z(static_cast<size_t>(N * E));
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return keys[n * E + a] < keys[n * E + b]; });
    for (int64_t rank = 0; rank < E; ++rank) {
      z[n * E + order[rank]] = shift[n] + step[n] * static_cast<float>(rank);
    }
  }
  return z;
}

// The softmax's float32 roundings on either side, per unit of a probability: the row sum's worst case (E - 1
// sequential additions; E / 32 per lane and a 5-level butterfly), exp's few ulps and the division.
int64_t softmax_roundings(int64_t E) {
  return E + E / 32 + 10;
}

std::vector<OpCase> top_k_softmax_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, E, k] : router_shapes()) {
    OpCase c{"top_k_softmax", shape_label({{"N", N}, {"E", E}, {"k", k}}), {}, {}, {}};
    c.operands = {output("probs", N * E), output("experts", N * k), output("weights", N * k),
                  input("logits", router_logits(N, E, seed_of(c.op, c.shape)))};
    c.run = [N, E, k](Backend& b, const std::vector<void*>& p) {
      b.top_k_softmax(TensorView(floats_at(p, 0), {N, E}), static_cast<int32_t*>(p[1]), floats_at(p, 2),
                      ConstTensorView(floats_at(p, 3), {N, E}), k);
      return none();
    };
    c.checks = {
        nan_free(close("probs", softmax_roundings(E), {},
                       "exp, a sum of E positive terms and a division, relative")),
        exact_ints("experts", "the largest of probabilities at least 0.1% apart, far beyond their roundings"),
        nan_free(close(
            "weights", 2 * softmax_roundings(E) + 2 * k + 2, {},
            "a probability over the sum of k of them: both probabilities' errors, k additions, a division"))};
    cases.push_back(std::move(c));
  }
  return cases;
}

// The forward's outputs on the reference, the backward's inputs.
struct RouterForward {
  std::vector<float> probs, weights;
  std::vector<int32_t> experts;
};
RouterForward router_forward(int64_t N, int64_t E, int64_t k, uint64_t seed) {
  RouterForward f{std::vector<float>(static_cast<size_t>(N * E)),
                  std::vector<float>(static_cast<size_t>(N * k)),
                  std::vector<int32_t>(static_cast<size_t>(N * k))};
  const std::vector<float> logits = router_logits(N, E, seed);
  make_reference_backend()->top_k_softmax(TensorView(f.probs.data(), {N, E}), f.experts.data(),
                                          f.weights.data(), ConstTensorView(logits.data(), {N, E}), k);
  return f;
}

std::vector<OpCase> top_k_softmax_backward_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, E, k] : router_shapes()) {
    for (const bool with_dprobs : {true, false}) {
      OpCase c{with_dprobs ? "top_k_softmax_backward" : "top_k_softmax_backward without dprobs",
               shape_label({{"N", N}, {"E", E}, {"k", k}}),
               {},
               {},
               {}};
      const uint64_t seed = seed_of(c.op, c.shape);
      const RouterForward f = router_forward(N, E, k, seed);
      const std::vector<float> dweights = random_normal(N * k, seed + 3);
      const std::vector<float> dprobs =
          with_dprobs ? random_normal(E, seed + 4) : std::vector<float>(E, 0.0f);
      // The probabilities' gradient dp comes out the same on both sides (the same roundings in the same
      // order); the sum of p dp is taken in another order, and p (dp - that sum) rounds twice.
      std::vector<float> magnitude(static_cast<size_t>(N * E));
      for (int64_t n = 0; n < N; ++n) {
        std::vector<double> dp(dprobs.begin(), dprobs.end());
        double total = 0.0, weighted = 0.0;
        for (int64_t j = 0; j < k; ++j) {
          total += f.probs[n * E + f.experts[n * k + j]];
          weighted += static_cast<double>(dweights[n * k + j]) * f.weights[n * k + j];
        }
        for (int64_t j = 0; j < k; ++j) dp[f.experts[n * k + j]] += (dweights[n * k + j] - weighted) / total;
        double inner = 0.0;
        for (int64_t e = 0; e < E; ++e) inner += std::fabs(f.probs[n * E + e] * dp[e]);
        for (int64_t e = 0; e < E; ++e) {
          magnitude[n * E + e] = static_cast<float>(f.probs[n * E + e] * (std::fabs(dp[e]) + inner));
        }
      }
      c.operands = {output("dlogits", N * E),         input("probs", f.probs),
                    input_ints("experts", f.experts), input("weights", f.weights),
                    input("dweights", dweights),      input("dprobs", dprobs)};
      c.run = [N, E, k, with_dprobs](Backend& b, const std::vector<void*>& p) {
        b.top_k_softmax_backward(TensorView(floats_at(p, 0), {N, E}),
                                 ConstTensorView(floats_at(p, 1), {N, E}), ints_at(p, 2), floats_at(p, 3),
                                 floats_at(p, 4), k, with_dprobs ? floats_at(p, 5) : nullptr);
        return none();
      };
      c.checks = {nan_free(
          close("dlogits", softmax_roundings(E), magnitude,
                "a sum of E products p dp in another order, then p (dp - sum): of p (|dp| + sum |p dp|)"))};
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// --- the grouping by expert ---

// How the assignments spread over the experts: uniformly (repeats within a token included), skewed towards
// the low experts (the high ones often empty), or all on one expert.
enum class Spread { uniform, skewed, one_expert };

struct GroupShape {
  int64_t N, E, k, align;
  Spread spread;
};

std::vector<GroupShape> group_shapes() {
  std::vector<GroupShape> shapes;
  for (const int64_t E : {2, 8, 60}) {
    std::vector<int64_t> ks = {1, 2, E};
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    for (const int64_t k : ks) {
      for (const int64_t align : {1, 16}) {
        for (const int64_t N : {1, 37, 1031}) shapes.push_back({N, E, k, align, Spread::uniform});
      }
    }
  }
  // Tens of thousands of assignments (many steps of every warp), skewed and on one expert.
  shapes.push_back({32771, 8, 2, 16, Spread::uniform});
  shapes.push_back({32771, 60, 2, 1, Spread::skewed});
  shapes.push_back({1031, 60, 2, 16, Spread::skewed});
  shapes.push_back({20011, 2, 2, 16, Spread::one_expert});
  shapes.push_back({4099, 8, 1, 1, Spread::one_expert});
  return shapes;
}

const char* spread_name(Spread s) {
  switch (s) {
    case Spread::uniform:
      return "uniform";
    case Spread::skewed:
      return "skewed";
    case Spread::one_expert:
      return "one expert";
  }
  return "?";
}

std::vector<int32_t> assignments(int64_t N, int64_t k, int64_t E, Spread spread, uint64_t seed) {
  const size_t n = static_cast<size_t>(N * k);
  if (spread == Spread::uniform) return random_indices(n, seed, E);
  std::vector<int32_t> experts(n, static_cast<int32_t>(E / 2));
  if (spread == Spread::skewed) {
    const std::vector<float> u = random_uniform(n, seed, 0.0f, 1.0f);
    for (size_t a = 0; a < n; ++a) {
      experts[a] = static_cast<int32_t>(
          std::min<int64_t>(E - 1, static_cast<int64_t>(static_cast<float>(E) * u[a] * u[a] * u[a])));
    }
  }
  return experts;
}

std::vector<OpCase> group_by_expert_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, E, k, align, spread] : group_shapes()) {
    OpCase c{std::string("group_by_expert ") + spread_name(spread),
             shape_label({{"N", N}, {"E", E}, {"k", k}, {"align", align}}),
             {},
             {},
             {}};
    c.operands = {output("offsets", E + 1), output("slots", grouped_rows(N, k, E, align)),
                  output("positions", N * k),
                  input_ints("experts", assignments(N, k, E, spread, seed_of(c.op, c.shape)))};
    c.run = [N, E, k, align](Backend& b, const std::vector<void*>& p) {
      b.group_by_expert(static_cast<int32_t*>(p[0]), static_cast<int32_t*>(p[1]), static_cast<int32_t*>(p[2]),
                        ints_at(p, 3), N, k, E, align);
      return none();
    };
    const std::string why = "a stable counting sort: integers, exact on both";
    c.checks = {exact_ints("offsets", why), exact_ints("slots", why), exact_ints("positions", why)};
    cases.push_back(std::move(c));
  }
  return cases;
}

// --- the row moves ---

struct RowShape {
  int64_t N, E, k, align, C;
};
// Rows of one value, odd widths and multiples of 4 (the 16-byte paths), over the grouping's shapes.
const std::vector<RowShape> kRowShapes = {{1, 2, 1, 1, 1},    {7, 8, 2, 16, 37},   {37, 8, 2, 1, 64},
                                          {13, 8, 8, 16, 5},  {257, 2, 1, 16, 12}, {1031, 60, 2, 16, 132},
                                          {101, 60, 60, 1, 3}};

// A grouping on the reference: the slots (index of the gather into the experts' rows) and the positions (of
// the combine back to the tokens) that a layer passes to the row moves.
struct Grouping {
  std::vector<int32_t> slots, positions;
};
Grouping grouping(const RowShape& s, uint64_t seed) {
  const std::vector<int32_t> experts = random_indices(static_cast<size_t>(s.N * s.k), seed, s.E);
  Grouping g{std::vector<int32_t>(static_cast<size_t>(grouped_rows(s.N, s.k, s.E, s.align))),
             std::vector<int32_t>(static_cast<size_t>(s.N * s.k))};
  std::vector<int32_t> offsets(static_cast<size_t>(s.E + 1));
  make_reference_backend()->group_by_expert(offsets.data(), g.slots.data(), g.positions.data(),
                                            experts.data(), s.N, s.k, s.E, s.align);
  return g;
}

std::string row_label(const RowShape& s) {
  return shape_label({{"N", s.N}, {"E", s.E}, {"k", s.k}, {"align", s.align}, {"C", s.C}});
}

// Into the experts' rows (by slots: divisor k, the padding rows zero, with and without a scale) and back
// out by assignment (by positions: divisor 1).
std::vector<OpCase> gather_rows_cases() {
  std::vector<OpCase> cases;
  for (const RowShape& s : kRowShapes) {
    for (const bool by_slots : {true, false}) {
      for (const bool scaled : {true, false}) {
        if (!by_slots && scaled) continue;
        OpCase c{by_slots ? (scaled ? "gather_rows by slots, scaled" : "gather_rows by slots")
                          : "gather_rows by positions",
                 row_label(s),
                 {},
                 {},
                 {}};
        const uint64_t seed = seed_of(c.op, c.shape);
        const Grouping g = grouping(s, seed);
        const std::vector<int32_t>& index = by_slots ? g.slots : g.positions;
        const int64_t M = static_cast<int64_t>(index.size());
        const int64_t R = by_slots ? s.N : static_cast<int64_t>(g.slots.size());  // tokens, or experts' rows
        const int64_t divisor = by_slots ? s.k : 1;
        c.operands = {output("out", M * s.C), input("src", random_normal(R * s.C, seed + 1)),
                      input_ints("index", index), input("scale", random_normal(s.N * s.k, seed + 2))};
        c.run = [M, R, divisor, scaled, C = s.C](Backend& b, const std::vector<void*>& p) {
          b.gather_rows(TensorView(floats_at(p, 0), {M, C}), ConstTensorView(floats_at(p, 1), {R, C}),
                        ints_at(p, 2), divisor, scaled ? floats_at(p, 3) : nullptr, {},
                        octet::TensorRole::activation);
          return none();
        };
        c.checks = {nan_free(
            exact("out", "a copy, or one product by the scale, rounded as the reference rounds it"))};
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

// With a base and weights, without either, and in place over the base.
enum class Base { separate, none, in_place };

std::vector<OpCase> combine_rows_cases() {
  std::vector<OpCase> cases;
  for (const RowShape& s : kRowShapes) {
    for (const Base base : {Base::separate, Base::none, Base::in_place}) {
      const char* op = base == Base::separate ? "combine_rows"
                       : base == Base::none   ? "combine_rows without base or weights"
                                              : "combine_rows in place";
      OpCase c{op, row_label(s), {}, {}, {}};
      const uint64_t seed = seed_of(c.op, c.shape);
      const Grouping g = grouping(s, seed);
      const int64_t M = static_cast<int64_t>(g.slots.size()), N = s.N, C = s.C, k = s.k;
      const std::vector<float> base_values = random_normal(N * C, seed + 1);
      c.operands = {base == Base::in_place ? in_out("out", base_values) : output("out", N * C),
                    input("base", base_values), input("src", random_normal(M * C, seed + 2)),
                    input_ints("positions", g.positions), input("weights", random_normal(N * k, seed + 3))};
      c.run = [N, M, C, k, base](Backend& b, const std::vector<void*>& p) {
        const float* base_rows = base == Base::separate   ? floats_at(p, 1)
                                 : base == Base::in_place ? floats_at(p, 0)
                                                          : nullptr;
        b.combine_rows(TensorView(floats_at(p, 0), {N, C}), base_rows,
                       ConstTensorView(floats_at(p, 2), {M, C}), ints_at(p, 3), k,
                       base == Base::none ? nullptr : floats_at(p, 4));
        return none();
      };
      c.checks = {nan_free(
          exact("out", "the reference's products and sums in j order, each rounded as it rounds them"))};
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// Rows copied to their places in a larger table (a sum of gathered rows written back): every other row of
// the table keeps its bits. The rows are distinct and in a shuffled order; the table's row counts are odd and
// prime as well as multiples of 4, its widths too.
std::vector<OpCase> scatter_rows_cases() {
  std::vector<OpCase> cases;
  struct ScatterShape {
    int64_t R, M, C;
  };
  for (const auto& [R, M, C] : std::vector<ScatterShape>{
           {1, 1, 1}, {7, 3, 5}, {64, 61, 64}, {257, 100, 12}, {1031, 13, 132}, {4099, 4099, 3}}) {
    OpCase c{"scatter_rows", shape_label({{"R", R}, {"M", M}, {"C", C}}), {}, {}, {}};
    const uint64_t seed = seed_of(c.op, c.shape);
    std::vector<int32_t> rows(static_cast<size_t>(R));
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), std::mt19937_64(seed));
    rows.resize(static_cast<size_t>(M));
    c.operands = {in_out("out", random_normal(R * C, seed + 1)), input("src", random_normal(M * C, seed + 2)),
                  input_ints("index", rows)};
    c.run = [R, M, C](Backend& b, const std::vector<void*>& p) {
      b.scatter_rows(TensorView(floats_at(p, 0), {R, C}), ConstTensorView(floats_at(p, 1), {M, C}),
                     ints_at(p, 2));
      return none();
    };
    c.checks = {nan_free(exact("out", "a copy of rows: the reference's bits"))};
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<OpCase> row_dots_cases() {
  std::vector<OpCase> cases;
  for (const RowShape& s : kRowShapes) {
    OpCase c{"row_dots", row_label(s), {}, {}, {}};
    const uint64_t seed = seed_of(c.op, c.shape);
    const Grouping g = grouping(s, seed);
    const int64_t M = static_cast<int64_t>(g.slots.size()), N = s.N, C = s.C, k = s.k;
    const std::vector<float> a = random_normal(N * C, seed + 1), src = random_normal(M * C, seed + 2);
    std::vector<float> magnitude(static_cast<size_t>(N * k));
    for (int64_t o = 0; o < N * k; ++o) {
      double sum = 0.0;
      for (int64_t i = 0; i < C; ++i)
        sum += std::fabs(static_cast<double>(a[(o / k) * C + i]) * src[g.positions[o] * C + i]);
      magnitude[o] = static_cast<float>(sum);
    }
    c.operands = {output("out", N * k), input("a", a), input("src", src),
                  input_ints("positions", g.positions)};
    c.run = [N, M, C, k](Backend& b, const std::vector<void*>& p) {
      b.row_dots(floats_at(p, 0), ConstTensorView(floats_at(p, 1), {N, C}),
                 ConstTensorView(floats_at(p, 2), {M, C}), ints_at(p, 3), k);
      return none();
    };
    c.checks = {nan_free(
        close("out", C + C / 32 + 8, magnitude,
              "both sums' worst cases: C sequential roundings, and C / 32 per lane and 5 butterfly levels"))};
    cases.push_back(std::move(c));
  }
  return cases;
}

// Over the router's widths (E) and odd and wider ones; past 1024 rows the GPU splits the rows among blocks.
const std::vector<std::pair<int64_t, int64_t>> kColumnSumShapes = {
    {1, 1}, {37, 7}, {1031, 60}, {4099, 8}, {257, 132}, {40009, 5}, {3, 2}};

std::vector<OpCase> column_sums_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, C] : kColumnSumShapes) {
    OpCase c{"column_sums", shape_label({{"N", N}, {"C", C}}), {}, {}, {}};
    const std::vector<float> x = random_normal(N * C, seed_of(c.op, c.shape));
    std::vector<float> magnitude(static_cast<size_t>(C), 0.0f);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < C; ++i) magnitude[i] += std::fabs(x[n * C + i]);
    }
    c.operands = {output("out", C), input("x", x)};
    c.run = [N, C](Backend& b, const std::vector<void*>& p) {
      b.column_sums(floats_at(p, 0), ConstTensorView(floats_at(p, 1), {N, C}));
      return none();
    };
    c.checks = {nan_free(close("out", N + 1, magnitude,
                               "a float32 sum of N terms in any order, against float64 rounded once"))};
    cases.push_back(std::move(c));
  }
  return cases;
}

TEST(BackendOpsRouting, TopKSoftmax) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(top_k_softmax_cases());
}

TEST(BackendOpsRouting, TopKSoftmaxBackward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(top_k_softmax_backward_cases());
}

TEST(BackendOpsRouting, GroupByExpert) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(group_by_expert_cases());
}

TEST(BackendOpsRouting, GatherRows) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(gather_rows_cases());
}

TEST(BackendOpsRouting, CombineRows) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(combine_rows_cases());
}

TEST(BackendOpsRouting, ScatterRows) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(scatter_rows_cases());
}

TEST(BackendOpsRouting, RowDots) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(row_dots_cases());
}

TEST(BackendOpsRouting, ColumnSums) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(column_sums_cases());
}

// ---------------------------------------------------------------------------------------------------------
// The CUDA backend where the reference refuses an index out of range, which the kernels cannot refuse (it is
// in device memory): group_by_expert leaves the assignment out of every group (position -1) and groups the
// others as if it were not there; gather_rows gathers a row of NaN. Neither writes out of bounds.

std::vector<int32_t> ints_of(const std::vector<uint8_t>& bytes) {
  std::vector<int32_t> values(bytes.size() / sizeof(int32_t));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(int32_t));
  return values;
}

TEST(BackendOpsRouting, OutOfRangeIndicesOnTheCudaBackend) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  const int64_t N = 5, k = 2, E = 4, align = 4;
  const std::vector<int32_t> experts = {1, 0, 2, 7, 1, 3, -1, 0, 2, 2};  // assignments 3 and 6: no expert
  const int64_t rows = grouped_rows(N, k, E, align);
  GuardedBuffer chosen(*backend, as_bytes(experts)), offsets(*backend, as_bytes(nan_filled(E + 1))),
      slots(*backend, as_bytes(nan_filled(static_cast<size_t>(rows)))),
      positions(*backend, as_bytes(nan_filled(static_cast<size_t>(N * k))));
  backend->group_by_expert(static_cast<int32_t*>(offsets.data()), static_cast<int32_t*>(slots.data()),
                           static_cast<int32_t*>(positions.data()), static_cast<int32_t*>(chosen.data()), N,
                           k, E, align);
  bool guards_ok[3] = {false, false, false};
  // Experts 0 .. 3 hold 2, 2, 3 and 1 of the valid assignments, each in 4 rows.
  EXPECT_EQ(ints_of(offsets.download(&guards_ok[0])), (std::vector<int32_t>{0, 4, 8, 12, 16}));
  std::vector<int32_t> expected_slots = {1, 7, -1, -1, 0, 4, -1, -1, 2, 8, 9, -1, 5, -1, -1, -1};
  expected_slots.resize(static_cast<size_t>(rows), -1);
  EXPECT_EQ(ints_of(slots.download(&guards_ok[1])), expected_slots);
  EXPECT_EQ(ints_of(positions.download(&guards_ok[2])),
            (std::vector<int32_t>{4, 0, 8, -1, 5, 12, -1, 1, 9, 10}));
  for (const bool ok : guards_ok) EXPECT_TRUE(ok) << "a write out of bounds";

  // src [2, 3]; index 5 with divisor 2 reads row 2 of 2.
  const std::vector<float> src = {1.0f, -2.0f, 3.0f, 4.0f, 5.0f, -6.0f};
  const std::vector<int32_t> index = {0, -1, 5, 3};
  GuardedBuffer source(*backend, as_bytes(src)), rows_index(*backend, as_bytes(index)),
      out(*backend, as_bytes(std::vector<float>(12, 7.0f)));
  backend->gather_rows(TensorView(out.floats(), {4, 3}), ConstTensorView(source.floats(), {2, 3}),
                       static_cast<int32_t*>(rows_index.data()), 2, nullptr, {},
                       octet::TensorRole::activation);
  bool out_ok = false;
  const std::vector<float> gathered = as_floats(out.download(&out_ok));
  EXPECT_TRUE(out_ok) << "a write out of bounds";
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(gathered[c], src[c]) << c;
    EXPECT_EQ(gathered[3 + c], 0.0f) << c;
    EXPECT_TRUE(std::isnan(gathered[6 + c])) << c;
    EXPECT_EQ(gathered[9 + c], src[3 + c]) << c;
  }
}

}  // namespace
