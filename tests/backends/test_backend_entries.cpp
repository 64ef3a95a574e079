// The CPU backend's tensor entries: what they refuse (a dtype the CPU does not store, shapes that do not fit
// together, a fusion asked for without its consumer) with a message naming the op and the argument, and the
// residual epilogue of a linear layer, which must give the layer's output plus the residual exactly.
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
  for (const StorageRole role : {StorageRole::rounded_activation, StorageRole::attention_input,
                                 StorageRole::attention_output, StorageRole::weight_gradient}) {
    EXPECT_EQ(cpu->storage_type({role, 768, 12, &fp8}), Dtype::f32);
  }
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
                       "attention_forward: qkv is [B, T, 3C], given [4, 6]"));
  LinearExecution exec;
  EXPECT_TRUE(contains(error_of([&] {
                         cpu->linear_forward(TensorView(y.data(), {4, 5}), ConstTensorView(x.data(), {4, 6}),
                                             ConstTensorView(w.data(), {1, 6}), nullptr, {}, exec);
                       }),
                       "linear_forward: out has shape [4, 5], expected 4 rows of 1"));
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
