// Grouped-query attention (AttentionHeads with fewer kv heads than query heads) on every attention path of
// the CUDA backend against the CPU reference: octet's float32 kernels (the default), octet's BF16
// tensor-core kernels (bf16_attention, attention = octet) and cuDNN's fused attention (attention = cudnn,
// where libcudnn.so.9 loads), each with the storage types the backend asks for (storage_type with kv_heads).
// The CPU runs on the same inputs: q, k, v and dO rounded to bf16 where the path stores or multiplies them
// so, and the backward on both sides from the GPU's own out and lse. The bf16 paths round their
// probabilities (and dS) to bf16 before the second products, which the reference does not: as
// test_attention_tensor_cores.cpp does, each output is bounded by a fraction of its own root mean square,
// far below what a wrong kv head, group sum or mask gives (order 1). The float32 path keeps float32
// roundings only. Shapes: (heads, kv_heads, hs) in (4, 1, 64), (8, 2, 64), (32, 8, 64), (16, 4, 128), with T
// not a multiple of any kernel's tile. octet's kernels must also repeat the backward bit for bit. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "cudnn_attention.h"
#include "octet/backend/cpu_backend.h"
#include "octet/backend/cuda_backend.h"
#include "octet/check.h"
#include "octet/numerics/minifloat.h"
#include "random.h"

namespace {

using octet::AttentionHeads;
using octet::Backend;
using octet::ConstTensorView;
using octet::CudaBackendOptions;
using octet::Dtype;
using octet::StorageQuery;
using octet::StorageRole;
using octet::TensorView;

struct GqaShape {
  int64_t B, T, heads, kv_heads, hs;
};
const std::vector<GqaShape> kShapes = {
    {2, 37, 4, 1, 64}, {1, 130, 8, 2, 64}, {1, 67, 32, 8, 64}, {1, 131, 16, 4, 128}};

struct Path {
  std::string name;
  CudaBackendOptions options;
  double out_bound, dqkv_bound, lse_bound;  // of the rms, of the rms, absolute
  bool deterministic;
};

std::vector<Path> paths() {
  CudaBackendOptions float32;
  CudaBackendOptions octet_mma;
  octet_mma.bf16_attention = true;
  octet_mma.attention = CudaBackendOptions::AttentionKernels::octet;
  CudaBackendOptions cudnn;
  cudnn.bf16_attention = true;
  cudnn.attention = CudaBackendOptions::AttentionKernels::cudnn;
  // float32: sums of T + hs float32 roundings against float32 ones; bf16: the bounds of
  // test_attention_tensor_cores.cpp for octet's kernels and cuDNN.
  return {{"octet float32", float32, 1e-4, 1e-3, 1e-4, true},
          {"octet tensor cores", octet_mma, 0.03, 0.05, 0.01, true},
          {"cudnn", cudnn, 0.05, 0.08, 0.01, false}};
}

float bf16_value(float x) {
  return octet::round_to_bf16(x);
}
uint16_t bf16_bits(float x) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(octet::round_to_bf16(x)) >> 16);
}

// A tensor on a backend stored as `type`, from float32 values (rounded to bf16 there).
struct Stored {
  Backend& backend;
  Dtype type;
  size_t n;
  std::unique_ptr<octet::Buffer> buffer;
  Stored(Backend& b, Dtype t, const std::vector<float>& values)
      : backend(b),
        type(t),
        n(values.size()),
        buffer(b.allocate(values.size() * (t == Dtype::bf16 ? 2 : 4))) {
    if (type == Dtype::bf16) {
      std::vector<uint16_t> bits(n);
      for (size_t i = 0; i < n; ++i) bits[i] = bf16_bits(values[i]);
      b.copy_from_host(buffer->data(), bits.data(), n * 2);
    } else {
      b.copy_from_host(buffer->data(), values.data(), n * 4);
    }
  }
  std::vector<float> read() const {
    std::vector<float> values(n);
    if (type == Dtype::bf16) {
      std::vector<uint16_t> bits(n);
      backend.copy_to_host(bits.data(), buffer->data(), n * 2);
      for (size_t i = 0; i < n; ++i) values[i] = std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16);
    } else {
      backend.copy_to_host(values.data(), buffer->data(), n * 4);
    }
    return values;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b(n * (type == Dtype::bf16 ? 2 : 4));
    backend.copy_to_host(b.data(), buffer->data(), b.size());
    return b;
  }
  TensorView view(const octet::Shape& shape) const { return TensorView(buffer->data(), type, shape); }
};

