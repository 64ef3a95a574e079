// RMSNorm, SwiGLU and the rotary embedding (the op kinds of Llama-style blocks) on every tested backend
// against the CPU reference (harness: backend_ops_harness.h), over odd and prime shapes: RMSNorm's forward
// (out, rstd) and backward (dinp, dweight), SwiGLU's forward and backward, the rotary embedding forward and
// inverse (bit for bit: the same roundings in the same order) and their round trip. Then the CUDA backend's
// bf16 storage against its own float32 results: a bf16 output is the float32 one rounded once, and a bf16
// input gives the results of its float32 values, bit for bit. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_ops_harness.h"
#include "octet/numerics/minifloat.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::Activation;
using octet::Backend;
using octet::ConstTensorView;
using octet::Dtype;
using octet::Normalization;
using octet::TensorView;
using octet::testing::random_normal;

std::vector<double> none() {
  return {};
}

// Where results are subnormal a rounding costs up to half a subnormal step: a term of 2^-126 covers it.
const float kSubnormalStep = std::ldexp(1.0f, -126);

// --- RMSNorm ---

// {1100, 2048}: Llama 3 1B's width, with more rows than the backward's blocks (a block adds several rows'
// weight gradients); {5, 8192}: the widest rows the backward holds in registers; {3, 8195} and {2, 12288}:
// the wider rows' kernel, one by one and by four.
const std::vector<std::pair<int64_t, int64_t>> kNormShapes = {{1, 1},    {13, 7},   {74, 24},     {37, 768},
                                                              {3, 3221}, {256, 64}, {1100, 2048}, {5, 8192},
                                                              {3, 8195}, {2, 12288}};

std::vector<float> rstd_of(const std::vector<float>& x, int64_t N, int64_t C) {
  std::vector<float> rstd;
  for (int64_t n = 0; n < N; ++n) {
    double squares = 0.0;
    for (int64_t i = 0; i < C; ++i) squares += static_cast<double>(x[n * C + i]) * x[n * C + i];
    rstd.push_back(static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(C) + 1e-5)));
  }
  return rstd;
}

std::vector<OpCase> rmsnorm_forward_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, C] : kNormShapes) {
    OpCase c{"rmsnorm_forward", shape_label({{"N", N}, {"C", C}}), {}, {}, {}};
    const uint64_t seed = seed_of(c.op, c.shape);
    const std::vector<float> x = random_normal(N * C, seed, 2.0f), w = random_normal(C, seed + 1);
    const std::vector<float> rstd = rstd_of(x, N, C);
    // rstd's relative error ((C+4) 2^-24) through |x| |w|, and two products.
    std::vector<float> out_terms(static_cast<size_t>(N * C));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < C; ++i) out_terms[n * C + i] = std::fabs(x[n * C + i] * w[i]) * rstd[n];
    }
    c.operands = {output("out", N * C), output("rstd", N), input("inp", x), input("weight", w)};
    c.run = [N, C](Backend& b, const std::vector<void*>& p) {
      b.normalization_forward(Normalization::rmsnorm, TensorView(floats_at(p, 0), {N, C}), nullptr,
                              floats_at(p, 1), ConstTensorView(floats_at(p, 2), {N, C}), floats_at(p, 3),
                              nullptr, {});
      return none();
    };
    c.checks = {close("rstd", C + 4, {}, "a float64 sum of C squares, then sqrt and a division"),
                close("out", C + 6, out_terms, "rstd's error and two float32 products, times |x w| rstd")};
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<OpCase> rmsnorm_backward_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, C] : kNormShapes) {
    OpCase c{"rmsnorm_backward", shape_label({{"N", N}, {"C", C}}), {}, {}, {}};
    const uint64_t seed = seed_of(c.op, c.shape);
    const std::vector<float> x = random_normal(N * C, seed), w = random_normal(C, seed + 1);
    const std::vector<float> dout = random_normal(N * C, seed + 2);
    const std::vector<float> dinp = random_normal(N * C, seed + 3), dw = random_normal(C, seed + 4);
    const std::vector<float> rstd = rstd_of(x, N, C);
    std::vector<float> dinp_terms(dinp.size()), dw_terms(C);
    for (int64_t i = 0; i < C; ++i) dw_terms[i] = std::fabs(dw[i]);
    for (int64_t n = 0; n < N; ++n) {
      double mean_dnorm_norm = 0.0;
      for (int64_t i = 0; i < C; ++i) {
        const double norm = x[n * C + i] * rstd[n], dnorm = w[i] * dout[n * C + i];
        mean_dnorm_norm += std::fabs(dnorm * norm) / static_cast<double>(C);
        dw_terms[i] += static_cast<float>(std::fabs(norm * dout[n * C + i]));
      }
      for (int64_t i = 0; i < C; ++i) {
        const double norm = x[n * C + i] * rstd[n], dnorm = w[i] * dout[n * C + i];
        dinp_terms[n * C + i] = static_cast<float>(
            std::fabs(dinp[n * C + i]) + rstd[n] * (std::fabs(dnorm) + std::fabs(norm) * mean_dnorm_norm));
      }
    }
    c.operands = {in_out("dinp", dinp), in_out("dweight", dw), input("dout", dout),
                  input("inp", x),      input("weight", w),    input("rstd", rstd)};
    c.run = [N, C](Backend& b, const std::vector<void*>& p) {
      b.normalization_backward(Normalization::rmsnorm, floats_at(p, 0), floats_at(p, 1), nullptr,
                               ConstTensorView(floats_at(p, 2), {N, C}), floats_at(p, 3), floats_at(p, 4),
                               nullptr, floats_at(p, 5));
      return none();
    };
    c.checks = {close("dweight", N + 4, dw_terms, "a sum over N rows of norm * dout (norm: 2 roundings)"),
                close("dinp", C + 6, dinp_terms, "a row sum of C terms, carried through rstd")};
    cases.push_back(std::move(c));
  }
  return cases;
}

