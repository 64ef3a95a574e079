// The CPU backend's tensor entries: what they refuse (a dtype the CPU does not store, shapes that do not fit
// together, a fusion asked for without its consumer) with a message naming the op and the argument; the
// residual epilogue of a linear layer, which must give the layer's output plus the residual exactly; and the
// embedding without positions, whose rows must be the table's rows exactly.
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "errors.h"
#include "octet/backend/cpu_backend.h"

namespace octet {
namespace {

using testing::error_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CpuTensorEntries, StoreEveryRoleInFloat32) {
  const auto cpu = make_cpu_backend();
  LinearExecution fp8;
  fp8.forward = fp8.input_gradient = fp8.weight_gradient = GemmMode::fp8;
  for (const StorageRole role :
       {StorageRole::rounded_activation, StorageRole::attention_input, StorageRole::attention_output,
        StorageRole::weight_gradient, StorageRole::logits}) {
    EXPECT_EQ(cpu->storage_type({role, 768, 12, &fp8}), Dtype::f32);
  }
  LinearExecution bf16;
  bf16.forward = bf16.input_gradient = bf16.weight_gradient = GemmMode::bf16;
  ASSERT_TRUE(logits_in_bf16(bf16));
  EXPECT_EQ(cpu->storage_type({.role = StorageRole::logits, .layer = &bf16}), Dtype::f32);
}

TEST(CpuTensorEntries, RefuseWhatTheyCannotRun) {
  const auto cpu = make_cpu_backend();
  std::vector<float> x(24, 1.0f), y(24), mean(4), rstd(4), w(6, 1.0f), b(6, 0.0f);
  std::vector<uint16_t> half(24);
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->normalization_forward(Normalization::layernorm,
                                                    TensorView(half.data(), Dtype::bf16, {4, 6}), mean.data(),
                                                    rstd.data(), ConstTensorView(x.data(), {4, 6}), w.data(),
                                                    b.data(), {});
                       }),
                       "normalization_forward: out is stored as bf16, this backend takes f32 there"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->normalization_forward(
                             Normalization::layernorm, TensorView(y.data(), {6, 4}), mean.data(), rstd.data(),
                             ConstTensorView(x.data(), {4, 6}), w.data(), b.data(), {});
                       }),
                       "normalization_forward: out has shape [6, 4], expected 4 rows of 6"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->activation_backward(Activation::gelu, TensorView(y.data(), {4, 6}),
                                                  ConstTensorView(x.data(), {4, 6}),
                                                  ConstTensorView(x.data(), {4, 6}), b.data(), {});
                       }),
                       "sums a bias gradient only with the consumer's cast"));
  std::vector<float> lse(8);
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->attention_forward(TensorView(y.data(), {4, 6}), lse.data(),
                                                ConstTensorView(x.data(), {4, 6}), 2);
                       }),
                       "attention_forward: qkv is [B, T, (heads + 2 kv_heads) hs], given [4, 6]"));
  LinearExecution exec;
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->linear_forward(TensorView(y.data(), {4, 5}), ConstTensorView(x.data(), {4, 6}),
                                             ConstTensorView(w.data(), {1, 6}), nullptr, {}, exec);
                       }),
                       "linear_forward: out has shape [4, 5], expected 4 rows of 1"));
}

TEST(CpuTensorEntries, RefuseLogitsEmbeddingsAndSumsThatDoNotFit) {
  const auto cpu = make_cpu_backend();
  const std::vector<int32_t> targets = {0, 1, 2};
  std::vector<float> losses(3), logits(24);
  std::vector<uint16_t> half(24);
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->softmax_cross_entropy(losses.data(),
                                                    TensorView(half.data(), Dtype::bf16, {3, 8}),
                                                    targets.data(), 5, 1.0f);
                       }),
                       "softmax_cross_entropy: logits is stored as bf16, this backend takes f32 there"));
  EXPECT_TRUE(contains(
      error_of([&] {
        cpu->softmax_cross_entropy(losses.data(), TensorView(logits.data(), {3, 8}), targets.data(), 9, 1.0f);
      }),
      "softmax_cross_entropy: the vocabulary V is 1 .. Vp = 8 (the logits' row), given 9"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->softmax_cross_entropy(losses.data(), TensorView(logits.data(), {24}),
                                                    targets.data(), 5, 1.0f);
                       }),
                       "softmax_cross_entropy: logits are [N, Vp], given [24]"));

  // tokens [2, 3] into out [2, 3, 4] from a table [5, 4] and positions [3, 4].
  const std::vector<int32_t> tokens = {0, 1, 2, 3, 4, 0};
  std::vector<float> out(24), table(20), positions(12);
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->embedding_forward(TensorView(out.data(), {2, 3, 4}), tokens.data(),
                                                ConstTensorView(table.data(), {5, 4}),
                                                ConstTensorView(positions.data(), {4, 3}));
                       }),
                       "embedding_forward: positions has shape [4, 3], expected [3, 4]"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->embedding_forward(TensorView(out.data(), {2, 3, 4}), tokens.data(),
                                                ConstTensorView(table.data(), {4, 5}), ConstTensorView());
                       }),
                       "embedding_forward: table has shape [4, 5], expected [4, 4]"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->embedding_forward(TensorView(out.data(), {6, 4}), tokens.data(),
                                                ConstTensorView(table.data(), {5, 4}), ConstTensorView());
                       }),
                       "embedding_forward: out is [B, T, C], given [6, 4]"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->embedding_backward(TensorView(half.data(), Dtype::bf16, {5, 4}), TensorView(),
                                                 ConstTensorView(out.data(), {2, 3, 4}), tokens.data());
                       }),
                       "embedding_backward: dtable is stored as bf16, this backend takes f32 there"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->embedding_backward(TensorView(table.data(), {5, 4}),
                                                 TensorView(positions.data(), {2, 4}),
                                                 ConstTensorView(out.data(), {2, 3, 4}), tokens.data());
                       }),
                       "embedding_backward: positions has shape [2, 4], expected [3, 4]"));

  EXPECT_TRUE(contains(error_of([&] {
                         cpu->add(TensorView(out.data(), {4, 6}), ConstTensorView(out.data(), {4, 6}),
                                  ConstTensorView(logits.data(), {6, 4}));
                       }),
                       "add: b has shape [6, 4], expected [4, 6]"));
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->add(TensorView(half.data(), Dtype::bf16, {4, 6}),
                                  ConstTensorView(out.data(), {4, 6}),
                                  ConstTensorView(logits.data(), {4, 6}));
                       }),
                       "add: out is stored as bf16, this backend takes f32 there"));
}

