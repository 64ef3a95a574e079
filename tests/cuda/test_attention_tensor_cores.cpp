// The tensor-core attention kernels (AttentionOptions::bf16) against an independent host reference in double
// precision that rounds the operands as the kernels do (q, k, v and dO to bf16) and nothing else. What is
// left between the two is the kernels' float32 accumulation and their bf16 rounding of the probabilities and
// of dS before the second products: a few bf16 units of the tensor's typical size, so each output is bounded
// by a fraction of its own root mean square. Every output starts as NaN, so an element a kernel forgets fails
// the finiteness check; the head sizes cover every kernel instantiation's family (16 to 128) and T runs over
// partial, single, exact and several tiles. The backward must also be bit-identical when repeated. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention.h"
#include "cudnn_attention.h"
#include "octet/backend/cuda_backend.h"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"
#include "random.h"

namespace {

using octet::round_to_bf16;
using octet::cuda::AttentionOptions;
using octet::cuda::AttentionWorkspace;
using octet::cuda::DeviceBuffer;

struct Shape {
  int64_t B, T, NH, hs;
  float stddev;   // of q, k, v: larger values make the softmax peakier
  int64_t shift;  // floats between each buffer's start and the tensor: 1 takes the unaligned loads and stores
};

const std::vector<Shape> kShapes = {
    {1, 1, 1, 16, 1.0f, 0},    {2, 63, 2, 64, 1.0f, 0},  {1, 64, 3, 64, 2.0f, 0},  {2, 65, 2, 32, 1.0f, 0},
    {1, 200, 2, 128, 1.0f, 0}, {2, 130, 3, 48, 1.0f, 0}, {1, 256, 1, 80, 1.0f, 0}, {1, 129, 2, 96, 1.0f, 0},
    {1, 77, 1, 112, 1.0f, 0},  {2, 70, 2, 64, 1.0f, 1},
};

struct Reference {
  std::vector<double> out, lse, dqkv;
};

// Causal attention and its backward in double over bf16-rounded q, k, v and dO; D = rowsum(dO * O) from the
// unrounded dO and the kernels' own float32 O, exactly the D the kernels use.
Reference reference(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                    const std::vector<float>& gpu_out) {
  const int64_t C = s.NH * s.hs, pitch = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hs));
  Reference r;
  r.out.assign(static_cast<size_t>(s.B * s.T * C), 0.0);
  r.lse.assign(static_cast<size_t>(s.B * s.NH * s.T), 0.0);
  r.dqkv.assign(static_cast<size_t>(s.B * s.T * pitch), 0.0);
  const auto bf = [](float x) { return static_cast<double>(round_to_bf16(x)); };
  std::vector<double> p(static_cast<size_t>(s.T)), dp(static_cast<size_t>(s.T));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.NH; ++h) {
      const auto q = [&](int64_t t, int64_t d) {
        return bf(qkv[static_cast<size_t>((b * s.T + t) * pitch + h * s.hs + d)]);
      };
      const auto k = [&](int64_t t, int64_t d) {
        return bf(qkv[static_cast<size_t>((b * s.T + t) * pitch + C + h * s.hs + d)]);
      };
      const auto v = [&](int64_t t, int64_t d) {
        return bf(qkv[static_cast<size_t>((b * s.T + t) * pitch + 2 * C + h * s.hs + d)]);
      };
      const auto at = [&](int64_t t, int64_t d) {
        return static_cast<size_t>((b * s.T + t) * C + h * s.hs + d);
      };
      const auto grad = [&](int64_t t, int64_t slot, int64_t d) {
        return static_cast<size_t>((b * s.T + t) * pitch + slot * C + h * s.hs + d);
      };
      for (int64_t i = 0; i < s.T; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < s.hs; ++d) dot += q(i, d) * k(j, d);
          p[static_cast<size_t>(j)] = dot * scale;
          m = std::max(m, p[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[static_cast<size_t>(j)] - m);
        for (int64_t j = 0; j <= i; ++j)
          p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m) / sum;
        r.lse[static_cast<size_t>((b * s.NH + h) * s.T + i)] = m + std::log(sum);
        for (int64_t d = 0; d < s.hs; ++d) {
          double o = 0.0;
          for (int64_t j = 0; j <= i; ++j) o += p[static_cast<size_t>(j)] * v(j, d);
          r.out[at(i, d)] = o;
        }
        // Backward of row i: dP_j = dO_i . v_j, dS_j = P_j (dP_j - D_i).
        double row_dot = 0.0;
        for (int64_t d = 0; d < s.hs; ++d) {
          row_dot += static_cast<double>(dout[at(i, d)]) * static_cast<double>(gpu_out[at(i, d)]);
        }
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < s.hs; ++d) dot += bf(dout[at(i, d)]) * v(j, d);
          dp[static_cast<size_t>(j)] = p[static_cast<size_t>(j)] * (dot - row_dot);
          for (int64_t d = 0; d < s.hs; ++d) {
            r.dqkv[grad(i, 0, d)] += scale * dp[static_cast<size_t>(j)] * k(j, d);
            r.dqkv[grad(j, 1, d)] += scale * dp[static_cast<size_t>(j)] * q(i, d);
            r.dqkv[grad(j, 2, d)] += p[static_cast<size_t>(j)] * bf(dout[at(i, d)]);
          }
        }
      }
    }
  }
  return r;
}

