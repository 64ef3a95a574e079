// The CPU reference's mixture-of-experts routing ops, each against an independent computation: the top-k
// softmax against a float64 softmax and a sort, its backward against central differences of a float64
// objective, the grouping against its definition (a stable sort by expert with aligned starts), and the
// gather, combine and dot ops on exactly representable values, where their sums are exact; the scatter of
// rows, bit for bit.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "errors.h"
#include "octet/backend/cpu_backend.h"
#include "random.h"

namespace octet {
namespace {

std::vector<float> uniform(int64_t n, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  return testing::random_uniform(static_cast<size_t>(n), seed, lo, hi);
}

std::vector<double> softmax64(const float* z, int64_t E) {
  double max = z[0];
  for (int64_t e = 1; e < E; ++e) max = std::max(max, static_cast<double>(z[e]));
  std::vector<double> p(static_cast<size_t>(E));
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += p[static_cast<size_t>(e)] = std::exp(z[e] - max);
  for (double& v : p) v /= sum;
  return p;
}

TEST(CpuRouting, TopKSoftmaxChoosesTheLargestAndRenormalizes) {
  const int64_t N = 6, E = 8, k = 3;
  const auto cpu = make_cpu_backend();
  std::vector<float> z = uniform(N * E, 11), p(N * E), w(N * k);
  z[2 * E + 1] = z[2 * E + 5] = 9.0f;  // equal logits: the lower index comes first
  std::vector<int32_t> chosen(N * k);
  cpu->top_k_softmax(TensorView(p.data(), {N, E}), chosen.data(), w.data(), ConstTensorView(z.data(), {N, E}),
                     k);
  for (int64_t n = 0; n < N; ++n) {
    const std::vector<double> ref = softmax64(z.data() + n * E, E);
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ref[a] > ref[b]; });
    double total = 0.0;
    for (int64_t j = 0; j < k; ++j) total += ref[static_cast<size_t>(order[j])];
    for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(p[n * E + e], ref[e], 1e-6) << n << "," << e;
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(chosen[n * k + j], order[j]) << n << "," << j;
      EXPECT_NEAR(w[n * k + j], ref[order[j]] / total, 1e-6) << n << "," << j;
    }
  }
  EXPECT_EQ(chosen[2 * k], 1);
  EXPECT_EQ(chosen[2 * k + 1], 5);
}

TEST(CpuRouting, TopKSoftmaxBackwardMatchesCentralDifferences) {
  // The objective sum(a . weights) + sum(b . probs) over a fixed choice of experts (the choice is piecewise
  // constant, and the logits stay far from a tie under the small steps taken).
  const int64_t N = 4, E = 6, k = 2;
  const auto cpu = make_cpu_backend();
  const std::vector<float> z = uniform(N * E, 21, -3.0f, 3.0f), a = uniform(N * k, 22), b = uniform(E, 23);
  std::vector<float> p(N * E), w(N * k), dz(N * E);
  std::vector<int32_t> chosen(N * k);
  cpu->top_k_softmax(TensorView(p.data(), {N, E}), chosen.data(), w.data(), ConstTensorView(z.data(), {N, E}),
                     k);
  cpu->top_k_softmax_backward(TensorView(dz.data(), {N, E}), ConstTensorView(p.data(), {N, E}), chosen.data(),
                              w.data(), a.data(), k, b.data());
  auto objective = [&](const std::vector<float>& zs) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      const std::vector<double> q = softmax64(zs.data() + n * E, E);
      double total = 0.0;
      for (int64_t j = 0; j < k; ++j) total += q[static_cast<size_t>(chosen[n * k + j])];
      for (int64_t j = 0; j < k; ++j) sum += a[n * k + j] * q[static_cast<size_t>(chosen[n * k + j])] / total;
      for (int64_t e = 0; e < E; ++e) sum += b[e] * q[static_cast<size_t>(e)];
    }
    return sum;
  };
  const float h = 1e-3f;
  for (int64_t i = 0; i < N * E; ++i) {
    std::vector<float> up = z, down = z;
    up[i] += h;
    down[i] -= h;
    const double numeric = (objective(up) - objective(down)) / (2.0 * h);
    EXPECT_NEAR(dz[i], numeric, 2e-4) << i;
  }
}