// --- SwiGLU ---

// The CPU's std::exp and CUDA's expf (each within 2 ulps), a division and products.
constexpr int64_t kSwigluRoundings = 8;
const std::vector<std::pair<int64_t, int64_t>> kSwigluShapes = {
    {1, 1}, {7, 13}, {33, 96}, {5, 3221}, {64, 256}};

std::vector<OpCase> swiglu_cases() {
  std::vector<OpCase> cases;
  for (const auto& [N, C] : kSwigluShapes) {
    const std::string label = shape_label({{"N", N}, {"C", C}});
    const uint64_t seed = seed_of("swiglu", label);
    const std::vector<float> inp = random_normal(N * 2 * C, seed, 3.0f),
                             dout = random_normal(N * C, seed + 1);
    std::vector<float> out_terms(static_cast<size_t>(N * C)), dinp_terms(inp.size());
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < C; ++i) {
        const float g = std::fabs(inp[n * 2 * C + i]), u = std::fabs(inp[n * 2 * C + C + i]);
        const float d = std::fabs(dout[n * C + i]);
        out_terms[n * C + i] = g * u + kSubnormalStep;
        dinp_terms[n * 2 * C + i] = d * u * (1.0f + g) + kSubnormalStep;
        dinp_terms[n * 2 * C + C + i] = d * g + kSubnormalStep;
      }
    }
    OpCase forward{"swiglu_forward", label, {output("out", N * C), input("inp", inp)}, {}, {}};
    forward.run = [N, C](Backend& b, const std::vector<void*>& p) {
      b.activation_forward(Activation::swiglu, TensorView(floats_at(p, 0), {N, C}),
                           ConstTensorView(floats_at(p, 1), {N, 2 * C}), {});
      return none();
    };
    forward.checks = {close("out", kSwigluRoundings, out_terms, "exp's ulps and a few roundings, of |g u|")};
    cases.push_back(std::move(forward));
    OpCase backward{"swiglu_backward",
                    label,
                    {output("dinp", N * 2 * C), input("inp", inp), input("dout", dout)},
                    {},
                    {}};
    backward.run = [N, C](Backend& b, const std::vector<void*>& p) {
      b.activation_backward(Activation::swiglu, TensorView(floats_at(p, 0), {N, 2 * C}),
                            ConstTensorView(floats_at(p, 1), {N, 2 * C}),
                            ConstTensorView(floats_at(p, 2), {N, C}), nullptr, {});
      return none();
    };
    backward.checks = {close("dinp", kSwigluRoundings + 4, dinp_terms,
                             "exp's ulps and the sigmoid's roundings, of the terms of each gradient")};
    cases.push_back(std::move(backward));
  }
  return cases;
}