// Largest |actual - expected| over the root mean square of expected; every actual value must be finite.
double relative_error(std::span<const float> actual, const std::vector<double>& expected, const char* what) {
  EXPECT_EQ(actual.size(), expected.size()) << what;
  double squares = 0.0, worst = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(std::isfinite(actual[i])) << what << " element " << i << " is " << actual[i];
    if (!std::isfinite(actual[i])) return INFINITY;
    squares += expected[i] * expected[i];
    worst = std::max(worst, std::abs(static_cast<double>(actual[i]) - expected[i]));
  }
  const double rms = std::sqrt(squares / static_cast<double>(std::max<size_t>(expected.size(), 1)));
  return worst / std::max(rms, 1e-30);
}

TEST(AttentionTensorCores, MatchTheDoubleReferenceOverBf16Operands) {
  if (octet::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  AttentionOptions options;
  options.bf16 = true;
  AttentionWorkspace workspace;
  for (size_t index = 0; index < kShapes.size(); ++index) {
    const Shape& s = kShapes[index];
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " hs=" << s.hs);
    const int64_t C = s.NH * s.hs;
    ASSERT_TRUE(octet::cuda::attention_uses_tensor_cores(C, s.NH, options));
    const size_t n_qkv = static_cast<size_t>(s.B * s.T * 3 * C), n_out = static_cast<size_t>(s.B * s.T * C);
    const size_t n_lse = static_cast<size_t>(s.B * s.NH * s.T);
    const std::vector<float> qkv = octet::testing::random_normal(n_qkv, 1000 + index, s.stddev);
    const std::vector<float> dout = octet::testing::random_normal(n_out, 2000 + index);

    const size_t k = static_cast<size_t>(s.shift);
    DeviceBuffer<float> d_qkv(k + n_qkv), d_out(k + n_out), d_lse(n_lse), d_dout(k + n_out),
        d_dqkv(k + n_qkv);
    std::vector<float> staged(k + n_qkv, 0.0f);
    std::copy(qkv.begin(), qkv.end(), staged.begin() + static_cast<std::ptrdiff_t>(k));
    d_qkv.copy_from_host(staged);
    staged.assign(k + n_out, 0.0f);
    std::copy(dout.begin(), dout.end(), staged.begin() + static_cast<std::ptrdiff_t>(k));
    d_dout.copy_from_host(staged);
    d_out.fill_bytes(0xFF);  // NaN: every element must be written
    d_lse.fill_bytes(0xFF);
    d_dqkv.fill_bytes(0xFF);
    float* out_at = d_out.data() + k;
    float* dqkv_at = d_dqkv.data() + k;
    const float* qkv_at = d_qkv.data() + k;
    const float* dout_at = d_dout.data() + k;
    octet::cuda::attention_forward(out_at, d_lse.data(), qkv_at, s.B, s.T, C, s.NH, workspace, options,
                                   nullptr);
    octet::cuda::attention_backward(dqkv_at, dout_at, qkv_at, out_at, d_lse.data(), s.B, s.T, C, s.NH,
                                    workspace, options, nullptr);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> out(n_out), lse(n_lse), dqkv(n_qkv);
    OCTET_CUDA_CHECK(cudaMemcpy(out.data(), out_at, n_out * sizeof(float), cudaMemcpyDeviceToHost));
    d_lse.copy_to_host(lse);
    OCTET_CUDA_CHECK(cudaMemcpy(dqkv.data(), dqkv_at, n_qkv * sizeof(float), cudaMemcpyDeviceToHost));

    const Reference r = reference(s, qkv, dout, out);
    // bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.002); a sum of many such terms lands within a
    // few units of its typical size, far below what a wrong mask, scale or rescaling would give (order 1).
    const double out_error = relative_error(out, r.out, "out");
    const double dqkv_error = relative_error(dqkv, r.dqkv, "dqkv");
    double lse_error = 0.0;
    for (size_t i = 0; i < n_lse; ++i) {
      ASSERT_TRUE(std::isfinite(lse[i])) << "lse " << i;
      lse_error = std::max(lse_error, std::abs(static_cast<double>(lse[i]) - r.lse[i]));
    }
    std::printf("[attention hs=%lld T=%lld] out %.3g, dqkv %.3g (of their rms); lse %.3g\n",
                static_cast<long long>(s.hs), static_cast<long long>(s.T), out_error, dqkv_error, lse_error);
    EXPECT_LE(out_error, 0.03);
    EXPECT_LE(dqkv_error, 0.05);
    EXPECT_LE(lse_error, 0.01);  // lse depends on the scores only, which see no rounded probability

    // Deterministic: no atomics, fixed-order sums.
    DeviceBuffer<float> d_again(n_qkv);
    d_again.fill_bytes(0xFF);
    octet::cuda::attention_backward(d_again.data(), dout_at, qkv_at, out_at, d_lse.data(), s.B, s.T, C, s.NH,
                                    workspace, options, nullptr);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> again(n_qkv);
    d_again.copy_to_host(again);
    EXPECT_EQ(std::memcmp(again.data(), dqkv.data(), n_qkv * sizeof(float)), 0);
  }
}

