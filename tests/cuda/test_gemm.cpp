// The cuBLASLt products of octet/cuda/gemm.h against a float64 host reference computed from the exact operand
// values (FP8 codes decoded by octet's codec, BF16/FP16 values decoded exactly), over odd shapes where the
// types allow them, every stored layout, both output types, accumulation, scales and the bias epilogue.
// Small-integer operands (and biases) with power-of-two scales must match exactly. Operand padding holds NaN
// codes and the output is surrounded by sentinel bytes, so a read or write out of bounds shows. Every test
// skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compare.h"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/cuda/gemm.h"
#include "octet/numerics/format.h"
#include "random.h"

namespace {

using octet::Dtype;
using octet::cuda::DeviceBuffer;
using octet::cuda::GemmAlgorithmChoice;
using octet::cuda::GemmEngine;
using octet::cuda::GemmProblem;
using octet::cuda::GemmType;

#define SKIP_WITHOUT_GPU() \
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

#define SKIP_WITHOUT_FP8()                                                         \
  SKIP_WITHOUT_GPU();                                                              \
  if (!octet::cuda::has_fp8_tensor_cores(octet::cuda::device_info(0))) {           \
    GTEST_SKIP() << "no FP8 tensor cores on " << octet::cuda::device_info(0).name; \
  }

constexpr uint8_t kSentinel = 0xA5;
constexpr size_t kGuardBytes = 256;

Dtype storage_dtype(GemmType type) {
  switch (type) {
    case GemmType::f32:
    case GemmType::tf32:
      return Dtype::f32;
    case GemmType::bf16:
      return Dtype::bf16;
    case GemmType::f16:
      return Dtype::f16;
    case GemmType::e4m3:
      return Dtype::e4m3;
    case GemmType::e5m2:
      return Dtype::e5m2;
  }
  return Dtype::f32;
}

size_t element_bytes(GemmType type) {
  return static_cast<size_t>(octet::dtype_info(storage_dtype(type)).storage_bits / 8);
}

// The comparator bounds |error| by reduction_length * 2^-24 * magnitude (plus one ulp of the output), with
// magnitude = |alpha scales| sum |a_k b_k| (+ |D| when accumulating). This is the length that makes that the
// worst case of each type:
//  - float32, BF16, FP16 operands: products are exact in float32 (FMA, or 8+8 and 11+11 significant bits);
//    each of the K additions rounds once, to nearest (2^-24) or, on tensor cores that align and truncate,
//    toward zero (2^-23): 2K. Eight more cover alpha, the two scales and beta.
//  - TF32: each operand is first rounded to 10 fraction bits (2^-11 to nearest, 2^-10 if truncated), so a
//    product may be off by 2^-9 relative: 2^15 units of 2^-24, once for the whole sum.
//  - FP8: products are exact, but Hopper's FP8 tensor cores add them in an accumulator of 13 fraction bits
//    (sign, 8 exponent bits, 13 mantissa bits) that truncates; fast accumulation keeps the whole reduction
//    there, and without it cuBLASLt promotes partial sums to float32 only every few MMA steps. Bounding every
//    one of the K additions by 2^-13 = 2^11 units covers both modes.
int64_t effective_reduction_length(GemmType type, int64_t K) {
  const int64_t float32_sum = 2 * K + 8;
  switch (type) {
    case GemmType::tf32:
      return (int64_t{1} << 15) + float32_sum;
    case GemmType::e4m3:
    case GemmType::e5m2:
      return K * (int64_t{1} << 11) + float32_sum;
    default:
      return float32_sum;
  }
}

// A logical [rows, cols] operand (cols = K): the exact values the GEMM multiplies (codes decoded, before any
// scale_inv), and its bytes as stored, [rows, cols] or, transposed, [cols, rows], with row stride ld
// elements. Padding between rows holds NaN codes: a product that read it would be NaN.
struct HostOperand {
  GemmType type = GemmType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> values;  // logical, row-major
  std::vector<uint8_t> stored;
};

HostOperand make_operand(GemmType type, int64_t rows, int64_t cols, bool transposed, int64_t ld,
                         std::span<const float> x, float fp8_scale = 1.0f) {
  const Dtype dtype = storage_dtype(type);
  const size_t bytes = element_bytes(type);
  const int64_t stored_rows = transposed ? cols : rows;
  const int64_t stored_cols = transposed ? rows : cols;
  if (ld == 0) ld = stored_cols;
  HostOperand op;
  op.type = type;
  op.rows = rows;
  op.cols = cols;
  op.values.resize(static_cast<size_t>(rows * cols));
  op.stored.assign(static_cast<size_t>(stored_rows * ld) * bytes, 0xFF);  // all ones: NaN in every format
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      uint32_t code;
      if (dtype == Dtype::f32) {
        std::memcpy(&code, &x[i], sizeof code);
        op.values[i] = x[i];
      } else {
        const float scaled = octet::is_fp8(dtype) ? x[i] * fp8_scale : x[i];
        code = octet::encode(dtype, scaled);
        op.values[i] = octet::decode(dtype, code);
      }
      const int64_t position = transposed ? c * ld + r : r * ld + c;
      std::memcpy(&op.stored[static_cast<size_t>(position) * bytes], &code,
                  bytes);  // little-endian low bytes
    }
  }
  return op;
}

// Device bytes with sentinel guards after them.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::span<const uint8_t> host)
      : size_(host.size()), buffer_(host.size() + kGuardBytes) {
    buffer_.fill_bytes(kSentinel);
    buffer_.copy_from_host(host);
  }
  void* data() { return buffer_.data(); }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> all(buffer_.size());
    buffer_.copy_to_host(all);
    return all;
  }
  size_t size() const { return size_; }

 private:
  size_t size_;
  DeviceBuffer<uint8_t> buffer_;
};