// Largest |actual - expected| over the root mean square of expected; every actual value must be finite.
double relative_error(const std::vector<float>& actual, const std::vector<float>& expected,
                      const char* what) {
  EXPECT_EQ(actual.size(), expected.size()) << what;
  double squares = 0.0, worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(std::isfinite(actual[i])) << what << " element " << i << " is " << actual[i];
    if (!std::isfinite(actual[i])) return INFINITY;
    squares += static_cast<double>(expected[i]) * expected[i];
    worst = std::max(worst, std::abs(static_cast<double>(actual[i]) - expected[i]));
  }
  const double rms = std::sqrt(squares / static_cast<double>(std::max<size_t>(expected.size(), 1)));
  return worst / std::max(rms, 1e-30);
}

void check_path(const Path& path, Backend& gpu, Backend& cpu, const GqaShape& s) {
  const int64_t C = s.heads * s.hs, kv_C = s.kv_heads * s.hs, W = C + 2 * kv_C;
  const AttentionHeads heads(s.heads, s.kv_heads);
  SCOPED_TRACE(path.name + " " +
               octet::testing::backend_ops::shape_label(
                   {{"B", s.B}, {"T", s.T}, {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"hs", s.hs}}));
  StorageQuery query;
  query.channels = C;
  query.heads = s.heads;
  query.kv_heads = s.kv_heads;
  query.role = StorageRole::attention_input;
  const Dtype qkv_type = gpu.storage_type(query);
  query.role = StorageRole::attention_output;
  const Dtype out_type = gpu.storage_type(query);
  EXPECT_EQ(qkv_type, path.options.bf16_attention ? Dtype::bf16 : Dtype::f32);
  const bool rounds = path.options.bf16_attention;  // the products take bf16 q, k, v and dO

  const size_t n_qkv = static_cast<size_t>(s.B * s.T * W), n_out = static_cast<size_t>(s.B * s.T * C);
  const size_t n_lse = static_cast<size_t>(s.B * s.heads * s.T);
  const uint64_t seed =
      octet::testing::backend_ops::seed_of("gqa", std::to_string(s.heads) + "/" + std::to_string(s.kv_heads));
  std::vector<float> qkv = octet::testing::random_normal(n_qkv, seed, 1.5f);
  std::vector<float> dout = octet::testing::random_normal(n_out, seed + 1);
  if (rounds) {
    for (float& x : qkv) x = bf16_value(x);
    for (float& x : dout) x = bf16_value(x);
  }
  const octet::Shape qkv_shape{s.B, s.T, W}, out_shape{s.B, s.T, C};

  // The GPU's forward, then the CPU's on the same q, k, v.
  Stored g_qkv(gpu, qkv_type, qkv), g_out(gpu, out_type, std::vector<float>(n_out, NAN)),
      g_lse(gpu, Dtype::f32, std::vector<float>(n_lse, NAN));
  gpu.attention_forward(g_out.view(out_shape), g_lse.buffer->floats(), g_qkv.view(qkv_shape), heads);
  const std::vector<float> out = g_out.read(), lse = g_lse.read();
  Stored c_qkv(cpu, Dtype::f32, qkv), c_out(cpu, Dtype::f32, std::vector<float>(n_out)),
      c_lse(cpu, Dtype::f32, std::vector<float>(n_lse));
  cpu.attention_forward(c_out.view(out_shape), c_lse.buffer->floats(), c_qkv.view(qkv_shape), heads);
  const std::vector<float> out_ref = c_out.read(), lse_ref = c_lse.read();
  double lse_error = 0.0;
  for (size_t i = 0; i < n_lse; ++i) {
    ASSERT_TRUE(std::isfinite(lse[i])) << "lse " << i;
    lse_error = std::max(lse_error, std::abs(static_cast<double>(lse[i]) - lse_ref[i]));
  }
  const double out_error = relative_error(out, out_ref, "out");

  // The backward on both, from the GPU's out and lse.
  Stored g_dout(gpu, out_type, dout), g_dqkv(gpu, out_type, std::vector<float>(n_qkv, NAN));
  gpu.attention_backward(g_dqkv.view(qkv_shape), g_dout.view(out_shape), g_qkv.view(qkv_shape),
                         g_out.view(out_shape), g_lse.buffer->floats(), heads);
  const std::vector<float> dqkv = g_dqkv.read();
  // The CPU reads dout as the GPU stored it (its values, as the GPU's kernels read them).
  Stored c_dout(cpu, Dtype::f32, g_dout.read()), c_gpu_out(cpu, Dtype::f32, out),
      c_gpu_lse(cpu, Dtype::f32, lse), c_dqkv(cpu, Dtype::f32, std::vector<float>(n_qkv));
  cpu.attention_backward(c_dqkv.view(qkv_shape), c_dout.view(out_shape), c_qkv.view(qkv_shape),
                         c_gpu_out.view(out_shape), c_gpu_lse.buffer->floats(), heads);
  const std::vector<float> dqkv_ref = c_dqkv.read();
  const double dqkv_error = relative_error(dqkv, dqkv_ref, "dqkv");
  // The k and v gradients alone (the group sums), which a wrong kv head or a missing query head shows in.
  std::vector<float> dkv, dkv_ref;
  for (int64_t row = 0; row < s.B * s.T; ++row) {
    for (int64_t i = C; i < W; ++i) {
      dkv.push_back(dqkv[static_cast<size_t>(row * W + i)]);
      dkv_ref.push_back(dqkv_ref[static_cast<size_t>(row * W + i)]);
    }
  }
  const double dkv_error = relative_error(dkv, dkv_ref, "dk, dv");
  std::printf(
      "[gqa %s heads=%lld kv_heads=%lld hs=%lld T=%lld] out %.3g, dqkv %.3g, dk dv %.3g (of their rms); "
      "lse %.3g\n",
      path.name.c_str(), static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads),
      static_cast<long long>(s.hs), static_cast<long long>(s.T), out_error, dqkv_error, dkv_error, lse_error);
  EXPECT_LE(out_error, path.out_bound);
  EXPECT_LE(dqkv_error, path.dqkv_bound);
  EXPECT_LE(dkv_error, path.dqkv_bound);
  EXPECT_LE(lse_error, path.lse_bound);
  EXPECT_TRUE(octet::testing::has_nonzero(dkv));

  if (path.deterministic) {
    Stored again(gpu, out_type, std::vector<float>(n_qkv, NAN));
    gpu.attention_backward(again.view(qkv_shape), g_dout.view(out_shape), g_qkv.view(qkv_shape),
                           g_out.view(out_shape), g_lse.buffer->floats(), heads);
    EXPECT_TRUE(again.bytes() == g_dqkv.bytes()) << "the backward repeats bit for bit";
  }
}

TEST(BackendOpsGqaAttention, EveryPathMatchesTheReference) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto cpu = octet::make_cpu_backend();
  for (const Path& path : paths()) {
    std::unique_ptr<Backend> gpu;
    try {
      gpu = octet::make_cuda_backend(path.options);
    } catch (const octet::Error& e) {
      std::printf("[gqa %s] skipped: %s\n", path.name.c_str(), e.what());
      continue;
    }
    for (const GqaShape& s : kShapes) {
      if (path.options.attention == CudaBackendOptions::AttentionKernels::cudnn) {
        // The backend would run a shape cuDNN refuses on octet's kernels (with a warning): make sure it
        // takes every one.
        std::string why_not;
        const auto cudnn = octet::cuda::CudnnAttention::load(&why_not);
        ASSERT_NE(cudnn, nullptr) << why_not;
        EXPECT_TRUE(cudnn->supports(s.B, s.T, s.heads * s.hs, s.heads, s.kv_heads, &why_not)) << why_not;
      }
      check_path(path, *gpu, *cpu, s);
    }
  }
}

}  // namespace