// q, k, v stored as bf16 (as the CUDA backend stores them for this path) give exactly the results of the
// float32 values they round from: the kernels round q, k, v to bf16 first either way. A bf16 tensor at an
// address that is not 16-byte aligned is copied first, with the same results. The float32 path takes
// float32 only.
TEST(AttentionTensorCores, Bf16QkvGivesTheResultsOfItsFloat32Values) {
  if (octet::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  AttentionOptions options;
  options.bf16 = true;
  AttentionWorkspace workspace;
  for (const Shape& s : {Shape{2, 130, 3, 64, 1.0f, 0}, Shape{1, 77, 2, 48, 1.0f, 0}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " hs=" << s.hs);
    const int64_t C = s.NH * s.hs;
    const size_t n_qkv = static_cast<size_t>(s.B * s.T * 3 * C), n_out = static_cast<size_t>(s.B * s.T * C);
    const size_t n_lse = static_cast<size_t>(s.B * s.NH * s.T);
    const std::vector<float> qkv = octet::testing::random_normal(n_qkv, 31, s.stddev);
    const std::vector<float> dout = octet::testing::random_normal(n_out, 32);
    // The bf16 codes at a 16-byte aligned address (a fresh allocation) and 2 bytes past one.
    std::vector<uint16_t> codes(n_qkv), shifted(n_qkv + 1, 0);
    for (size_t i = 0; i < n_qkv; ++i) {
      codes[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(round_to_bf16(qkv[i])) >> 16);
      shifted[i + 1] = codes[i];
    }
    DeviceBuffer<float> d_qkv(n_qkv), d_dout(n_out);
    DeviceBuffer<uint16_t> d_codes(n_qkv), d_shifted(n_qkv + 1);
    d_qkv.copy_from_host(qkv);
    d_dout.copy_from_host(dout);
    d_codes.copy_from_host(codes);
    d_shifted.copy_from_host(shifted);

    // Results of one storage: out, lse and dqkv.
    const auto run = [&](const void* stored, octet::Dtype type) {
      DeviceBuffer<float> d_out(n_out), d_lse(n_lse), d_dqkv(n_qkv);
      d_out.fill_bytes(0xFF);
      d_lse.fill_bytes(0xFF);
      d_dqkv.fill_bytes(0xFF);
      octet::cuda::attention_forward(d_out.data(), d_lse.data(), stored, type, s.B, s.T, C, s.NH, workspace,
                                     options, nullptr);
      octet::cuda::attention_backward(d_dqkv.data(), d_dout.data(), stored, type, d_out.data(), d_lse.data(),
                                      s.B, s.T, C, s.NH, workspace, options, nullptr);
      OCTET_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> all(n_out + n_lse + n_qkv);
      OCTET_CUDA_CHECK(cudaMemcpy(all.data(), d_out.data(), n_out * sizeof(float), cudaMemcpyDeviceToHost));
      OCTET_CUDA_CHECK(
          cudaMemcpy(all.data() + n_out, d_lse.data(), n_lse * sizeof(float), cudaMemcpyDeviceToHost));
      OCTET_CUDA_CHECK(cudaMemcpy(all.data() + n_out + n_lse, d_dqkv.data(), n_qkv * sizeof(float),
                                  cudaMemcpyDeviceToHost));
      return all;
    };
    const std::vector<float> from_f32 = run(d_qkv.data(), octet::Dtype::f32);
    for (const float x : from_f32) ASSERT_TRUE(std::isfinite(x));
    const std::vector<float> from_aligned = run(d_codes.data(), octet::Dtype::bf16);
    const std::vector<float> from_misaligned = run(d_shifted.data() + 1, octet::Dtype::bf16);
    EXPECT_EQ(std::memcmp(from_aligned.data(), from_f32.data(), from_f32.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(from_misaligned.data(), from_f32.data(), from_f32.size() * sizeof(float)), 0);

    AttentionOptions float32_path;
    float32_path.bf16 = false;
    DeviceBuffer<float> d_out(n_out), d_lse(n_lse);
    EXPECT_THROW(
        octet::cuda::attention_forward(d_out.data(), d_lse.data(), d_codes.data(), octet::Dtype::bf16, s.B,
                                       s.T, C, s.NH, workspace, float32_path, nullptr),
        octet::Error);
  }
}

// Float32 values of bf16 bits, and bf16 bits of float32 values (round to nearest even).
std::vector<float> floats_of_bf16(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16);
  return out;
}
std::vector<uint16_t> bf16_of_floats(const std::vector<float>& values) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    out[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(round_to_bf16(values[i])) >> 16);
  }
  return out;
}