struct Reference {
  std::vector<float> expected;   // as float32 for the comparator; the float64 value rounded once
  std::vector<float> magnitude;  // per element: |alpha scales| sum |a b| + |bias| + |D before|
};

// D = alpha * scale * A B^T (+ bias [N] on every row) (+ D_before), in float64 from the exact values.
Reference reference_product(const HostOperand& a, const HostOperand& b, double alpha_scale,
                            std::span<const float> d_before, std::span<const float> bias = {}) {
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  Reference ref;
  ref.expected.resize(static_cast<size_t>(M * N));
  ref.magnitude.resize(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double product =
            a.values[static_cast<size_t>(i * K + k)] * b.values[static_cast<size_t>(j * K + k)];
        sum += product;
        magnitude += std::fabs(product);
      }
      const size_t o = static_cast<size_t>(i * N + j);
      double value = alpha_scale * sum;
      magnitude *= std::fabs(alpha_scale);
      if (!bias.empty()) {
        value += bias[static_cast<size_t>(j)];
        magnitude += std::fabs(bias[static_cast<size_t>(j)]);
      }
      if (!d_before.empty()) {
        value += d_before[o];
        magnitude += std::fabs(d_before[o]);
      }
      ref.expected[o] = static_cast<float>(value);
      ref.magnitude[o] = static_cast<float>(magnitude);
    }
  }
  return ref;
}

// One product as a test runs it: operands, output layout, options.
struct Case {
  GemmType a_type = GemmType::f32;
  GemmType b_type = GemmType::f32;
  int64_t M = 0, N = 0, K = 0;
  bool a_transposed = false;
  bool b_transposed = false;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool bf16_output = false;
  bool accumulate = false;
  bool fast_accumulation = false;
  float alpha = 1.0f;
  float a_scale_inv = 1.0f;  // FP8: the scales the engine reads from device memory; 1: pointer left null
  float b_scale_inv = 1.0f;
  std::vector<float> bias;  // [N], exact in bias_type; empty: no bias
  GemmType bias_type = GemmType::bf16;
  std::vector<float> addend;  // [M, N] float32, in a buffer of its own; empty: none
};

struct Outcome {
  std::vector<float> d;  // [M, N] as float32 (BF16 outputs widened)
  bool guards_intact = true;
};

// Runs `c` on operands a and b (logical values given), with D starting as d_before (or sentinels).
Outcome run_case(GemmEngine& engine, const Case& c, const HostOperand& a, const HostOperand& b,
                 std::span<const float> d_before) {
  const int64_t ldd = c.ldd != 0 ? c.ldd : c.N;
  const size_t out_bytes = c.bf16_output ? 2 : 4;
  std::vector<uint8_t> d_host(static_cast<size_t>(c.M * ldd) * out_bytes, kSentinel);
  for (int64_t i = 0; i < c.M && !d_before.empty(); ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      const float v = d_before[static_cast<size_t>(i * c.N + j)];
      const uint32_t code = c.bf16_output ? octet::encode(Dtype::bf16, v) : std::bit_cast<uint32_t>(v);
      std::memcpy(&d_host[static_cast<size_t>(i * ldd + j) * out_bytes], &code, out_bytes);
    }
  }
  DeviceBytes a_device(a.stored), b_device(b.stored), d_device(d_host);
  // Each scale 16 bytes from the last, as cuBLASLt requires (see octet/cuda/gemm.h).
  const float scales[8] = {c.a_scale_inv, 0.0f, 0.0f, 0.0f, c.b_scale_inv, 0.0f, 0.0f, 0.0f};
  DeviceBuffer<float> scalars(8);
  scalars.copy_from_host(scales);
  // The bias in its stored type, in an allocation of its own (256-byte aligned).
  std::vector<uint8_t> bias_host(c.bias.size() * element_bytes(c.bias_type));
  for (size_t j = 0; j < c.bias.size(); ++j) {
    const uint32_t code = c.bias_type == GemmType::f32 ? std::bit_cast<uint32_t>(c.bias[j])
                                                       : octet::encode(storage_dtype(c.bias_type), c.bias[j]);
    std::memcpy(&bias_host[j * element_bytes(c.bias_type)], &code, element_bytes(c.bias_type));
  }
  DeviceBytes bias_device(bias_host);
  std::vector<uint8_t> addend_host(c.addend.size() * sizeof(float));
  if (!c.addend.empty()) std::memcpy(addend_host.data(), c.addend.data(), addend_host.size());
  DeviceBytes addend_device(addend_host);

  GemmProblem p;
  p.M = c.M;
  p.N = c.N;
  p.K = c.K;
  p.a_type = c.a_type;
  p.b_type = c.b_type;
  p.a = a_device.data();
  p.b = b_device.data();
  p.a_transposed = c.a_transposed;
  p.b_transposed = c.b_transposed;
  p.lda = c.lda;
  p.ldb = c.ldb;
  p.ldd = c.ldd;
  if (c.bf16_output) {
    p.d_bf16 = static_cast<__nv_bfloat16*>(d_device.data());
  } else {
    p.d = static_cast<float*>(d_device.data());
  }
  p.accumulate = c.accumulate;
  p.alpha = c.alpha;
  if (c.a_scale_inv != 1.0f) p.a_scale_inv = scalars.data();
  if (c.b_scale_inv != 1.0f) p.b_scale_inv = scalars.data() + 4;
  p.fast_accumulation = c.fast_accumulation;
  if (!c.bias.empty()) {
    p.bias = bias_device.data();
    p.bias_type = c.bias_type;
  }
  if (!c.addend.empty()) p.addend = static_cast<const float*>(addend_device.data());

  octet::cuda::Stream stream;
  engine.run(p, stream.get());
  stream.synchronize();

  Outcome out;
  if (!c.addend.empty()) {
    const std::vector<uint8_t> addend_after = addend_device.read();
    if (!std::equal(addend_host.begin(), addend_host.end(), addend_after.begin())) out.guards_intact = false;
  }
  const std::vector<uint8_t> raw = d_device.read();
  out.d.resize(static_cast<size_t>(c.M * c.N));
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      uint32_t code = 0;
      std::memcpy(&code, &raw[static_cast<size_t>(i * ldd + j) * out_bytes], out_bytes);
      out.d[static_cast<size_t>(i * c.N + j)] =
          c.bf16_output ? octet::decode(Dtype::bf16, code) : std::bit_cast<float>(code);
    }
  }
  // Everything outside the [M, N] block of D (row padding and the guard) still holds the sentinel.
  for (size_t byte = 0; byte < raw.size(); ++byte) {
    const size_t element = byte / out_bytes;
    const bool inside = byte < d_host.size() && static_cast<int64_t>(element) % ldd < c.N;
    if (!inside && raw[byte] != kSentinel) out.guards_intact = false;
  }
  return out;
}