// Without positions (a view without data), each output row is its token's row of the table, bit for bit: a
// copy, not a sum with zeros (which would turn -0 into +0); the backward adds into the table only.
TEST(CpuTensorEntries, AnEmbeddingWithoutPositionsIsTheTablesRows) {
  const auto cpu = make_cpu_backend();
  const int64_t B = 2, T = 3, C = 4, V = 5;
  std::vector<float> table;
  for (int64_t i = 0; i < V * C; ++i) table.push_back(static_cast<float>(i) * 0.37f - 3.1f);
  table[6] = -0.0f;  // token 1, channel 2
  table[13] = NAN;   // token 3, channel 1: copied as it is
  const std::vector<int32_t> tokens = {1, 4, 1, 3, 0, 2};
  std::vector<float> out(static_cast<size_t>(B * T * C), 7.0f);
  cpu->embedding_forward(TensorView(out.data(), {B, T, C}), tokens.data(),
                         ConstTensorView(table.data(), {V, C}), ConstTensorView(nullptr, Dtype::f32, {T, C}));
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const float got = out[static_cast<size_t>(n * C + c)];
      const float want = table[static_cast<size_t>(tokens[static_cast<size_t>(n)] * C + c)];
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "row " << n << " channel " << c;
    }
  }
  EXPECT_TRUE(std::signbit(out[2]) && std::signbit(out[2 * C + 2])) << "-0 stays -0 (rows 0 and 2: token 1)";

  // The backward: dtable gains each dout row at its token; token 1 twice, in (b, t) order.
  std::vector<float> dtable(static_cast<size_t>(V * C), 0.5f), dout(static_cast<size_t>(B * T * C));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(i % 7) - 2.0f;
  std::vector<float> want = dtable;
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t c = 0; c < C; ++c)
      want[static_cast<size_t>(tokens[static_cast<size_t>(n)] * C + c)] +=
          dout[static_cast<size_t>(n * C + c)];
  }
  cpu->embedding_backward(TensorView(dtable.data(), {V, C}), TensorView(),
                          ConstTensorView(dout.data(), {B, T, C}), tokens.data());
  EXPECT_EQ(dtable, want);
}

// Small integers: every product and sum is exact in float32, so the residual epilogue and the two ops in
// turn must agree exactly, and differ from the output without the residual.
TEST(CpuTensorEntries, TheResidualEpilogueAddsTheResidualToTheLayersOutput) {
  const auto cpu = make_cpu_backend();
  const int64_t N = 3, C = 4, OC = 2;
  std::vector<float> x, w, bias = {1.0f, -2.0f}, residual;
  for (int64_t i = 0; i < N * C; ++i) x.push_back(static_cast<float>(i % 5 - 2));
  for (int64_t i = 0; i < OC * C; ++i) w.push_back(static_cast<float>(i % 3 - 1));
  for (int64_t i = 0; i < N * OC; ++i) residual.push_back(static_cast<float>(10 * i - 7));
  LinearExecution exec;
  std::vector<float> plain(N * OC), joined(N * OC);
  cpu->linear_forward(TensorView(plain.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                      ConstTensorView(w.data(), {OC, C}), nullptr, {.bias = bias.data()}, exec);
  cpu->linear_forward(TensorView(joined.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                      ConstTensorView(w.data(), {OC, C}), nullptr,
                      {.bias = bias.data(), .residual = residual.data()}, exec);
  bool any_nonzero = false;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(joined[i], plain[i] + residual[i]) << i;
    any_nonzero = any_nonzero || plain[i] != 0.0f;
  }
  EXPECT_TRUE(any_nonzero);
  // Row 0: x = [-2, -1, 0, 1], w row 0 = [-1, 0, 1, -1]: 2 + 0 + 0 - 1 = 1, plus bias 1.
  EXPECT_EQ(plain[0], 2.0f);
}

}  // namespace
}  // namespace octet