// cuDNN's fused attention, where the library can be loaded (it is optional), against the same double
// reference. Its outputs are bf16 and it rounds more of its intermediates (dQ, dK and dV are rounded from
// their float32 sums, and an output element several times the rms carries a rounding error of 2^-8 of
// itself), so the bounds are those above widened by that much: 0.05 and 0.08 of the rms, still an order of
// magnitude below a wrong mask, scale or softmax. lse must agree with octet's own kernels' (the two are
// interchangeable). The backward must be bit-identical when repeated: octet keeps only engines without
// cuDNN's non-deterministic note.
TEST(CudnnAttention, MatchesTheDoubleReferenceAndRepeatsBitForBit) {
  if (octet::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::string why_not;
  std::unique_ptr<octet::cuda::CudnnAttention> cudnn = octet::cuda::CudnnAttention::load(&why_not);
  if (!cudnn) GTEST_SKIP() << "cuDNN not loadable: " << why_not;
  AttentionOptions options;
  options.bf16 = true;
  AttentionWorkspace workspace;
  const std::vector<Shape> shapes = {{2, 63, 2, 64, 1.0f, 0},  {1, 64, 3, 64, 2.0f, 0},
                                     {2, 130, 3, 64, 1.0f, 0}, {1, 200, 2, 128, 1.0f, 0},
                                     {2, 65, 2, 32, 1.0f, 0},  {4, 256, 2, 64, 1.0f, 0}};
  for (size_t index = 0; index < shapes.size(); ++index) {
    const Shape& s = shapes[index];
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " hs=" << s.hs);
    const int64_t C = s.NH * s.hs;
    ASSERT_TRUE(cudnn->supports(s.B, s.T, C, s.NH, &why_not)) << why_not;
    std::printf("[cudnn %s hs=%lld T=%lld] %s\n", cudnn->version().c_str(), static_cast<long long>(s.hs),
                static_cast<long long>(s.T), cudnn->engines(s.B, s.T, C, s.NH).c_str());
    const size_t n_qkv = static_cast<size_t>(s.B * s.T * 3 * C), n_out = static_cast<size_t>(s.B * s.T * C);
    const size_t n_lse = static_cast<size_t>(s.B * s.NH * s.T);
    const std::vector<uint16_t> qkv_bits =
        bf16_of_floats(octet::testing::random_normal(n_qkv, 3000 + index, s.stddev));
    const std::vector<uint16_t> dout_bits =
        bf16_of_floats(octet::testing::random_normal(n_out, 4000 + index));
    DeviceBuffer<uint16_t> d_qkv(n_qkv), d_out(n_out), d_dout(n_out), d_dqkv(n_qkv), d_again(n_qkv);
    DeviceBuffer<float> d_lse(n_lse), d_own_out(n_out), d_own_lse(n_lse);
    d_qkv.copy_from_host(qkv_bits);
    d_dout.copy_from_host(dout_bits);
    d_out.fill_bytes(0xFF);
    d_lse.fill_bytes(0xFF);
    d_dqkv.fill_bytes(0xFF);
    d_again.fill_bytes(0xFF);
    cudnn->forward(d_out.data(), d_lse.data(), d_qkv.data(), s.B, s.T, C, s.NH, nullptr);
    cudnn->backward(d_dqkv.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_lse.data(), s.B, s.T, C, s.NH,
                    nullptr);
    cudnn->backward(d_again.data(), d_dout.data(), d_qkv.data(), d_out.data(), d_lse.data(), s.B, s.T, C,
                    s.NH, nullptr);
    octet::cuda::attention_forward(d_own_out.data(), d_own_lse.data(), d_qkv.data(), octet::Dtype::bf16, s.B,
                                   s.T, C, s.NH, workspace, options, nullptr);
    OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> out_bits(n_out), dqkv_bits(n_qkv), again_bits(n_qkv);
    std::vector<float> lse(n_lse), own_lse(n_lse);
    d_out.copy_to_host(out_bits);
    d_dqkv.copy_to_host(dqkv_bits);
    d_again.copy_to_host(again_bits);
    d_lse.copy_to_host(lse);
    d_own_lse.copy_to_host(own_lse);

    const std::vector<float> out = floats_of_bf16(out_bits), dqkv = floats_of_bf16(dqkv_bits);
    const Reference r = reference(s, floats_of_bf16(qkv_bits), floats_of_bf16(dout_bits), out);
    const double out_error = relative_error(out, r.out, "out");
    const double dqkv_error = relative_error(dqkv, r.dqkv, "dqkv");
    double lse_error = 0.0, lse_gap = 0.0;
    for (size_t i = 0; i < n_lse; ++i) {
      ASSERT_TRUE(std::isfinite(lse[i])) << "lse " << i;
      lse_error = std::max(lse_error, std::abs(static_cast<double>(lse[i]) - r.lse[i]));
      lse_gap = std::max(lse_gap, std::abs(static_cast<double>(lse[i]) - static_cast<double>(own_lse[i])));
    }
    std::printf("[cudnn hs=%lld T=%lld] out %.3g, dqkv %.3g (of their rms); lse %.3g, from octet's %.3g\n",
                static_cast<long long>(s.hs), static_cast<long long>(s.T), out_error, dqkv_error, lse_error,
                lse_gap);
    EXPECT_LE(out_error, 0.05);
    EXPECT_LE(dqkv_error, 0.08);
    EXPECT_LE(lse_error, 0.01);
    EXPECT_LE(lse_gap, 0.01);
    EXPECT_EQ(std::memcmp(again_bits.data(), dqkv_bits.data(), n_qkv * sizeof(uint16_t)), 0);
  }
}