// Random operands for `c`, the product on the device, and the comparison with the float64 reference.
void check_case(GemmEngine& engine, const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << octet::cuda::gemm_type_name(c.a_type) << " x "
                                    << octet::cuda::gemm_type_name(c.b_type) << " M=" << c.M << " N=" << c.N
                                    << " K=" << c.K << (c.a_transposed ? " A^T" : "")
                                    << (c.b_transposed ? " B^T" : "") << (c.bf16_output ? " bf16 out" : "")
                                    << (c.accumulate ? " accumulate" : "")
                                    << (c.fast_accumulation ? " fast" : ""));
  const std::vector<float> x_a = octet::testing::random_normal(static_cast<size_t>(c.M * c.K), seed);
  const std::vector<float> x_b = octet::testing::random_normal(static_cast<size_t>(c.N * c.K), seed + 1);
  // FP8 operands are cast with scales that bring their values near the format's range; the product then
  // multiplies by the scale_inv values, as in training.
  const HostOperand a = make_operand(c.a_type, c.M, c.K, c.a_transposed, c.lda, x_a, 1.0f / c.a_scale_inv);
  const HostOperand b = make_operand(c.b_type, c.N, c.K, c.b_transposed, c.ldb, x_b, 1.0f / c.b_scale_inv);
  std::vector<float> d_before;
  if (c.accumulate) {
    d_before = octet::testing::random_normal(static_cast<size_t>(c.M * c.N), seed + 2, 4.0f);
    if (c.bf16_output) {
      for (float& v : d_before) v = octet::round_to(Dtype::bf16, v);
    }
  }
  const double alpha_scale = static_cast<double>(c.alpha) * c.a_scale_inv * c.b_scale_inv;
  const Reference ref = reference_product(a, b, alpha_scale, d_before);
  const Outcome out = run_case(engine, c, a, b, d_before);

  octet::testing::CompareOptions options;
  options.dtype = c.bf16_output ? Dtype::bf16 : Dtype::f32;
  options.reduction_length = effective_reduction_length(c.a_type, c.K);
  if (c.bf16_output && c.accumulate) {
    // A BF16 output's epilogue may round alpha * sum to BF16 before it adds C (seen on H100, cuBLASLt 13.1):
    // one more rounding of 2^-8 relative to the terms, not to their (possibly cancelling) sum.
    options.reduction_length += int64_t{1} << 16;
  }
  options.magnitude = ref.magnitude;
  EXPECT_TRUE(octet::testing::all_close(out.d, ref.expected, options));
  EXPECT_TRUE(octet::testing::has_nonzero(out.d));
  EXPECT_TRUE(out.guards_intact) << "bytes outside D's [M, N] block were written";
}

struct Shape {
  int64_t M, N, K;
};

// ----------------------------------------------------------------------------------------------------------
// FP8: E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3; K-major operands only.

using Fp8Formats = std::tuple<GemmType, GemmType>;

class Fp8Gemm : public ::testing::TestWithParam<Fp8Formats> {};

TEST_P(Fp8Gemm, MatchesFloat64ReferenceWithScales) {
  SKIP_WITHOUT_FP8();
  const auto [a_type, b_type] = GetParam();
  GemmEngine engine;
  uint64_t seed = 100;
  for (const Shape s : {Shape{37, 48, 64}, Shape{128, 96, 160}, Shape{16, 16, 16}, Shape{1, 32, 4096}}) {
    for (const bool accumulate : {false, true}) {
      for (const bool fast : {false, true}) {
        Case c;
        c.a_type = a_type;
        c.b_type = b_type;
        c.M = s.M;
        c.N = s.N;
        c.K = s.K;
        c.accumulate = accumulate;
        c.fast_accumulation = fast;
        // Scales that are not powers of two, so that a scale applied twice, never or to the wrong operand
        // shows; E5M2 (gradients) with a smaller one.
        c.a_scale_inv = a_type == GemmType::e4m3 ? 0.0123f : 3.1e-5f;
        c.b_scale_inv = b_type == GemmType::e4m3 ? 0.0071f : 2.3e-5f;
        check_case(engine, c, seed++);
      }
    }
  }
  EXPECT_EQ(engine.counters().fp8(), 16);
  EXPECT_EQ(engine.counters().fp8_fast_accumulation, 8);
  EXPECT_EQ(engine.counters().total(), 16);
}