TEST(CpuRouting, GroupByExpertIsAStableSortWithAlignedStarts) {
  const int64_t N = 7, k = 2, E = 4, align = 4;
  const std::vector<int32_t> experts = {2, 0, 0, 3, 2, 3, 2, 0, 0, 2, 3, 2, 0, 2};
  const auto cpu = make_cpu_backend();
  std::vector<int32_t> offsets(E + 1), slots(grouped_rows(N, k, E, align)), positions(N * k);
  cpu->group_by_expert(offsets.data(), slots.data(), positions.data(), experts.data(), N, k, E, align);
  // Expert 0: 5 assignments (8 rows), expert 1: none, expert 2: 6 (8 rows), expert 3: 3 (4 rows).
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 8, 8, 16, 20}));
  const std::vector<int32_t> expected_head = {1, 2, 7, 8, 12, -1, -1, -1, 0, 4, 6, 9, 11, 13, -1, -1, 3, 5, 10, -1};
  EXPECT_EQ(std::vector<int32_t>(slots.begin(), slots.begin() + 20), expected_head);
  for (int64_t a = 0; a < N * k; ++a) EXPECT_EQ(slots[positions[a]], a) << a;
  const std::vector<int32_t> bad = {0, 4};  // expert 4 of 4
  EXPECT_THROW(cpu->group_by_expert(offsets.data(), slots.data(), positions.data(), bad.data(), 1, 2, E, 1),
               Error);
}

TEST(CpuRouting, GatherCombineAndDotsAreExactOnSmallIntegers) {
  // Integers and halves: every product and sum below is exact in float32.
  const int64_t R = 3, C = 4, k = 2, M = 8;
  const auto cpu = make_cpu_backend();
  std::vector<float> src(R * C);
  for (int64_t i = 0; i < R * C; ++i) src[i] = static_cast<float>(i - 5);
  const std::vector<float> scale = {0.5f, 2.0f, -1.0f, 1.0f, 3.0f, 0.25f};
  const std::vector<int32_t> index = {4, -1, 0, 5, 1, 2, 3, -1};  // assignments r k + j; -1 padding
  std::vector<float> gathered(M * C, 7.0f);
  cpu->gather_rows(TensorView(gathered.data(), {M, C}), ConstTensorView(src.data(), {R, C}), index.data(), k,
                   scale.data(), {}, TensorRole::activation);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t c = 0; c < C; ++c) {
      const float want = index[m] < 0 ? 0.0f : scale[index[m]] * src[(index[m] / k) * C + c];
      EXPECT_EQ(gathered[m * C + c], want) << m << "," << c;
    }
  }
  // positions: the inverse of index on the assignments.
  std::vector<int32_t> positions(R * k);
  for (int64_t m = 0; m < M; ++m) {
    if (index[m] >= 0) positions[index[m]] = static_cast<int32_t>(m);
  }
  std::vector<float> base(R * C, 1.0f), out(R * C);
  cpu->combine_rows(TensorView(out.data(), {R, C}), base.data(), ConstTensorView(gathered.data(), {M, C}),
                    positions.data(), k, scale.data());
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      float want = 1.0f;
      for (int64_t j = 0; j < k; ++j) want += scale[r * k + j] * gathered[positions[r * k + j] * C + c];
      EXPECT_EQ(out[r * C + c], want) << r << "," << c;
    }
  }
  // In place, without weights: out = out + the rows.
  cpu->combine_rows(TensorView(base.data(), {R, C}), base.data(), ConstTensorView(gathered.data(), {M, C}),
                    positions.data(), k, nullptr);
  EXPECT_EQ(base[0], 1.0f + gathered[positions[0] * C] + gathered[positions[1] * C]);
  std::vector<float> dots(R * k);
  cpu->row_dots(dots.data(), ConstTensorView(src.data(), {R, C}), ConstTensorView(gathered.data(), {M, C}),
                positions.data(), k);
  for (int64_t a = 0; a < R * k; ++a) {
    float want = 0.0f;
    for (int64_t c = 0; c < C; ++c) want += src[(a / k) * C + c] * gathered[positions[a] * C + c];
    EXPECT_EQ(dots[a], want) << a;
  }
  std::vector<float> sums(C);
  cpu->column_sums(sums.data(), ConstTensorView(src.data(), {R, C}));
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(sums[c], src[c] + src[C + c] + src[2 * C + c]) << c;
}