// Repeated backwards at the training shapes of GPT-2 124M and 1.5B, where many thread blocks share each
// query tile's gradient. octet's kernels sum in a fixed order: the same bits every time. cuDNN's engine
// (without its "non-deterministic" note) adds the blocks' parts of dQ into a float32 accumulator
// atomically: a few elements of dQ come out a rounding apart from run to run (docs/gpu.md says so). This
// checks both facts: octet's kernels repeat exactly, and cuDNN's differences stay that small and that rare.
TEST(CudnnAttention, RepeatedBackwardsAtTrainingShapes) {
  if (octet::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::string why_not;
  std::unique_ptr<octet::cuda::CudnnAttention> cudnn = octet::cuda::CudnnAttention::load(&why_not);
  AttentionOptions options;
  options.bf16 = true;
  AttentionWorkspace workspace;
  for (const auto& [B, NH] : {std::pair<int64_t, int64_t>{32, 12}, {8, 25}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " NH=" << NH);
    const int64_t T = 1024, C = NH * 64;
    const size_t n_qkv = static_cast<size_t>(B * T * 3 * C), n_out = static_cast<size_t>(B * T * C);
    DeviceBuffer<uint16_t> qkv(n_qkv), out(n_out), dout(n_out), dqkv(n_qkv);
    DeviceBuffer<float> lse(static_cast<size_t>(B * NH * T)), fout(n_out), fdout(n_out), fdqkv(n_qkv);
    const std::vector<float> dout_values = octet::testing::random_normal(n_out, 12);
    qkv.copy_from_host(bf16_of_floats(octet::testing::random_normal(n_qkv, 11)));
    dout.copy_from_host(bf16_of_floats(dout_values));
    fdout.copy_from_host(dout_values);

    octet::cuda::attention_forward(fout.data(), lse.data(), qkv.data(), octet::Dtype::bf16, B, T, C, NH,
                                   workspace, options, nullptr);
    std::vector<float> own_first(n_qkv), own_again(n_qkv);
    for (int run = 0; run < 3; ++run) {
      fdqkv.fill_bytes(0xFF);
      octet::cuda::attention_backward(fdqkv.data(), fdout.data(), qkv.data(), octet::Dtype::bf16, fout.data(),
                                      lse.data(), B, T, C, NH, workspace, options, nullptr);
      OCTET_CUDA_CHECK(cudaDeviceSynchronize());
      fdqkv.copy_to_host(run == 0 ? own_first : own_again);
      if (run > 0) {
        EXPECT_EQ(std::memcmp(own_first.data(), own_again.data(), n_qkv * sizeof(float)), 0)
            << "octet's backward, run " << run;
      }
    }

    if (!cudnn) continue;  // cuDNN is optional
    ASSERT_TRUE(cudnn->supports(B, T, C, NH, &why_not)) << why_not;
    cudnn->forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, nullptr);
    std::vector<uint16_t> first(n_qkv), again(n_qkv);
    for (int run = 0; run < 4; ++run) {
      dqkv.fill_bytes(0xFF);
      cudnn->backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, nullptr);
      OCTET_CUDA_CHECK(cudaDeviceSynchronize());
      dqkv.copy_to_host(run == 0 ? first : again);
      if (run == 0) continue;
      // dQ's rms, the scale of a negligible difference.
      double sum_sq = 0.0;
      for (size_t i = 0; i < n_qkv; ++i) {
        if (i % static_cast<size_t>(3 * C) < static_cast<size_t>(C)) {
          const double v = octet::bf16_to_float(first[i]);
          sum_sq += v * v;
        }
      }
      const double rms = std::sqrt(sum_sq / static_cast<double>(n_qkv / 3));
      size_t differ = 0, outside_dq = 0, far_apart = 0;
      for (size_t i = 0; i < n_qkv; ++i) {
        if (first[i] == again[i]) continue;
        ++differ;
        if (i % static_cast<size_t>(3 * C) >= static_cast<size_t>(C)) ++outside_dq;
        // A rounding apart: two bf16 units of the larger value, or a thousandth of dQ's rms near zero.
        const double a = octet::bf16_to_float(first[i]), b = octet::bf16_to_float(again[i]);
        if (!(std::abs(a - b) <= std::ldexp(std::max(std::abs(a), std::abs(b)), -7) + 1e-3 * rms))
          ++far_apart;
      }
      std::printf("[cudnn B=%lld NH=%lld] run %d: %zu of %zu gradient elements differ from run 0\n",
                  static_cast<long long>(B), static_cast<long long>(NH), run, differ, n_qkv);
      EXPECT_EQ(outside_dq, 0u) << "dK and dV repeat exactly";
      EXPECT_EQ(far_apart, 0u) << "elements of dQ further apart than a rounding";
      EXPECT_LE(differ, n_qkv / 100000) << "too many elements differ";
    }
  }
}