TEST_P(Fp8Gemm, Bf16Output) {
  SKIP_WITHOUT_FP8();
  const auto [a_type, b_type] = GetParam();
  GemmEngine engine;
  uint64_t seed = 200;
  for (const Shape s : {Shape{37, 48, 64}, Shape{128, 96, 160}}) {
    for (const bool bf16_output : {false, true}) {
      for (const bool accumulate : {false, true}) {
        Case c;
        c.a_type = a_type;
        c.b_type = b_type;
        c.M = s.M;
        c.N = s.N;
        c.K = s.K;
        c.bf16_output = bf16_output;
        c.accumulate = accumulate;
        c.a_scale_inv = 0.02f;
        c.b_scale_inv = b_type == GemmType::e4m3 ? 0.01f : 1e-4f;
        check_case(engine, c, seed++);
      }
    }
  }
  EXPECT_EQ(engine.counters().bf16_outputs, 4);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Gemm,
                         ::testing::Values(Fp8Formats{GemmType::e4m3, GemmType::e4m3},
                                           Fp8Formats{GemmType::e4m3, GemmType::e5m2},
                                           Fp8Formats{GemmType::e5m2, GemmType::e4m3}),
                         [](const auto& test_info) {
                           return std::string(octet::cuda::gemm_type_name(std::get<0>(test_info.param))) +
                                  "_" + octet::cuda::gemm_type_name(std::get<1>(test_info.param));
                         });

// Small integers are exact in both FP8 formats (|x| <= 7 needs 3 significant bits), their products and every
// partial sum here (|sum| < 2^13) are exact even in the narrow FP8 accumulator, and power-of-two scales are
// exact: the product must equal the reference bit for bit, and doubling a scale must double D exactly.
TEST(Fp8GemmExact, SmallIntegersAndPowerOfTwoScales) {
  SKIP_WITHOUT_FP8();
  GemmEngine engine;
  const int64_t M = 48, N = 32, K = 128;  // |sum| <= 128 * 49 = 6272
  const std::vector<float> x_a = octet::testing::random_small_integers(static_cast<size_t>(M * K), 7, 7);
  const std::vector<float> x_b = octet::testing::random_small_integers(static_cast<size_t>(N * K), 8, 7);
  for (const auto& [a_type, b_type] :
       {std::pair{GemmType::e4m3, GemmType::e4m3}, std::pair{GemmType::e4m3, GemmType::e5m2},
        std::pair{GemmType::e5m2, GemmType::e4m3}}) {
    const HostOperand a = make_operand(a_type, M, K, false, 0, x_a);
    const HostOperand b = make_operand(b_type, N, K, false, 0, x_b);
    for (const bool fast : {false, true}) {
      Case c;
      c.a_type = a_type;
      c.b_type = b_type;
      c.M = M;
      c.N = N;
      c.K = K;
      c.fast_accumulation = fast;
      const Outcome unscaled = run_case(engine, c, a, b, {});
      const Reference ref = reference_product(a, b, 1.0, {});
      ASSERT_EQ(unscaled.d, ref.expected) << "small-integer product, fast=" << fast;
      ASSERT_TRUE(octet::testing::has_nonzero(unscaled.d));

      c.a_scale_inv = 2.0f;
      const Outcome doubled = run_case(engine, c, a, b, {});
      c.a_scale_inv = 1.0f;
      c.b_scale_inv = 0.25f;
      const Outcome quartered = run_case(engine, c, a, b, {});
      c.b_scale_inv = 1.0f;
      c.accumulate = true;
      const Outcome accumulated = run_case(engine, c, a, b, unscaled.d);
      for (size_t i = 0; i < ref.expected.size(); ++i) {
        ASSERT_EQ(doubled.d[i], 2.0f * unscaled.d[i]) << "a_scale_inv = 2 at " << i;
        ASSERT_EQ(quartered.d[i], 0.25f * unscaled.d[i]) << "b_scale_inv = 1/4 at " << i;
        ASSERT_EQ(accumulated.d[i], 2.0f * unscaled.d[i]) << "accumulate at " << i;
      }
    }
  }
}

// Fast accumulation must reach the tensor cores. Each output sums one product of 2^16 and K - 1 products of
// 1: exactly 2^16 + K - 1 in float32. In the FP8 accumulator (13 fraction bits) next to 2^16 a 1 is below
// the last place and is lost; promoted to float32 at intervals, only the ones that share an interval with
// the large product can be lost. So the promoted result is close to exact and the fast one is not. (H100,
// cuBLASLt 13.1: promoted 69504, the 127 ones of the first interval of 128 lost; fast 65536, every one lost.)
TEST(Fp8GemmExact, FastAccumulationTakesEffect) {
  SKIP_WITHOUT_FP8();
  const octet::cuda::DeviceInfo info = octet::cuda::device_info(0);
  GemmEngine engine;
  const int64_t M = 64, N = 64, K = 4096;
  std::vector<float> x_a(static_cast<size_t>(M * K), 1.0f), x_b(static_cast<size_t>(N * K), 1.0f);
  for (int64_t i = 0; i < M; ++i) x_a[static_cast<size_t>(i * K)] = 256.0f;
  for (int64_t j = 0; j < N; ++j) x_b[static_cast<size_t>(j * K)] = 256.0f;
  const HostOperand a = make_operand(GemmType::e4m3, M, K, false, 0, x_a);
  const HostOperand b = make_operand(GemmType::e4m3, N, K, false, 0, x_b);
  const float exact = 65536.0f + static_cast<float>(K - 1);
  Case c;
  c.a_type = c.b_type = GemmType::e4m3;
  c.M = M;
  c.N = N;
  c.K = K;
  const Outcome promoted = run_case(engine, c, a, b, {});
  c.fast_accumulation = true;
  const Outcome fast = run_case(engine, c, a, b, {});
  const double promoted_error = std::fabs(promoted.d[0] - exact);
  const double fast_error = std::fabs(fast.d[0] - exact);
  RecordProperty("promoted", std::to_string(promoted.d[0]));
  RecordProperty("fast", std::to_string(fast.d[0]));
  std::cout << "sum of 2^16 and " << (K - 1) << " ones: promoted " << promoted.d[0] << ", fast " << fast.d[0]
            << ", exact " << exact << "\n";
  // Both within the FP8 bound of the comparator's table (K additions of 2^-13 each).
  for (const auto* outcome : {&promoted, &fast}) {
    for (const float v : outcome->d) ASSERT_LE(std::fabs(v - exact), K * std::ldexp(1.0, -13) * exact);
  }
  if (info.compute_major == 9) {
    // Hopper: what the flag is for.
    EXPECT_LT(promoted_error, fast_error) << "fast accumulation made no difference";
  }
}