// scatter_rows copies each row to its place, bits included (-0.0 and NaN payloads stay), leaves the other
// rows alone, refuses a row out of range, and undoes gather_rows by the same index.
// The grouped ops without casts write what the plain op writes over the groups' rows (a group of no rows and
// the rows past the last group untouched), and refuse groupings that do not fit their output, saying which.
TEST(CpuRouting, GroupedOpsCoverTheGroupsRowsAndRefuseGroupingsThatDoNotFit) {
  const int64_t R = 4, C = 8, M = 12;
  const auto cpu = make_cpu_backend();
  const std::vector<float> src = uniform(R * C, 31);
  const std::vector<int32_t> index = {3, 0, -1, 2, 1, 1, 0, 3, 2, -1, 0, 1};
  std::vector<float> plain(M * C), grouped(M * C, -7.0f);
  cpu->gather_rows(TensorView(plain.data(), {M, C}), ConstTensorView(src.data(), {R, C}), index.data(), 1, nullptr,
                   {}, TensorRole::activation);
  const std::vector<int64_t> offsets = {0, 4, 4, 10};
  const std::vector<Fp8CastTarget> targets(3);
  cpu->gather_rows_grouped(TensorView(grouped.data(), {M, C}), ConstTensorView(src.data(), {R, C}), index.data(),
                           1, nullptr, {offsets, targets}, TensorRole::activation);
  for (int64_t i = 0; i < M * C; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(grouped[i]), std::bit_cast<uint32_t>(i < 10 * C ? plain[i] : -7.0f)) << i;
  }
  std::vector<float> act(M * C / 2, -7.0f), act_plain(M * C / 2);
  cpu->activation_forward(Activation::swiglu, TensorView(act_plain.data(), {M, C / 2}),
                          ConstTensorView(plain.data(), {M, C}), {});
  cpu->activation_forward_grouped(Activation::swiglu, TensorView(act.data(), {M, C / 2}),
                                  ConstTensorView(plain.data(), {M, C}), {offsets, targets});
  for (int64_t i = 0; i < M * C / 2; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(act[i]), std::bit_cast<uint32_t>(i < 10 * C / 2 ? act_plain[i] : -7.0f)) << i;
  }
  const auto refusal = [&](std::vector<int64_t> bad, size_t groups) {
    const std::vector<Fp8CastTarget> some(groups);
    return testing::error_of([&] {
      cpu->gather_rows_grouped(TensorView(grouped.data(), {M, C}), ConstTensorView(src.data(), {R, C}),
                               index.data(), 1, nullptr, {bad, some}, TensorRole::activation);
    });
  };
  EXPECT_NE(refusal({0, 4, 8}, 3).find("3 row offsets for 3 groups"), std::string::npos);
  EXPECT_NE(refusal({0, 8, 4, 12}, 3).find("group 1 ends before it begins"), std::string::npos);
  EXPECT_NE(refusal({0, 4, 13}, 2).find("rows 0 to 13 of 12"), std::string::npos);
  EXPECT_NE(refusal({2, 4, 8}, 2).find("rows 2 to 8"), std::string::npos);
}

TEST(CpuRouting, ScatterRowsWritesEachRowToItsPlaceOnly) {
  const int64_t R = 7, C = 3, M = 3;
  const auto cpu = make_cpu_backend();
  std::vector<float> src(M * C);
  for (int64_t i = 0; i < M * C; ++i) src[i] = static_cast<float>(i + 1);
  src[1] = -0.0f;
  src[5] = std::bit_cast<float>(0x7FC01234u);
  const std::vector<int32_t> index = {5, 0, 3};
  std::vector<float> out(R * C, 9.0f);
  cpu->scatter_rows(TensorView(out.data(), {R, C}), ConstTensorView(src.data(), {M, C}), index.data());
  for (int64_t r = 0; r < R; ++r) {
    const auto m = std::find(index.begin(), index.end(), r);
    for (int64_t c = 0; c < C; ++c) {
      const float want = m == index.end() ? 9.0f : src[(m - index.begin()) * C + c];
      EXPECT_EQ(std::bit_cast<uint32_t>(out[r * C + c]), std::bit_cast<uint32_t>(want)) << r << "," << c;
    }
  }
  std::vector<float> back(M * C);
  cpu->gather_rows(TensorView(back.data(), {M, C}), ConstTensorView(out.data(), {R, C}), index.data(), 1,
                   nullptr, {}, TensorRole::gradient);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), back.size() * sizeof(float)), 0);
  const std::vector<int32_t> bad = {7};
  EXPECT_THROW(
      cpu->scatter_rows(TensorView(out.data(), {R, C}), ConstTensorView(src.data(), {1, C}), bad.data()),
      Error);
}

}  // namespace
}  // namespace octet