// --- rotary embedding ---

struct RotaryShape {
  int64_t B, T, W, heads, hs;
};
// Head sizes 2, 8 (pairs one by one or by four), 64 and 128; rows wider than the rotated heads (qkv's v).
const std::vector<RotaryShape> kRotaryShapes = {
    {1, 1, 2, 1, 2}, {2, 7, 24, 2, 8}, {3, 37, 20, 2, 6}, {2, 33, 384, 5, 64}, {1, 17, 512, 3, 128}};

// cos and sin of position t's angles t / 10000^(2i / hs), as a model's table.
std::vector<float> rotary_table(int64_t T, int64_t hs) {
  std::vector<float> table(static_cast<size_t>(T * hs));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < hs / 2; ++i) {
      const double angle =
          static_cast<double>(t) / std::pow(10000.0, 2.0 * static_cast<double>(i) / static_cast<double>(hs));
      table[t * hs + i] = static_cast<float>(std::cos(angle));
      table[t * hs + hs / 2 + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

std::vector<OpCase> rotary_cases() {
  std::vector<OpCase> cases;
  for (const RotaryShape& s : kRotaryShapes) {
    for (const bool inverse : {false, true}) {
      OpCase c{inverse ? "rotary_embedding inverse" : "rotary_embedding",
               shape_label({{"B", s.B}, {"T", s.T}, {"W", s.W}, {"heads", s.heads}, {"hs", s.hs}}),
               {},
               {},
               {}};
      const std::vector<float> x = random_normal(s.B * s.T * s.W, seed_of(c.op, c.shape));
      c.operands = {in_out("x", x), input("table", rotary_table(s.T + 3, s.hs))};
      c.run = [s, inverse](Backend& b, const std::vector<void*>& p) {
        b.rotary_embedding(TensorView(floats_at(p, 0), {s.B, s.T, s.W}),
                           ConstTensorView(floats_at(p, 1), {s.T + 3, s.hs}), s.heads, inverse);
        return none();
      };
      c.checks = {exact("x", "two products and a sum per element, rounded as the reference rounds them")};
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

TEST(BackendOps, RmsNormForward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(rmsnorm_forward_cases());
}

TEST(BackendOps, RmsNormBackward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(rmsnorm_backward_cases());
}

TEST(BackendOps, SwigluForwardAndBackward) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(swiglu_cases());
}

TEST(BackendOps, RotaryEmbedding) {
  SKIP_WITHOUT_TESTED_BACKEND();
  run_all(rotary_cases());
}

// ---------------------------------------------------------------------------------------------------------
// The CUDA backend's own storage types, against its own float32 results.

uint16_t bf16_bits(float x) {
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(octet::round_to_bf16(x)) >> 16);
}
std::vector<uint16_t> bf16_of(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = bf16_bits(x[i]);
  return b;
}
std::vector<float> widened(const std::vector<uint16_t>& b) {
  std::vector<float> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) x[i] = std::bit_cast<float>(static_cast<uint32_t>(b[i]) << 16);
  return x;
}

// A device buffer of the backend holding `values` (bytes); read back as T.
struct Device {
  Backend& backend;
  std::unique_ptr<octet::Buffer> buffer;
  template <typename T>
  Device(Backend& b, const std::vector<T>& values)
      : backend(b), buffer(b.allocate(values.size() * sizeof(T))) {
    b.copy_from_host(buffer->data(), values.data(), values.size() * sizeof(T));
  }
  void* data() { return buffer->data(); }
  float* floats() { return buffer->floats(); }
  template <typename T>
  std::vector<T> read(size_t n) {
    std::vector<T> v(n);
    backend.copy_to_host(v.data(), buffer->data(), n * sizeof(T));
    return v;
  }
};

::testing::AssertionResult same_bits(const std::vector<uint16_t>& a, const std::vector<uint16_t>& e,
                                     const std::string& what) {
  for (size_t i = 0; i < e.size(); ++i) {
    if (a[i] != e[i]) {
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is bf16 0x" << std::hex << a[i] << ", expected 0x" << e[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaStorage, RmsNormBf16OutputAndGradient) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const auto& [N, C] : kNormShapes) {
    SCOPED_TRACE(shape_label({{"N", N}, {"C", C}}));
    const uint64_t seed = seed_of("rmsnorm bf16", shape_label({{"N", N}, {"C", C}}));
    const std::vector<float> x = random_normal(N * C, seed, 2.0f), w = random_normal(C, seed + 1);
    const size_t n = static_cast<size_t>(N * C);
    Device inp(*backend, x), weight(*backend, w), out(*backend, std::vector<float>(n)),
        out16(*backend, std::vector<uint16_t>(n)), rstd(*backend, std::vector<float>(N)),
        rstd16(*backend, std::vector<float>(N));
    backend->normalization_forward(Normalization::rmsnorm, TensorView(out.floats(), {N, C}), nullptr,
                                   rstd.floats(), ConstTensorView(inp.floats(), {N, C}), weight.floats(),
                                   nullptr, {});
    backend->normalization_forward(Normalization::rmsnorm, TensorView(out16.data(), Dtype::bf16, {N, C}),
                                   nullptr, rstd16.floats(), ConstTensorView(inp.floats(), {N, C}),
                                   weight.floats(), nullptr, {});
    const std::vector<float> f32 = out.read<float>(n);
    EXPECT_TRUE(same_bits(out16.read<uint16_t>(n), bf16_of(f32), "out in bf16"));
    EXPECT_TRUE(bits_equal_nan_agnostic(rstd16.read<float>(N), rstd.read<float>(N)));

    // The backward over a bf16 dout against the same values in float32.
    const std::vector<uint16_t> dout16 = bf16_of(random_normal(N * C, seed + 2));
    Device dout_bf16(*backend, dout16), dout_f32(*backend, widened(dout16));
    Device dinp_a(*backend, std::vector<float>(n)), dinp_b(*backend, std::vector<float>(n)),
        dw_a(*backend, std::vector<float>(C)), dw_b(*backend, std::vector<float>(C));
    backend->normalization_backward(Normalization::rmsnorm, dinp_a.floats(), dw_a.floats(), nullptr,
                                    ConstTensorView(dout_bf16.data(), Dtype::bf16, {N, C}), inp.floats(),
                                    weight.floats(), nullptr, rstd.floats());
    backend->normalization_backward(Normalization::rmsnorm, dinp_b.floats(), dw_b.floats(), nullptr,
                                    ConstTensorView(dout_f32.floats(), {N, C}), inp.floats(), weight.floats(),
                                    nullptr, rstd.floats());
    EXPECT_TRUE(bits_equal_nan_agnostic(dinp_a.read<float>(n), dinp_b.read<float>(n)));
    EXPECT_TRUE(bits_equal_nan_agnostic(dw_a.read<float>(C), dw_b.read<float>(C)));
    EXPECT_TRUE(octet::testing::has_nonzero(dw_a.read<float>(C)));
  }
}

TEST(CudaStorage, SwigluBf16InputsAndOutputs) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const auto& [N, C] : kSwigluShapes) {
    SCOPED_TRACE(shape_label({{"N", N}, {"C", C}}));
    const uint64_t seed = seed_of("swiglu bf16", shape_label({{"N", N}, {"C", C}}));
    const std::vector<uint16_t> inp16 = bf16_of(random_normal(N * 2 * C, seed, 3.0f));
    const std::vector<uint16_t> dout16 = bf16_of(random_normal(N * C, seed + 1));
    const size_t n = static_cast<size_t>(N * C);
    Device inp_bf16(*backend, inp16), inp_f32(*backend, widened(inp16)), dout_bf16(*backend, dout16),
        dout_f32(*backend, widened(dout16));
    Device out_f32(*backend, std::vector<float>(n)), out_from_bf16(*backend, std::vector<float>(n)),
        out_bf16(*backend, std::vector<uint16_t>(n));
    const ConstTensorView x32(inp_f32.floats(), {N, 2 * C}), x16(inp_bf16.data(), Dtype::bf16, {N, 2 * C});
    backend->activation_forward(Activation::swiglu, TensorView(out_f32.floats(), {N, C}), x32, {});
    backend->activation_forward(Activation::swiglu, TensorView(out_from_bf16.floats(), {N, C}), x16, {});
    backend->activation_forward(Activation::swiglu, TensorView(out_bf16.data(), Dtype::bf16, {N, C}), x16,
                                {});
    const std::vector<float> f32 = out_f32.read<float>(n);
    EXPECT_TRUE(bits_equal_nan_agnostic(out_from_bf16.read<float>(n), f32));
    EXPECT_TRUE(same_bits(out_bf16.read<uint16_t>(n), bf16_of(f32), "out in bf16"));

    Device dinp_f32(*backend, std::vector<float>(2 * n)), dinp_from_bf16(*backend, std::vector<float>(2 * n)),
        dinp_bf16(*backend, std::vector<uint16_t>(2 * n));
    backend->activation_backward(Activation::swiglu, TensorView(dinp_f32.floats(), {N, 2 * C}), x32,
                                 ConstTensorView(dout_f32.floats(), {N, C}), nullptr, {});
    backend->activation_backward(Activation::swiglu, TensorView(dinp_from_bf16.floats(), {N, 2 * C}), x16,
                                 ConstTensorView(dout_bf16.data(), Dtype::bf16, {N, C}), nullptr, {});
    backend->activation_backward(Activation::swiglu, TensorView(dinp_bf16.data(), Dtype::bf16, {N, 2 * C}),
                                 x16, ConstTensorView(dout_bf16.data(), Dtype::bf16, {N, C}), nullptr, {});
    const std::vector<float> d32 = dinp_f32.read<float>(2 * n);
    EXPECT_TRUE(bits_equal_nan_agnostic(dinp_from_bf16.read<float>(2 * n), d32));
    EXPECT_TRUE(same_bits(dinp_bf16.read<uint16_t>(2 * n), bf16_of(d32), "dinp in bf16"));
    EXPECT_TRUE(octet::testing::has_nonzero(d32));

    // In place (dinp over inp), as the reference allows: the same values.
    backend->activation_backward(Activation::swiglu, TensorView(inp_f32.floats(), {N, 2 * C}), x32,
                                 ConstTensorView(dout_f32.floats(), {N, C}), nullptr, {});
    EXPECT_TRUE(bits_equal_nan_agnostic(inp_f32.read<float>(2 * n), d32));
  }
}

// bf16 x: the rotation of its float32 values, rounded once; and the inverse undoes the forward within the
// roundings of the two passes.
TEST(CudaStorage, RotaryEmbeddingBf16AndRoundTrip) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto backend = make_tested_backend();
  for (const RotaryShape& s : kRotaryShapes) {
    SCOPED_TRACE(shape_label({{"T", s.T}, {"W", s.W}, {"hs", s.hs}}));
    const size_t n = static_cast<size_t>(s.B * s.T * s.W);
    const std::vector<float> x = random_normal(n, seed_of("rotary bf16", std::to_string(s.W)));
    const std::vector<uint16_t> x16 = bf16_of(x);
    Device table(*backend, rotary_table(s.T, s.hs)), a16(*backend, x16), a32(*backend, widened(x16)),
        trip(*backend, x);
    const ConstTensorView t(table.floats(), {s.T, s.hs});
    backend->rotary_embedding(TensorView(a16.data(), Dtype::bf16, {s.B, s.T, s.W}), t, s.heads, false);
    backend->rotary_embedding(TensorView(a32.floats(), {s.B, s.T, s.W}), t, s.heads, false);
    EXPECT_TRUE(same_bits(a16.read<uint16_t>(n), bf16_of(a32.read<float>(n)), "x in bf16"));

    backend->rotary_embedding(TensorView(trip.floats(), {s.B, s.T, s.W}), t, s.heads, false);
    backend->rotary_embedding(TensorView(trip.floats(), {s.B, s.T, s.W}), t, s.heads, true);
    // A rotated element's error scales with its pair's magnitude (|x_i| + |x_partner|): a small value whose
    // partner is large comes back within the partner's roundings, not its own.
    std::vector<float> magnitude(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % s.W, within = col % s.hs, half = s.hs / 2;
      const bool rotated = col / s.hs < s.heads;
      const size_t partner = within < half ? i + static_cast<size_t>(half) : i - static_cast<size_t>(half);
      magnitude[i] = 2.0f * (std::fabs(x[i]) + (rotated ? std::fabs(x[partner]) : 0.0f)) + 1e-30f;
    }
    octet::testing::CompareOptions options;
    options.reduction_length = 8;  // two rotations of two products and a sum each, |cos| + |sin| <= 1.5
    options.magnitude = magnitude;
    EXPECT_TRUE(close_with_report("rotary round trip", trip.read<float>(n), x, options));
  }
}

}  // namespace