// ----------------------------------------------------------------------------------------------------------
// The bias epilogue: D = alpha * scales * A B^T + bias [N] in float32, with the bias in the types the linear
// layers give it (BF16 for FP8 and BF16 products, FP16 for FP16, float32 for float32; BF16 operands also take
// a float32 one). Small-integer operands, half-integer biases, a power-of-two alpha and power-of-two scales
// keep every value exact (sums below 2^13, even in the FP8 accumulator), so D must equal the reference bit
// for bit. The bias must come after alpha and the scales, not be scaled by them.

// Halves of small integers, |b| <= 7.5: exact in BF16, FP16 and float32.
std::vector<float> half_integer_bias(int64_t N, uint64_t seed) {
  std::vector<float> bias = octet::testing::random_small_integers(static_cast<size_t>(N), seed, 15);
  for (float& b : bias) b *= 0.5f;
  return bias;
}

// The operand types of the epilogue tests, each with the bias type its linear layers give it: BF16, FP16 and
// float32 products, and E4M3 where the GPU has FP8 tensor cores.
std::vector<std::pair<GemmType, GemmType>> epilogue_types() {
  std::vector<std::pair<GemmType, GemmType>> types = {
      {GemmType::bf16, GemmType::f32}, {GemmType::f16, GemmType::f32}, {GemmType::f32, GemmType::f32}};
  if (octet::cuda::has_fp8_tensor_cores(octet::cuda::device_info(0))) {
    types.emplace_back(GemmType::e4m3, GemmType::bf16);
  }
  return types;
}

// An [M, N, K] product of `type` operands scaled by a power of two: through the two FP8 scales, else alpha.
Case scaled_case(GemmType type, int64_t M, int64_t N, int64_t K, float a_scale_inv, float b_scale_inv) {
  Case c;
  c.a_type = c.b_type = type;
  c.M = M;
  c.N = N;
  c.K = K;
  if (octet::cuda::is_fp8(type)) {
    c.a_scale_inv = a_scale_inv;
    c.b_scale_inv = b_scale_inv;
  } else {
    c.alpha = a_scale_inv * b_scale_inv;
  }
  return c;
}

TEST(GemmBias, EpilogueAddsTheBiasExactly) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine;
  const int64_t M = 48, N = 32, K = 64;  // |sum| <= 64 * 49 = 3136
  const std::vector<float> x_a = octet::testing::random_small_integers(static_cast<size_t>(M * K), 21, 7);
  const std::vector<float> x_b = octet::testing::random_small_integers(static_cast<size_t>(N * K), 22, 7);
  uint64_t seed = 700;
  int64_t biased_runs = 0;
  for (const auto& [operand_type, bias_type] : epilogue_types()) {
    for (const bool fast : {false, true}) {
      if (fast && !octet::cuda::is_fp8(operand_type)) continue;
      SCOPED_TRACE(::testing::Message() << octet::cuda::gemm_type_name(operand_type) << " operands, "
                                        << octet::cuda::gemm_type_name(bias_type) << " bias"
                                        << (fast ? ", fast accumulation" : ""));
      const HostOperand a = make_operand(operand_type, M, K, false, 0, x_a);
      const HostOperand b = make_operand(operand_type, N, K, false, 0, x_b);
      Case c = scaled_case(operand_type, M, N, K, 2.0f, 0.25f);
      c.fast_accumulation = fast;
      const double alpha_scale = static_cast<double>(c.alpha) * c.a_scale_inv * c.b_scale_inv;
      // The same shape without the bias first: a cached plan shared by the two would show in one of them.
      const Reference plain = reference_product(a, b, alpha_scale, {});
      const Outcome unbiased = run_case(engine, c, a, b, {});
      ASSERT_EQ(unbiased.d, plain.expected) << "without a bias";

      c.bias = half_integer_bias(N, seed++);
      c.bias_type = bias_type;
      GemmProblem described;
      described.bias = c.bias.data();
      described.bias_type = bias_type;
      EXPECT_NE(octet::cuda::describe(described).find("bias"), std::string::npos);
      const Reference ref = reference_product(a, b, alpha_scale, {}, c.bias);
      const size_t plans_before = engine.cached_plans();
      const Outcome biased = run_case(engine, c, a, b, {});
      ++biased_runs;
      EXPECT_EQ(engine.cached_plans(), plans_before + 1) << "a biased product has a plan of its own";
      ASSERT_EQ(biased.d, ref.expected) << "with a bias";
      EXPECT_NE(ref.expected, plain.expected) << "a bias that changes nothing proves nothing";
      EXPECT_TRUE(octet::testing::has_nonzero(biased.d));
      EXPECT_TRUE(biased.guards_intact) << "bytes outside D's [M, N] block were written";
    }
  }
  EXPECT_EQ(engine.counters().bias_epilogues, biased_runs);
}