// Device time of one forward and one backward at GPT-2 124M's attention shape, cuDNN against octet's kernels
// (a measurement, not a check: run with --gtest_also_run_disabled_tests).
TEST(CudnnAttention, DISABLED_TimesAgainstOctetKernels) {
  if (octet::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::string why_not;
  std::unique_ptr<octet::cuda::CudnnAttention> cudnn = octet::cuda::CudnnAttention::load(&why_not);
  if (!cudnn) GTEST_SKIP() << "cuDNN not loadable: " << why_not;
  AttentionOptions options;
  options.bf16 = true;
  AttentionWorkspace workspace;
  for (const auto& [B, NH] : {std::pair<int64_t, int64_t>{32, 12}, {16, 16}, {8, 25}}) {
    const int64_t T = 1024, C = NH * 64;
    ASSERT_TRUE(cudnn->supports(B, T, C, NH, &why_not)) << why_not;
    const size_t n_qkv = static_cast<size_t>(B * T * 3 * C), n_out = static_cast<size_t>(B * T * C);
    DeviceBuffer<uint16_t> qkv(n_qkv), out(n_out), dout(n_out), dqkv(n_qkv);
    DeviceBuffer<float> lse(static_cast<size_t>(B * NH * T)), fout(n_out), fdout(n_out), fdqkv(n_qkv);
    qkv.copy_from_host(bf16_of_floats(octet::testing::random_normal(n_qkv, 7)));
    dout.copy_from_host(bf16_of_floats(octet::testing::random_normal(n_out, 8)));
    fdout.copy_from_host(octet::testing::random_normal(n_out, 8));
    cudaEvent_t start, stop;
    OCTET_CUDA_CHECK(cudaEventCreate(&start));
    OCTET_CUDA_CHECK(cudaEventCreate(&stop));
    const auto time = [&](auto&& f) {
      for (int i = 0; i < 3; ++i) f();
      OCTET_CUDA_CHECK(cudaEventRecord(start));
      for (int i = 0; i < 20; ++i) f();
      OCTET_CUDA_CHECK(cudaEventRecord(stop));
      OCTET_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return ms / 20.0f;
    };
    const float cf = time([&] { cudnn->forward(out.data(), lse.data(), qkv.data(), B, T, C, NH, nullptr); });
    const float cb = time([&] {
      cudnn->backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, nullptr);
    });
    const float of = time([&] {
      octet::cuda::attention_forward(fout.data(), lse.data(), qkv.data(), octet::Dtype::bf16, B, T, C, NH,
                                     workspace, options, nullptr);
    });
    const float ob = time([&] {
      octet::cuda::attention_backward(fdqkv.data(), fdout.data(), qkv.data(), octet::Dtype::bf16, fout.data(),
                                      lse.data(), B, T, C, NH, workspace, options, nullptr);
    });
    std::printf(
        "[attention B=%lld NH=%lld] cudnn fwd %.3f ms bwd %.3f ms (%s); octet fwd %.3f ms bwd %.3f ms\n",
        static_cast<long long>(B), static_cast<long long>(NH), cf, cb, cudnn->engines(B, T, C, NH).c_str(),
        of, ob);
  }
}

}  // namespace