// The addend epilogue (a linear layer adding its residual): D = alpha * scales * A B^T + bias + addend
// [M, N], with the addend in a buffer of its own that the product must leave as it was. Small integers
// again, so that every sum is exact whatever the order of the additions, and D must equal the reference bit
// for bit. Outputs are float32 (addends are refused with BF16 ones).
TEST(GemmAddend, EpilogueAddsTheAddendExactly) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine;
  const int64_t M = 48, N = 32, K = 64;
  const std::vector<float> x_a = octet::testing::random_small_integers(static_cast<size_t>(M * K), 31, 7);
  const std::vector<float> x_b = octet::testing::random_small_integers(static_cast<size_t>(N * K), 32, 7);
  uint64_t seed = 800;
  int64_t added_runs = 0;
  for (const auto& [operand_type, bias_type] : epilogue_types()) {
    for (const bool biased : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << octet::cuda::gemm_type_name(operand_type) << " operands" << (biased ? ", biased" : ""));
      const HostOperand a = make_operand(operand_type, M, K, false, 0, x_a);
      const HostOperand b = make_operand(operand_type, N, K, false, 0, x_b);
      Case c = scaled_case(operand_type, M, N, K, 0.5f, 4.0f);
      const double alpha_scale = static_cast<double>(c.alpha) * c.a_scale_inv * c.b_scale_inv;
      if (biased) {
        c.bias = half_integer_bias(N, seed++);
        c.bias_type = bias_type;
      }
      c.addend = octet::testing::random_small_integers(static_cast<size_t>(M * N), seed++, 1000);
      const Reference without = reference_product(a, b, alpha_scale, {}, c.bias);
      const Reference ref = reference_product(a, b, alpha_scale, c.addend, c.bias);
      const Outcome added = run_case(engine, c, a, b, {});
      ++added_runs;
      ASSERT_EQ(added.d, ref.expected) << "with an addend";
      EXPECT_NE(ref.expected, without.expected) << "an addend that changes nothing proves nothing";
      EXPECT_TRUE(added.guards_intact)
          << "the addend changed, or bytes outside D's [M, N] block were written";
    }
  }
  EXPECT_EQ(engine.counters().addend_epilogues, added_runs);

  // Refused clearly: with a BF16 output, and with accumulation.
  GemmProblem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a_type = p.b_type = GemmType::f32;
  p.a = p.b = reinterpret_cast<const void*>(uintptr_t{256});
  p.d = reinterpret_cast<float*>(uintptr_t{256});
  p.addend = reinterpret_cast<const float*>(uintptr_t{512});
  EXPECT_EQ(engine.can_implement(p), "");
  p.accumulate = true;
  EXPECT_NE(engine.can_implement(p).find("accumulates"), std::string::npos) << engine.can_implement(p);
  p.accumulate = false;
  p.d = nullptr;
  p.a_type = p.b_type = GemmType::bf16;
  p.d_bf16 = reinterpret_cast<__nv_bfloat16*>(uintptr_t{256});
  EXPECT_NE(engine.can_implement(p).find("float32 output"), std::string::npos) << engine.can_implement(p);
}

// ----------------------------------------------------------------------------------------------------------
// BF16, FP16, float32 and TF32: every stored layout, odd shapes, accumulation.

using HighPrecisionCase = std::tuple<GemmType, bool, bool>;  // type, a_transposed, b_transposed

class HighPrecisionGemm : public ::testing::TestWithParam<HighPrecisionCase> {};

TEST_P(HighPrecisionGemm, MatchesFloat64Reference) {
  SKIP_WITHOUT_GPU();
  const auto [type, a_transposed, b_transposed] = GetParam();
  GemmEngine engine;
  uint64_t seed = 300;
  int64_t runs = 0;
  for (const Shape s :
       {Shape{13, 7, 5}, Shape{37, 48, 64}, Shape{128, 96, 160}, Shape{1, 1, 1}, Shape{3, 1, 257}}) {
    for (const bool accumulate : {false, true}) {
      for (const bool bf16_output : {false, true}) {
        if (bf16_output && type != GemmType::bf16) continue;
        Case c;
        c.a_type = c.b_type = type;
        c.M = s.M;
        c.N = s.N;
        c.K = s.K;
        c.a_transposed = a_transposed;
        c.b_transposed = b_transposed;
        c.accumulate = accumulate;
        c.bf16_output = bf16_output;
        c.alpha = accumulate ? 0.5f : 1.0f;
        check_case(engine, c, seed++);
        ++runs;
      }
    }
  }
  const octet::cuda::GemmCounters& counters = engine.counters();
  const int64_t of_type = type == GemmType::bf16  ? counters.bf16
                          : type == GemmType::f16 ? counters.f16
                          : type == GemmType::f32 ? counters.f32
                                                  : counters.tf32;
  EXPECT_EQ(of_type, runs);
  EXPECT_EQ(counters.fp8(), 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HighPrecisionGemm,
                         ::testing::Combine(::testing::Values(GemmType::f32, GemmType::tf32, GemmType::bf16,
                                                              GemmType::f16),
                                            ::testing::Bool(), ::testing::Bool()),
                         [](const auto& test_info) {
                           return std::string(octet::cuda::gemm_type_name(std::get<0>(test_info.param))) +
                                  (std::get<1>(test_info.param) ? "_At" : "_A") +
                                  (std::get<2>(test_info.param) ? "_Bt" : "_B");
                         });

// Row strides wider than the rows: operands and output as column slices of wider matrices. The padding of the
// operands holds NaN codes and that of D sentinels, so a stride mistake shows.
TEST(GemmLayout, LeadingDimensions) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine;
  Case c;
  c.a_type = c.b_type = GemmType::bf16;
  c.M = 13;
  c.N = 7;
  c.K = 5;
  c.lda = 9;
  c.ldb = 8;
  c.ldd = 11;
  check_case(engine, c, 400);
  c.a_transposed = c.b_transposed = true;
  c.lda = 17;  // stored [K, M]
  c.ldb = 10;  // stored [K, N]
  c.accumulate = true;
  check_case(engine, c, 401);
  if (octet::cuda::has_fp8_tensor_cores(octet::cuda::device_info(0))) {
    Case f;
    f.a_type = f.b_type = GemmType::e4m3;
    f.M = 37;
    f.N = 48;
    f.K = 64;
    f.lda = 80;
    f.ldb = 96;
    f.ldd = 52;
    f.a_scale_inv = 0.01f;
    check_case(engine, f, 402);
  }
}

// The layouts of a linear layer's backward pass in BF16, the fallback for shapes FP8 cannot take:
// dx [BT, C] = dy [BT, OC] W [OC, C] and dW [OC, C] += dy^T x, from the stored tensors alone.
TEST(GemmLayout, LinearLayerBackward) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine;
  const int64_t BT = 19, C = 24, OC = 11;
  Case dgrad;
  dgrad.a_type = dgrad.b_type = GemmType::bf16;
  dgrad.M = BT;
  dgrad.N = C;
  dgrad.K = OC;
  dgrad.b_transposed = true;  // W stored [OC, C] = [K, N]
  check_case(engine, dgrad, 500);
  Case wgrad;
  wgrad.a_type = wgrad.b_type = GemmType::bf16;
  wgrad.M = OC;
  wgrad.N = C;
  wgrad.K = BT;
  wgrad.a_transposed = true;  // dy stored [BT, OC] = [K, M]
  wgrad.b_transposed = true;  // x stored [BT, C] = [K, N]
  wgrad.accumulate = true;
  check_case(engine, wgrad, 501);
}

// GemmAlgorithmChoice::timed: a new shape's algorithm is the fastest of the heuristic's candidates, each
// timed on the call's own operands, so the timed products write D over and over before the call's own. The
// call must still return its product once: D overwritten, the addend added once, and D accumulated into
// once (those plans are not timed). Small integers, so that every candidate's sums are exact and D must
// equal the reference bit for bit whichever candidate wins.
TEST(GemmAlgorithmChoiceTest, TimedPlansReturnTheirProductOnce) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine(GemmAlgorithmChoice::timed);
  EXPECT_EQ(engine.algorithm_choice(), GemmAlgorithmChoice::timed);
  const int64_t M = 256, N = 128, K = 64;
  const std::vector<float> x_a = octet::testing::random_small_integers(static_cast<size_t>(M * K), 41, 7);
  const std::vector<float> x_b = octet::testing::random_small_integers(static_cast<size_t>(N * K), 42, 7);
  uint64_t seed = 900;
  int64_t plans = 0, accumulating_plans = 0;
  for (const auto& [operand_type, bias_type] : epilogue_types()) {
    SCOPED_TRACE(::testing::Message() << octet::cuda::gemm_type_name(operand_type) << " operands");
    const HostOperand a = make_operand(operand_type, M, K, false, 0, x_a);
    const HostOperand b = make_operand(operand_type, N, K, false, 0, x_b);
    Case c = scaled_case(operand_type, M, N, K, 0.5f, 2.0f);
    const double alpha_scale = static_cast<double>(c.alpha) * c.a_scale_inv * c.b_scale_inv;

    c.bias = half_integer_bias(N, seed++);
    c.bias_type = bias_type;
    const Reference biased = reference_product(a, b, alpha_scale, {}, c.bias);
    ASSERT_EQ(run_case(engine, c, a, b, {}).d, biased.expected) << "overwriting D";
    ++plans;

    c.addend = octet::testing::random_small_integers(static_cast<size_t>(M * N), seed++, 1000);
    const Reference added = reference_product(a, b, alpha_scale, c.addend, c.bias);
    const Outcome with_addend = run_case(engine, c, a, b, {});
    ASSERT_EQ(with_addend.d, added.expected) << "adding the addend";
    EXPECT_TRUE(with_addend.guards_intact) << "the addend changed, or bytes outside D's block were written";
    ++plans;

    c.bias.clear();
    c.addend.clear();
    c.accumulate = true;
    const std::vector<float> d_before =
        octet::testing::random_small_integers(static_cast<size_t>(M * N), seed++, 1000);
    const Reference accumulated = reference_product(a, b, alpha_scale, d_before);
    ASSERT_EQ(run_case(engine, c, a, b, d_before).d, accumulated.expected) << "accumulating into D";
    ++plans;
    ++accumulating_plans;
  }
  const octet::cuda::GemmCounters& counters = engine.counters();
  EXPECT_EQ(counters.heuristic_queries, plans);
  EXPECT_EQ(counters.timed_plans, plans - accumulating_plans) << "every plan but the accumulating ones";
  EXPECT_LE(counters.timed_plans_not_first, counters.timed_plans);
  EXPECT_EQ(counters.total(), plans) << "the timed products are not counted as the engine's products";
}

// ----------------------------------------------------------------------------------------------------------
// The plan cache and the errors.

TEST(GemmEngineTest, RepeatedShapesQueryTheHeuristicOnce) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine;
  Case c;
  c.a_type = c.b_type = GemmType::bf16;
  c.M = 37;
  c.N = 48;
  c.K = 64;
  for (uint64_t i = 0; i < 3; ++i) check_case(engine, c, 600 + i);
  EXPECT_EQ(engine.counters().heuristic_queries, 1);
  EXPECT_EQ(engine.counters().timed_plans, 0) << "the heuristic's first answer is the default";
  EXPECT_EQ(engine.cached_plans(), 1u);
  c.accumulate = true;
  check_case(engine, c, 610);
  EXPECT_EQ(engine.counters().heuristic_queries, 2);
  EXPECT_EQ(engine.counters().bf16, 4);
  EXPECT_GT(engine.counters().flops, 0.0);
  engine.reset_counters();
  EXPECT_EQ(engine.counters().total(), 0);
  EXPECT_EQ(engine.cached_plans(), 2u);
}

TEST(GemmEngineTest, UnsupportedCombinationsAreInvalidInput) {
  SKIP_WITHOUT_GPU();
  GemmEngine engine;
  DeviceBuffer<float> buffer(size_t{1} << 16);
  const bool fp8 = octet::cuda::has_fp8_tensor_cores(octet::cuda::device_info(0));
  auto problem = [&](GemmType a, GemmType b, int64_t M, int64_t N, int64_t K) {
    GemmProblem p;
    p.M = M;
    p.N = N;
    p.K = K;
    p.a_type = a;
    p.b_type = b;
    p.a = buffer.data();
    p.b = buffer.data() + 4096;
    p.d = buffer.data() + 8192;
    return p;
  };
  auto expect_invalid = [&](const GemmProblem& p, const std::string& needle) {
    EXPECT_FALSE(engine.can_implement(p).empty()) << octet::cuda::describe(p);
    try {
      engine.run(p, nullptr);
      ADD_FAILURE() << "expected octet::Error for " << octet::cuda::describe(p);
    } catch (const octet::Error& e) {
      EXPECT_EQ(e.kind(), octet::ErrorKind::invalid_input) << e.what();
      const std::string message = e.what();
      EXPECT_NE(message.find(needle), std::string::npos) << message;
      EXPECT_NE(message.find("M="), std::string::npos) << "the message names the shape: " << message;
    }
  };
  expect_invalid(problem(GemmType::e5m2, GemmType::e5m2, 32, 32, 32), "E5M2 x E5M2");
  expect_invalid(problem(GemmType::bf16, GemmType::f16, 8, 8, 8), "same type");
  expect_invalid(problem(GemmType::e4m3, GemmType::bf16, 32, 32, 32), "FP8");
  GemmProblem bf16_out = problem(GemmType::f32, GemmType::f32, 8, 8, 8);
  bf16_out.d = nullptr;
  bf16_out.d_bf16 = reinterpret_cast<__nv_bfloat16*>(buffer.data() + 8192);
  expect_invalid(bf16_out, "BF16 output");
  GemmProblem scaled_bf16 = problem(GemmType::bf16, GemmType::bf16, 8, 8, 8);
  scaled_bf16.fast_accumulation = true;
  expect_invalid(scaled_bf16, "FP8 products only");
  if (fp8) {
    GemmProblem misaligned_scale = problem(GemmType::e4m3, GemmType::e4m3, 32, 32, 32);
    misaligned_scale.a_scale_inv = buffer.data() + 12288 + 1;
    expect_invalid(misaligned_scale, "scale pointers");
  }
  // The bias epilogue: never with accumulate, 16-byte aligned, and only of the types cuBLASLt takes.
  const void* bias = buffer.data() + 12288;
  GemmProblem accumulated_bias = problem(GemmType::bf16, GemmType::bf16, 8, 8, 8);
  accumulated_bias.bias = bias;
  accumulated_bias.accumulate = true;
  expect_invalid(accumulated_bias, "accumulates");
  GemmProblem misaligned_bias = problem(GemmType::bf16, GemmType::bf16, 8, 8, 8);
  misaligned_bias.bias = buffer.data() + 12288 + 2;
  expect_invalid(misaligned_bias, "bias pointer");
  GemmProblem f32_with_bf16_bias = problem(GemmType::f32, GemmType::f32, 8, 8, 8);
  f32_with_bf16_bias.bias = bias;
  f32_with_bf16_bias.bias_type = GemmType::bf16;
  expect_invalid(f32_with_bf16_bias, "float32 bias");
  GemmProblem bf16_output_f32_bias = problem(GemmType::bf16, GemmType::bf16, 8, 8, 8);
  bf16_output_f32_bias.d = nullptr;
  bf16_output_f32_bias.d_bf16 = reinterpret_cast<__nv_bfloat16*>(buffer.data() + 8192);
  bf16_output_f32_bias.bias = bias;
  bf16_output_f32_bias.bias_type = GemmType::f32;
  expect_invalid(bf16_output_f32_bias, "BF16 bias");
  if (fp8) {
    GemmProblem fp8_f32_bias = problem(GemmType::e4m3, GemmType::e4m3, 32, 32, 32);
    fp8_f32_bias.bias = bias;
    fp8_f32_bias.bias_type = GemmType::f32;
    expect_invalid(fp8_f32_bias, "BF16 bias");
    GemmProblem fp8_accumulated_bias = problem(GemmType::e4m3, GemmType::e4m3, 32, 32, 32);
    fp8_accumulated_bias.bias = bias;
    fp8_accumulated_bias.accumulate = true;
    expect_invalid(fp8_accumulated_bias, "accumulates");
    GemmProblem fp8_bf16_bias = problem(GemmType::e4m3, GemmType::e4m3, 32, 32, 32);
    fp8_bf16_bias.bias = bias;
    EXPECT_EQ(engine.can_implement(fp8_bf16_bias), "") << "the FP8 forward's product";
  }
  GemmProblem bf16_bias = problem(GemmType::bf16, GemmType::bf16, 8, 8, 8);
  bf16_bias.bias = bias;
  expect_invalid(bf16_bias, "float32 bias");
  GemmProblem f32_bias = problem(GemmType::bf16, GemmType::bf16, 8, 8, 8);
  f32_bias.bias = bias;
  f32_bias.bias_type = GemmType::f32;
  EXPECT_EQ(engine.can_implement(f32_bias), "") << "the BF16 forward's product";
  expect_invalid(problem(GemmType::f32, GemmType::f32, 8, 8, 0), "K positive");
  if (fp8) {
    expect_invalid(problem(GemmType::e4m3, GemmType::e4m3, 37, 48, 40), "multiples of 16");
    expect_invalid(problem(GemmType::e4m3, GemmType::e4m3, 37, 50, 64), "multiples of 16");
    GemmProblem transposed = problem(GemmType::e4m3, GemmType::e4m3, 32, 32, 32);
    transposed.b_transposed = true;
    expect_invalid(transposed, "K-major");
    GemmProblem misaligned = problem(GemmType::e4m3, GemmType::e4m3, 32, 32, 32);
    misaligned.a = reinterpret_cast<const uint8_t*>(buffer.data()) + 8;
    expect_invalid(misaligned, "16-byte");
  }
  EXPECT_TRUE(octet::cuda::fp8_shape_supported(37, 48, 64));
  EXPECT_FALSE(octet::cuda::fp8_shape_supported(48, 37, 64));
  EXPECT_FALSE(octet::cuda::fp8_shape_supported(48, 64, 37));
  EXPECT_EQ(engine.counters().total(), 0);
}

}  // namespace
