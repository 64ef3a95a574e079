// The producer-fused FP8 casts (src/backends/cuda/fused.h) and the ops' bf16 outputs against the unfused
// ops they replace, all on the device: cuda::layernorm_forward / gelu_forward / gelu_backward / adamw_update,
// then cast_amax with the same scale (and, for the GELU backward, bias_backward of its result); the gradient
// cast that sums the bias gradient (bias_backward_cast) against bias_backward then cast_amax; and the SwiGLU
// backward's cast against swiglu_backward then cast_amax, or bias_backward_cast with the bias gradient. Codes
// and transposed codes must be the same bytes; out, mean, rstd, dinp, params, m and v the same bits;
// CastResults and scale_inv the same; the bias gradients, summed in another order, within the float32
// tolerance of a float64 sum. Inputs are seeded, with planted values that saturate and underflow, over odd
// and prime shapes, both formats, a scale that is not a power of two, aligned and unaligned pointers. Every
// output sits between guard bytes that must survive; an output passed as null must stay untouched; every
// fused call runs twice and must give the same bits. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "compare.h"
#include "fused.h"
#include "octet/backend/cuda_backend.h"
#include "octet/check.h"
#include "octet/cuda/cast.h"
#include "octet/cuda/device.h"
#include "octet/numerics/format.h"
#include "ops.h"
#include "random.h"

namespace {

using octet::ConstTensorView;
using octet::Dtype;
using octet::cuda::CastResults;
using octet::cuda::FusedCast;

#define SKIP_WITHOUT_GPU() \
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

constexpr size_t kGuardBytes = 256;  // before and after every buffer; a multiple of 256 keeps alignment
constexpr uint8_t kSentinel = 0xA5;
constexpr float kScale = 3.7f;    // not a power of two: the scaled values are rounded before the cast
constexpr float kHuge = 1.0e6f;   // saturates both formats at kScale
constexpr float kTiny = 1.0e-9f;  // underflows both formats at kScale

// `count` elements of T in device memory, `offset_bytes` past a guard zone and followed by another. Every
// byte starts as the sentinel, so that an element left unwritten shows as well as a write out of bounds.
template <typename T>
class Guarded {
 public:
  explicit Guarded(size_t count, size_t offset_bytes = 0)
      : count_(count), begin_(kGuardBytes + offset_bytes), bytes_(begin_ + count * sizeof(T) + kGuardBytes) {
    bytes_.fill_bytes(kSentinel);
  }
  T* data() { return reinterpret_cast<T*>(bytes_.data() + begin_); }

  void upload(std::span<const T> values) {
    ASSERT_EQ(values.size(), count_);
    if (!values.empty()) {
      OCTET_CUDA_CHECK(cudaMemcpy(data(), values.data(), values.size_bytes(), cudaMemcpyHostToDevice));
      // From pageable memory cudaMemcpy may return before the copy lands, and the kernels under test run on
      // a non-blocking stream that does not wait for it: wait here.
      OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  std::vector<T> read() const {
    const std::vector<uint8_t> raw = all_bytes();
    std::vector<T> out(count_);
    if (count_ > 0) std::memcpy(out.data(), raw.data() + begin_, count_ * sizeof(T));
    return out;
  }
  ::testing::AssertionResult guards_intact(const std::string& name) const {
    const std::vector<uint8_t> raw = all_bytes();
    const size_t end = begin_ + count_ * sizeof(T);
    for (size_t i = 0; i < raw.size(); ++i) {
      if ((i < begin_ || i >= end) && raw[i] != kSentinel) {
        return ::testing::AssertionFailure() << name << ": guard byte " << i << " (payload [" << begin_
                                             << ", " << end << ")) was overwritten with " << int{raw[i]};
      }
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult untouched(const std::string& name) const {
    const std::vector<uint8_t> raw = all_bytes();
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != kSentinel) {
        return ::testing::AssertionFailure() << name << " should not have been written, byte " << i << " was";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::vector<uint8_t> all_bytes() const {
    std::vector<uint8_t> raw(bytes_.size());
    bytes_.copy_to_host(raw);
    return raw;
  }
  size_t count_;
  size_t begin_;
  octet::cuda::DeviceBuffer<uint8_t> bytes_;
};

uint32_t bits(float x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Bit for bit, NaNs included (both sides run the same device arithmetic, so even NaN payloads agree).
template <typename T>
::testing::AssertionResult identical(const std::vector<T>& actual, const std::vector<T>& expected,
                                     const std::string& what) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << actual.size() << " elements against " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0) {
      std::ostringstream detail;
      if constexpr (std::is_same_v<T, float>) {
        detail << actual[i] << " (0x" << std::hex << bits(actual[i]) << ") against " << std::dec
               << expected[i] << " (0x" << std::hex << bits(expected[i]) << ")";
      } else {
        detail << int{actual[i]} << " against " << int{expected[i]};
      }
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << actual.size() << " differs: " << detail.str();
    }
  }
  return ::testing::AssertionSuccess();
}

// What one cast wrote.
struct CastDownload {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> transposed;  // empty when not asked for
  CastResults results{};
  float scale_inv = 0.0f;
};

// The device outputs of one cast (fused or cast_amax), each guarded; results start as sentinel bytes, so the
// zeroing is tested too.
class CastSlots {
 public:
  CastSlots(size_t n, size_t code_offset_bytes)
      : codes_(n, code_offset_bytes), transposed_(n, code_offset_bytes) {}

  FusedCast fused(Dtype format, const float* scale, bool transposed) {
    FusedCast c;
    c.format = format;
    c.scale = scale;
    c.output = codes_.data();
    c.output_transposed = transposed ? transposed_.data() : nullptr;
    c.scale_inv = scale_inv_.data();
    c.results = results_.data();
    return c;
  }
  void cast_amax(const float* input, int64_t rows, int64_t cols, Dtype format, const float* scale,
                 bool transposed, cudaStream_t stream) {
    octet::cuda::CastAmaxArguments a;
    a.input = input;
    a.rows = rows;
    a.cols = cols;
    a.format = format;
    a.scale = scale;
    a.output = codes_.data();
    a.output_transposed = transposed ? transposed_.data() : nullptr;
    a.scale_inv = scale_inv_.data();
    a.results = results_.data();
    octet::cuda::cast_amax(a, stream);
  }
  // Also checks the guards, and that the transposed codes were left alone when not asked for.
  CastDownload read(bool transposed) const {
    CastDownload d;
    d.codes = codes_.read();
    EXPECT_TRUE(codes_.guards_intact("codes"));
    if (transposed) {
      d.transposed = transposed_.read();
      EXPECT_TRUE(transposed_.guards_intact("transposed codes"));
    } else {
      EXPECT_TRUE(transposed_.untouched("transposed codes"));
    }
    d.results = results_.read()[0];
    EXPECT_TRUE(results_.guards_intact("results"));
    d.scale_inv = scale_inv_.read()[0];
    EXPECT_TRUE(scale_inv_.guards_intact("scale_inv"));
    return d;
  }

 private:
  Guarded<uint8_t> codes_;
  Guarded<uint8_t> transposed_;
  Guarded<float> scale_inv_{1};
  Guarded<CastResults> results_{1};
};

void expect_same_cast(const CastDownload& actual, const CastDownload& expected) {
  EXPECT_TRUE(identical(actual.codes, expected.codes, "codes"));
  EXPECT_TRUE(identical(actual.transposed, expected.transposed, "transposed codes"));
  EXPECT_EQ(bits(actual.results.amax), bits(expected.results.amax))
      << "amax " << actual.results.amax << " against " << expected.results.amax;
  EXPECT_EQ(actual.results.saturated, expected.results.saturated) << "saturated";
  EXPECT_EQ(actual.results.underflowed, expected.results.underflowed) << "underflowed";
  EXPECT_EQ(actual.results.nan_inputs, expected.results.nan_inputs) << "nan_inputs";
  EXPECT_EQ(actual.results.nonzero, expected.results.nonzero) << "nonzero";
  EXPECT_EQ(bits(actual.scale_inv), bits(expected.scale_inv)) << "scale_inv";
}

// One scale on the device, shared by the fused and the unfused cast.
struct DeviceScale {
  Guarded<float> value{1};
  DeviceScale() { value.upload(std::span<const float>(&kScale, 1)); }
  const float* data() { return value.data(); }
};

// What a case varies besides its shape.
struct Variant {
  Dtype format = Dtype::e4m3;
  bool transposed = true;
  bool write_out = true;    // LayerNorm and GELU: out given, or null
  size_t float_offset = 0;  // bytes: 4 makes every float operand unaligned for float4 loads
  size_t code_offset = 0;   // bytes: 1 makes the fused codes unaligned for 32-bit stores
  bool plant_nan = false;
  uint64_t seed = 1;
};

std::vector<Variant> sweep_variants() {
  std::vector<Variant> variants;
  for (const Dtype format : {Dtype::e4m3, Dtype::e5m2}) {
    for (const bool transposed : {true, false}) {
      for (const bool write_out : {true, false}) {
        Variant v;
        v.format = format;
        v.transposed = transposed;
        v.write_out = write_out;
        variants.push_back(v);
      }
    }
  }
  return variants;
}

std::vector<Variant> unaligned_variants() {
  std::vector<Variant> variants;
  for (const Dtype format : {Dtype::e4m3, Dtype::e5m2}) {
    for (const size_t float_offset : {size_t{0}, size_t{4}}) {
      Variant v;
      v.format = format;
      v.float_offset = float_offset;
      v.code_offset = 1;
      variants.push_back(v);
    }
  }
  return variants;
}

std::vector<Variant> nan_variants() {
  std::vector<Variant> variants;
  for (const Dtype format : {Dtype::e4m3, Dtype::e5m2}) {
    for (const bool transposed : {true, false}) {
      Variant v;
      v.format = format;
      v.transposed = transposed;
      v.plant_nan = true;
      variants.push_back(v);
    }
  }
  return variants;
}

std::string describe(const char* op, int64_t rows, int64_t cols, const Variant& v) {
  std::ostringstream s;
  s << op << " [" << rows << ", " << cols << "] " << octet::dtype_name(v.format)
    << (v.transposed ? " +transposed" : "") << (v.write_out ? " +out" : " out=null") << " float_offset "
    << v.float_offset << " code_offset " << v.code_offset << (v.plant_nan ? " +NaN" : "") << " seed "
    << v.seed;
  return s.str();
}

// With the planted values in place, a big enough cast must have seen both edges.
void expect_edges_seen(const CastResults& r, size_t n, const Variant& v) {
  // A tiny tensor may be all zeros (GELU of a large negative input is -0), so only bigger ones must show it.
  if (n >= 64) {
    EXPECT_GT(r.nonzero, 0u) << "all-zero output";
  }
  if (n >= 64 && !v.plant_nan) {
    EXPECT_GT(r.saturated, 0u) << "no planted value saturated";
    EXPECT_GT(r.underflowed, 0u) << "no planted value underflowed";
  }
  if (v.plant_nan) {
    EXPECT_GT(r.nan_inputs, 0u) << "the NaN did not reach the cast";
  }
}

// ---------------------------------------------------------------------------------------------------------
// LayerNorm

void check_layernorm(int64_t N, int64_t C, const Variant& v) {
  SCOPED_TRACE(describe("layernorm", N, C, v));
  const auto n = static_cast<size_t>(N * C);
  const auto channels = static_cast<size_t>(C);
  std::vector<float> inp = octet::testing::random_normal(n, v.seed, 2.0f);
  std::vector<float> weight = octet::testing::random_normal(channels, v.seed + 1, 1.0f);
  std::vector<float> bias = octet::testing::random_normal(channels, v.seed + 2, 0.5f);
  for (size_t i = 0; i < n; i += 5) inp[i] += 3.0f;  // a row mean that is not zero
  if (C >= 8) {
    weight[channels / 3] = kHuge;  // normalised values of order 1, times kHuge: saturates
    weight[channels / 2] = kTiny;  // underflows
    bias[channels / 2] = kTiny;
    weight[channels - 1] = 0.0f;  // exact zeros: neither non-zero nor underflowed
    bias[channels - 1] = 0.0f;
  }
  if (v.plant_nan && n > 0) inp[n / 2] = std::numeric_limits<float>::quiet_NaN();  // a whole row of NaN

  octet::cuda::Stream stream;
  DeviceScale scale;
  Guarded<float> inp_device(n, v.float_offset);
  Guarded<float> weight_device(channels, v.float_offset);
  Guarded<float> bias_device(channels, v.float_offset);
  inp_device.upload(inp);
  weight_device.upload(weight);
  bias_device.upload(bias);

  // The unfused pair.
  Guarded<float> expected_out(n, v.float_offset);
  Guarded<float> expected_mean(static_cast<size_t>(N));
  Guarded<float> expected_rstd(static_cast<size_t>(N));
  CastSlots expected_cast(n, 0);
  octet::cuda::layernorm_forward(expected_out.data(), expected_mean.data(), expected_rstd.data(),
                                 inp_device.data(), weight_device.data(), bias_device.data(), N, C,
                                 stream.get());
  expected_cast.cast_amax(expected_out.data(), N, C, v.format, scale.data(), v.transposed, stream.get());
  stream.synchronize();
  const CastDownload expected = expected_cast.read(v.transposed);

  // The fused op, twice.
  Guarded<float> out(n, v.float_offset);
  Guarded<float> mean(static_cast<size_t>(N));
  Guarded<float> rstd(static_cast<size_t>(N));
  CastSlots cast(n, v.code_offset);
  std::vector<float> first_out;
  std::vector<float> first_mean;
  CastDownload first;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    octet::cuda::layernorm_forward_cast(v.write_out ? out.data() : nullptr, mean.data(), rstd.data(),
                                        inp_device.data(), weight_device.data(), bias_device.data(), N, C,
                                        cast.fused(v.format, scale.data(), v.transposed), stream.get());
    stream.synchronize();
    const CastDownload actual = cast.read(v.transposed);
    expect_same_cast(actual, expected);
    if (v.write_out) {
      EXPECT_TRUE(identical(out.read(), expected_out.read(), "out"));
      EXPECT_TRUE(out.guards_intact("out"));
    } else {
      EXPECT_TRUE(out.untouched("out (passed as null)"));
    }
    EXPECT_TRUE(identical(mean.read(), expected_mean.read(), "mean"));
    EXPECT_TRUE(identical(rstd.read(), expected_rstd.read(), "rstd"));
    EXPECT_TRUE(mean.guards_intact("mean"));
    EXPECT_TRUE(rstd.guards_intact("rstd"));
    EXPECT_TRUE(identical(inp_device.read(), inp, "inp (an input)"));
    if (n > 0) expect_edges_seen(actual.results, n, v);
    if (run == 0) {
      first = actual;
      first_out = out.read();
      first_mean = mean.read();
    } else {
      expect_same_cast(actual, first);
      EXPECT_TRUE(identical(out.read(), first_out, "out, second run"));
      EXPECT_TRUE(identical(mean.read(), first_mean, "mean, second run"));
    }
  }
}

// {37, 7919}: rows too wide to stage 32 of them in shared memory, so the transposed codes take the fallback.
constexpr octet::testing::Shape2D kLayernormShapes[] = {{1, 1},      {7, 13},    {33, 97}, {64, 768},
                                                        {130, 3072}, {37, 7919}, {0, 64}};

TEST(FusedLayernormCast, MatchesUnfused) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (const auto& shape : kLayernormShapes) {
    for (Variant v : sweep_variants()) {
      v.seed = ++seed;
      check_layernorm(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedLayernormCast, UnalignedPointers) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 96}, {64, 768}, {7, 13}}) {
    for (Variant v : unaligned_variants()) {
      v.seed = ++seed;
      check_layernorm(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedLayernormCast, NanInput) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : nan_variants()) {
      v.seed = ++seed;
      check_layernorm(shape.rows, shape.cols, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// GELU

std::vector<float> gelu_inputs(size_t n, const Variant& v) {
  std::vector<float> x = octet::testing::random_normal(n, v.seed, 3.0f);
  for (size_t i = 3; i < n; i += 29) x[i] = kHuge;   // gelu(x) = x: saturates
  for (size_t i = 5; i < n; i += 31) x[i] = kTiny;   // gelu(x) = x / 2: underflows
  for (size_t i = 7; i < n; i += 37) x[i] = -12.0f;  // gelu(x) of order -1e-32: underflows
  if (v.plant_nan && n > 0) x[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return x;
}

void check_gelu(int64_t rows, int64_t cols, const Variant& v, bool in_place = false) {
  SCOPED_TRACE(describe(in_place ? "gelu in place" : "gelu", rows, cols, v));
  const auto n = static_cast<size_t>(rows * cols);
  const std::vector<float> x = gelu_inputs(n, v);
  octet::cuda::Stream stream;
  DeviceScale scale;

  Guarded<float> expected_inp(n, v.float_offset);
  Guarded<float> expected_out(n, v.float_offset);
  CastSlots expected_cast(n, 0);
  expected_inp.upload(x);
  float* expected_target = in_place ? expected_inp.data() : expected_out.data();
  octet::cuda::gelu_forward(expected_target, expected_inp.data(), rows * cols, stream.get());
  expected_cast.cast_amax(expected_target, rows, cols, v.format, scale.data(), v.transposed, stream.get());
  stream.synchronize();
  const CastDownload expected = expected_cast.read(v.transposed);
  const std::vector<float> expected_values = in_place ? expected_inp.read() : expected_out.read();

  Guarded<float> inp(n, v.float_offset);
  Guarded<float> out(n, v.float_offset);
  CastSlots cast(n, v.code_offset);
  CastDownload first;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    inp.upload(x);
    float* target = in_place ? inp.data() : (v.write_out ? out.data() : nullptr);
    octet::cuda::gelu_forward_cast(target, inp.data(), rows, cols,
                                   cast.fused(v.format, scale.data(), v.transposed), stream.get());
    stream.synchronize();
    const CastDownload actual = cast.read(v.transposed);
    expect_same_cast(actual, expected);
    if (in_place) {
      EXPECT_TRUE(identical(inp.read(), expected_values, "out (= inp)"));
    } else {
      EXPECT_TRUE(identical(inp.read(), x, "inp (an input)"));
    }
    if (v.write_out && !in_place) {
      EXPECT_TRUE(identical(out.read(), expected_values, "out"));
      EXPECT_TRUE(out.guards_intact("out"));
    } else {
      EXPECT_TRUE(out.untouched("out (not passed)"));
    }
    EXPECT_TRUE(inp.guards_intact("inp"));
    if (n > 0) expect_edges_seen(actual.results, n, v);
    if (run == 0) {
      first = actual;
    } else {
      expect_same_cast(actual, first);
    }
  }
}

constexpr octet::testing::Shape2D kElementwiseShapes[] = {{1, 1},      {7, 13}, {33, 97}, {64, 768},
                                                          {130, 3072}, {0, 5},  {5, 0}};

TEST(FusedGeluCast, MatchesUnfused) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (const auto& shape : kElementwiseShapes) {
    for (Variant v : sweep_variants()) {
      v.seed = ++seed;
      check_gelu(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedGeluCast, UnalignedPointers) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 96}, {64, 768}, {7, 13}}) {
    for (Variant v : unaligned_variants()) {
      v.seed = ++seed;
      check_gelu(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedGeluCast, NanInput) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : nan_variants()) {
      v.seed = ++seed;
      check_gelu(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedGeluCast, OutAliasesInput) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : sweep_variants()) {
      if (!v.write_out) continue;
      v.seed = ++seed;
      check_gelu(shape.rows, shape.cols, v, /*in_place=*/true);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// AdamW

struct AdamWState {
  std::vector<float> params;
  std::vector<float> m;
  std::vector<float> v;
  std::vector<float> grads;
};

AdamWState adamw_inputs(size_t n, const Variant& variant) {
  AdamWState s;
  s.params = octet::testing::random_normal(n, variant.seed, 1.0f);
  s.m = octet::testing::random_normal(n, variant.seed + 1, 0.01f);
  s.v = octet::testing::random_uniform(n, variant.seed + 2, 0.0f, 1.0e-3f);
  s.grads = octet::testing::random_normal(n, variant.seed + 3, 0.1f);
  for (size_t i = 3; i < n; i += 29) s.params[i] = kHuge;  // stays huge: saturates
  for (size_t i = 5; i < n; i += 31) {                     // no gradient, no momentum: stays tiny, underflows
    s.params[i] = kTiny;
    s.m[i] = 0.0f;
    s.grads[i] = 0.0f;
  }
  if (variant.plant_nan && n > 0) s.grads[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return s;
}

// adamw_update's hyperparameters for one step.
struct Hyper {
  float learning_rate = 3.0e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1.0e-8f;
  float weight_decay = 0.1f;
  int64_t step = 7;
  float grad_scale = 0.37f;
};
// The same hyperparameters as Backend::optimizer_update takes them (the weight decay goes per segment).
octet::Backend::AdamWStep step_of(const Hyper& h) {
  return {h.learning_rate, h.beta1, h.beta2, h.eps, h.step, h.grad_scale};
}

// The optimizer state of one matrix on the device.
struct DeviceAdamW {
  Guarded<float> params;
  Guarded<float> m;
  Guarded<float> v;
  Guarded<float> grads;
  DeviceAdamW(size_t n, size_t offset) : params(n, offset), m(n, offset), v(n, offset), grads(n, offset) {}
  void upload(const AdamWState& s) {
    params.upload(s.params);
    m.upload(s.m);
    v.upload(s.v);
    grads.upload(s.grads);
  }
};

void check_adamw(int64_t rows, int64_t cols, const Variant& variant) {
  SCOPED_TRACE(describe("adamw", rows, cols, variant));
  const auto n = static_cast<size_t>(rows * cols);
  const AdamWState initial = adamw_inputs(n, variant);
  const Hyper h;
  octet::cuda::Stream stream;
  DeviceScale scale;

  DeviceAdamW expected_state(n, variant.float_offset);
  CastSlots expected_cast(n, 0);
  expected_state.upload(initial);
  octet::cuda::adamw_update(expected_state.params.data(), expected_state.m.data(), expected_state.v.data(),
                            expected_state.grads.data(), rows * cols, h.learning_rate, h.beta1, h.beta2,
                            h.eps, h.weight_decay, h.step, h.grad_scale, stream.get());
  expected_cast.cast_amax(expected_state.params.data(), rows, cols, variant.format, scale.data(),
                          variant.transposed, stream.get());
  stream.synchronize();
  const CastDownload expected = expected_cast.read(variant.transposed);

  DeviceAdamW state(n, variant.float_offset);
  CastSlots cast(n, variant.code_offset);
  CastDownload first;
  for (int run = 0; run < 2; ++run) {  // from the same initial state each time
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    state.upload(initial);
    octet::cuda::adamw_update_cast(
        state.params.data(), state.m.data(), state.v.data(), state.grads.data(), rows, cols, h.learning_rate,
        h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale,
        cast.fused(variant.format, scale.data(), variant.transposed), stream.get());
    stream.synchronize();
    const CastDownload actual = cast.read(variant.transposed);
    expect_same_cast(actual, expected);
    EXPECT_TRUE(identical(state.params.read(), expected_state.params.read(), "params"));
    EXPECT_TRUE(identical(state.m.read(), expected_state.m.read(), "m"));
    EXPECT_TRUE(identical(state.v.read(), expected_state.v.read(), "v"));
    EXPECT_TRUE(identical(state.grads.read(), initial.grads, "grads (an input)"));
    EXPECT_TRUE(state.params.guards_intact("params"));
    EXPECT_TRUE(state.m.guards_intact("m"));
    EXPECT_TRUE(state.v.guards_intact("v"));
    if (n > 0) expect_edges_seen(actual.results, n, variant);
    if (run == 0) {
      first = actual;
    } else {
      expect_same_cast(actual, first);
    }
  }
}

TEST(FusedAdamWCast, MatchesUnfused) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 800;
  for (const auto& shape : kElementwiseShapes) {
    for (Variant v : sweep_variants()) {
      if (!v.write_out) continue;  // AdamW always writes params
      v.seed = ++seed;
      check_adamw(shape.rows, shape.cols, v);
    }
  }
}

// adamw_update_casts over weights of every kind at once (aligned ones in the one launch, partial tiles, rows
// not a multiple of 4, both formats, with and without decay and transposed codes, a NaN gradient; and ones
// that go one by one: odd columns, unaligned floats or codes) against adamw_update_cast on each weight alone,
// bit for bit. Twice from the same state: the second call finds its table uploaded.
TEST(FusedAdamWCast, ManyWeightsMatchOneByOne) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, cols;
    Variant variant;
    bool decayed;
  };
  auto variant = [](Dtype format, bool transposed, size_t float_offset, size_t code_offset, bool nan) {
    Variant v;
    v.format = format;
    v.transposed = transposed;
    v.float_offset = float_offset;
    v.code_offset = code_offset;
    v.plant_nan = nan;
    return v;
  };
  std::vector<Case> cases = {
      {64, 768, variant(Dtype::e4m3, true, 0, 0, false), true},
      {130, 3072, variant(Dtype::e5m2, true, 0, 0, false), false},
      {33, 128, variant(Dtype::e4m3, true, 0, 0, false), true},  // rows % 4 != 0: transposed bytes
      {1, 4, variant(Dtype::e4m3, true, 0, 0, false), false},
      {96, 260, variant(Dtype::e4m3, false, 0, 0, true), true},   // partial column tile, NaN gradient
      {33, 97, variant(Dtype::e5m2, true, 0, 0, false), true},    // odd columns: alone
      {64, 768, variant(Dtype::e4m3, true, 4, 0, false), true},   // unaligned floats: alone
      {64, 768, variant(Dtype::e5m2, true, 0, 1, false), false},  // unaligned codes: alone
      {0, 8, variant(Dtype::e4m3, true, 0, 0, false), true},      // empty: alone
  };
  const Hyper h;
  octet::cuda::Stream stream;
  DeviceScale scale;
  uint64_t seed = 1200;
  std::vector<AdamWState> initial;
  std::vector<std::unique_ptr<DeviceAdamW>> expected_state, state;
  std::vector<std::unique_ptr<CastSlots>> expected_cast, cast;
  for (Case& c : cases) {
    c.variant.seed = ++seed;
    const auto n = static_cast<size_t>(c.rows * c.cols);
    initial.push_back(adamw_inputs(n, c.variant));
    expected_state.push_back(std::make_unique<DeviceAdamW>(n, c.variant.float_offset));
    state.push_back(std::make_unique<DeviceAdamW>(n, c.variant.float_offset));
    expected_cast.push_back(std::make_unique<CastSlots>(n, c.variant.code_offset));
    cast.push_back(std::make_unique<CastSlots>(n, c.variant.code_offset));
  }
  std::vector<CastDownload> expected;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    DeviceAdamW& e = *expected_state[k];
    e.upload(initial[k]);
    octet::cuda::adamw_update_cast(
        e.params.data(), e.m.data(), e.v.data(), e.grads.data(), c.rows, c.cols, h.learning_rate, h.beta1,
        h.beta2, h.eps, c.decayed ? h.weight_decay : 0.0f, h.step, h.grad_scale,
        expected_cast[k]->fused(c.variant.format, scale.data(), c.variant.transposed), stream.get());
    stream.synchronize();
    expected.push_back(expected_cast[k]->read(c.variant.transposed));
  }
  octet::cuda::AdamWCastTable table;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    std::vector<octet::cuda::AdamWCastWeight> weights;
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      DeviceAdamW& d = *state[k];
      d.upload(initial[k]);
      weights.push_back({d.params.data(), d.m.data(), d.v.data(), d.grads.data(), c.rows, c.cols, c.decayed,
                         cast[k]->fused(c.variant.format, scale.data(), c.variant.transposed)});
    }
    octet::cuda::adamw_update_casts(weights, h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay, h.step,
                                    h.grad_scale, table, stream.get());
    stream.synchronize();
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      SCOPED_TRACE(describe("adamw_update_casts", c.rows, c.cols, c.variant));
      expect_same_cast(cast[k]->read(c.variant.transposed), expected[k]);
      EXPECT_TRUE(identical(state[k]->params.read(), expected_state[k]->params.read(), "params"));
      EXPECT_TRUE(identical(state[k]->m.read(), expected_state[k]->m.read(), "m"));
      EXPECT_TRUE(identical(state[k]->v.read(), expected_state[k]->v.read(), "v"));
      EXPECT_TRUE(state[k]->params.guards_intact("params"));
      EXPECT_TRUE(state[k]->m.guards_intact("m"));
      EXPECT_TRUE(state[k]->v.guards_intact("v"));
      const size_t n = static_cast<size_t>(c.rows * c.cols);
      if (n > 0) expect_edges_seen(expected[k].results, n, c.variant);
    }
  }
}

TEST(FusedAdamWCast, UnalignedPointers) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 96}, {64, 768}, {7, 13}}) {
    for (Variant v : unaligned_variants()) {
      v.seed = ++seed;
      check_adamw(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedAdamWCast, NanGradient) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1000;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : nan_variants()) {
      v.seed = ++seed;
      check_adamw(shape.rows, shape.cols, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// GELU backward, with the bias gradient of the layer whose output gradient it produces

// The pre-activations and the incoming gradient. gelu'(4) is about 1, so there the gradient passes through:
// planted huge and tiny values saturate and underflow. gelu'(-12) is 0: exact zeros.
struct GeluBackwardInputs {
  std::vector<float> inp;
  std::vector<float> dout;
  std::vector<float> dbias;
};

GeluBackwardInputs gelu_backward_inputs(int64_t rows, int64_t cols, const Variant& v) {
  const auto n = static_cast<size_t>(rows * cols);
  GeluBackwardInputs in{octet::testing::random_normal(n, v.seed, 3.0f),
                        octet::testing::random_normal(n, v.seed + 1, 0.1f),
                        octet::testing::random_normal(static_cast<size_t>(cols), v.seed + 2, 1.0f)};
  for (size_t i = 3; i < n; i += 29) {
    in.inp[i] = 4.0f;
    in.dout[i] = kHuge;
  }
  for (size_t i = 5; i < n; i += 31) {
    in.inp[i] = 4.0f;
    in.dout[i] = kTiny;
  }
  for (size_t i = 7; i < n; i += 37) in.inp[i] = -12.0f;
  if (v.plant_nan && n > 0) in.dout[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return in;
}

// dbias + the column sums of dinp [rows, cols] in float64, and the magnitude that bounds a float32 sum's
// error in any order: |dbias| + sum |dinp|.
struct ColumnSumReference {
  std::vector<float> sums;
  std::vector<float> magnitude;
};

ColumnSumReference column_sum_reference(const std::vector<float>& dinp, const std::vector<float>& dbias,
                                        int64_t rows, int64_t cols) {
  std::vector<double> sums(dbias.begin(), dbias.end());
  std::vector<double> magnitude(dbias.size());
  for (size_t c = 0; c < dbias.size(); ++c) magnitude[c] = std::fabs(static_cast<double>(dbias[c]));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double x = dinp[static_cast<size_t>(r * cols + c)];
      sums[static_cast<size_t>(c)] += x;
      magnitude[static_cast<size_t>(c)] += std::fabs(x);
    }
  }
  return {std::vector<float>(sums.begin(), sums.end()),
          std::vector<float>(magnitude.begin(), magnitude.end())};
}

::testing::AssertionResult close_to_column_sums(const std::vector<float>& actual,
                                                const ColumnSumReference& reference, int64_t rows) {
  octet::testing::CompareOptions options;
  options.dtype = Dtype::f32;
  options.reduction_length = rows + 1;  // rows terms and the old value, added in any order
  options.magnitude = reference.magnitude;
  return octet::testing::all_close(actual, reference.sums, options);
}

// The second run of a fused bias gradient adds its tile sums on a second stream (cuda::PartialSums), as the
// CUDA backend runs it: the same sums, so the second run's dbias must equal the first's bit for bit.
struct SecondStream {
  octet::cuda::Stream stream;
  octet::cuda::Event written, done;
  octet::cuda::Workspace workspace;
  octet::cuda::PartialSums sums(int run) {
    return run == 0 ? octet::cuda::PartialSums{}
                    : octet::cuda::PartialSums{stream.get(), written.get(), done.get(), &workspace};
  }
  // `on` waits for the sums (at once where none was queued).
  void wait(cudaStream_t on) const { OCTET_CUDA_CHECK(cudaStreamWaitEvent(on, done.get(), 0)); }
};

// `alias`: dinp is dout's memory (the gradient overwritten in place).
void check_gelu_backward(int64_t rows, int64_t cols, const Variant& v, bool bias, bool alias = false) {
  SCOPED_TRACE(describe(alias ? "gelu backward in place" : "gelu backward", rows, cols, v) +
               (bias ? " +dbias" : " dbias=null"));
  const auto n = static_cast<size_t>(rows * cols);
  const auto channels = static_cast<size_t>(cols);
  const GeluBackwardInputs in = gelu_backward_inputs(rows, cols, v);
  octet::cuda::Stream stream;
  octet::cuda::Workspace workspace;
  DeviceScale scale;

  // The unfused ops.
  Guarded<float> expected_inp(n, v.float_offset);
  Guarded<float> expected_dout(n, v.float_offset);
  Guarded<float> expected_dinp(n, v.float_offset);
  Guarded<float> expected_dbias(channels);
  CastSlots expected_cast(n, 0);
  expected_inp.upload(in.inp);
  expected_dout.upload(in.dout);
  expected_dbias.upload(in.dbias);
  octet::cuda::gelu_backward(expected_dinp.data(), expected_inp.data(), expected_dout.data(), rows * cols,
                             stream.get());
  expected_cast.cast_amax(expected_dinp.data(), rows, cols, v.format, scale.data(), v.transposed,
                          stream.get());
  octet::cuda::bias_backward(expected_dbias.data(), expected_dinp.data(), rows, cols, workspace,
                             stream.get());
  stream.synchronize();
  const CastDownload expected = expected_cast.read(v.transposed);
  const std::vector<float> expected_values = expected_dinp.read();
  const ColumnSumReference sums = column_sum_reference(expected_values, in.dbias, rows, cols);
  // The unfused bias gradient meets the same bound: the bound is not the fused kernel's own order.
  if (bias) {
    EXPECT_TRUE(close_to_column_sums(expected_dbias.read(), sums, rows)) << "bias_backward";
  }

  Guarded<float> inp(n, v.float_offset);
  Guarded<float> dout(n, v.float_offset);
  Guarded<float> dinp(n, v.float_offset);
  Guarded<float> dbias(channels);
  Guarded<float> partials(static_cast<size_t>(octet::cuda::column_partial_rows(rows) * cols));
  CastSlots cast(n, v.code_offset);
  CastDownload first;
  std::vector<float> first_dbias;
  SecondStream aside;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    inp.upload(in.inp);
    dout.upload(in.dout);
    dbias.upload(in.dbias);
    float* target = alias ? dout.data() : (v.write_out ? dinp.data() : nullptr);
    octet::cuda::gelu_backward_cast(
        target, inp.data(), dout.data(), rows, cols, cast.fused(v.format, scale.data(), v.transposed),
        bias ? dbias.data() : nullptr, bias ? partials.data() : nullptr, workspace, stream.get(),
        bias ? aside.sums(run) : octet::cuda::PartialSums{});
    aside.wait(stream.get());
    stream.synchronize();
    const CastDownload actual = cast.read(v.transposed);
    expect_same_cast(actual, expected);
    EXPECT_TRUE(identical(inp.read(), in.inp, "inp (an input)"));
    if (alias) {
      EXPECT_TRUE(identical(dout.read(), expected_values, "dinp (= dout)"));
    } else {
      EXPECT_TRUE(identical(dout.read(), in.dout, "dout (an input)"));
    }
    if (v.write_out && !alias) {
      EXPECT_TRUE(identical(dinp.read(), expected_values, "dinp"));
      EXPECT_TRUE(dinp.guards_intact("dinp"));
    } else {
      EXPECT_TRUE(dinp.untouched("dinp (not passed)"));
    }
    EXPECT_TRUE(inp.guards_intact("inp"));
    EXPECT_TRUE(dout.guards_intact("dout"));
    EXPECT_TRUE(partials.guards_intact("column partials"));
    const std::vector<float> bias_values = dbias.read();
    EXPECT_TRUE(dbias.guards_intact("dbias"));
    if (bias) {
      EXPECT_TRUE(close_to_column_sums(bias_values, sums, rows)) << "dbias";
      // Where the exact sums move some float32 bias, the kernel must have added them (a single row's
      // gradient can be zero, or too small to move its bias).
      if (sums.sums != in.dbias) {
        EXPECT_FALSE(identical(bias_values, in.dbias, "dbias")) << "dbias unchanged";
      }
    } else {
      EXPECT_TRUE(identical(bias_values, in.dbias, "dbias (not passed)"));
      EXPECT_TRUE(partials.untouched("column partials (no dbias)"));
    }
    if (n > 0) expect_edges_seen(actual.results, n, v);
    if (run == 0) {
      first = actual;
      first_dbias = bias_values;
    } else {
      expect_same_cast(actual, first);
      EXPECT_TRUE(identical(bias_values, first_dbias, "dbias, second run"));
    }
  }
}

// Odd and prime shapes, a partial last tile of rows and of columns, a single column and a single row.
constexpr octet::testing::Shape2D kGeluBackwardShapes[] = {
    {1, 1}, {7, 13}, {33, 97}, {64, 768}, {130, 3072}, {2333, 1}, {1, 3221}, {0, 5}, {5, 0}};

TEST(FusedGeluBackwardCast, MatchesUnfused) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1100;
  for (const auto& shape : kGeluBackwardShapes) {
    for (Variant v : sweep_variants()) {
      for (const bool bias : {true, false}) {
        v.seed = ++seed;
        check_gelu_backward(shape.rows, shape.cols, v, bias);
      }
    }
  }
}

TEST(FusedGeluBackwardCast, UnalignedPointers) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1200;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 96}, {64, 768}, {7, 13}}) {
    for (Variant v : unaligned_variants()) {
      v.seed = ++seed;
      check_gelu_backward(shape.rows, shape.cols, v, true);
    }
  }
}

TEST(FusedGeluBackwardCast, NanGradient) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1300;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : nan_variants()) {
      v.seed = ++seed;
      check_gelu_backward(shape.rows, shape.cols, v, true);
    }
  }
}

TEST(FusedGeluBackwardCast, GradientOverwritesItsInput) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1400;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : sweep_variants()) {
      if (!v.write_out) continue;
      v.seed = ++seed;
      check_gelu_backward(shape.rows, shape.cols, v, true, /*alias=*/true);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// The gradient cast with the bias gradient of the same tensor (linear_backward's), against bias_backward
// then cast_amax

// An output gradient with planted values that saturate and underflow, and exact zeros.
std::vector<float> output_gradient(int64_t rows, int64_t cols, const Variant& v) {
  const auto n = static_cast<size_t>(rows * cols);
  std::vector<float> dout = octet::testing::random_normal(n, v.seed, 0.1f);
  for (size_t i = 3; i < n; i += 29) dout[i] = i % 2 == 0 ? kHuge : -kHuge;
  for (size_t i = 5; i < n; i += 31) dout[i] = kTiny;
  for (size_t i = 7; i < n; i += 37) dout[i] = 0.0f;
  if (v.plant_nan && n > 0) dout[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return dout;
}

void check_bias_backward_cast(int64_t rows, int64_t cols, const Variant& v) {
  SCOPED_TRACE(describe("bias backward cast", rows, cols, v));
  const auto n = static_cast<size_t>(rows * cols);
  const auto channels = static_cast<size_t>(cols);
  const std::vector<float> values = output_gradient(rows, cols, v);
  const std::vector<float> dbias0 = octet::testing::random_normal(channels, v.seed + 2, 1.0f);
  octet::cuda::Stream stream;
  octet::cuda::Workspace workspace;
  DeviceScale scale;

  // The unfused ops, in linear_backward's order.
  Guarded<float> expected_dout(n, v.float_offset);
  Guarded<float> expected_dbias(channels);
  CastSlots expected_cast(n, 0);
  expected_dout.upload(values);
  expected_dbias.upload(dbias0);
  octet::cuda::bias_backward(expected_dbias.data(), expected_dout.data(), rows, cols, workspace,
                             stream.get());
  expected_cast.cast_amax(expected_dout.data(), rows, cols, v.format, scale.data(), v.transposed,
                          stream.get());
  stream.synchronize();
  const CastDownload expected = expected_cast.read(v.transposed);
  const ColumnSumReference sums = column_sum_reference(values, dbias0, rows, cols);
  EXPECT_TRUE(close_to_column_sums(expected_dbias.read(), sums, rows)) << "bias_backward";

  Guarded<float> dout(n, v.float_offset);
  Guarded<float> dbias(channels);
  const auto partial_count = static_cast<size_t>(octet::cuda::column_partial_rows(rows) * cols);
  Guarded<float> partials(partial_count);
  CastSlots cast(n, v.code_offset);
  CastDownload first;
  std::vector<float> first_dbias;
  SecondStream aside;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run (tile sums on a second stream)");
    dout.upload(values);
    dbias.upload(dbias0);
    // NaN: a partial sum the cast left unwritten would turn its column of dbias into NaN.
    partials.upload(std::vector<float>(partial_count, std::numeric_limits<float>::quiet_NaN()));
    octet::cuda::bias_backward_cast(dbias.data(), dout.data(), rows, cols,
                                    cast.fused(v.format, scale.data(), v.transposed), partials.data(),
                                    workspace, stream.get(), aside.sums(run));
    aside.wait(stream.get());
    stream.synchronize();
    const CastDownload actual = cast.read(v.transposed);
    expect_same_cast(actual, expected);
    EXPECT_TRUE(identical(dout.read(), values, "dout (an input)"));
    EXPECT_TRUE(dout.guards_intact("dout"));
    EXPECT_TRUE(partials.guards_intact("column partials"));
    const std::vector<float> bias_values = dbias.read();
    EXPECT_TRUE(dbias.guards_intact("dbias"));
    EXPECT_TRUE(close_to_column_sums(bias_values, sums, rows)) << "dbias";
    if (sums.sums != dbias0) {
      EXPECT_FALSE(identical(bias_values, dbias0, "dbias")) << "dbias unchanged";
    }
    if (n > 0) expect_edges_seen(actual.results, n, v);
    if (run == 0) {
      first = actual;
      first_dbias = bias_values;
    } else {
      expect_same_cast(actual, first);
      EXPECT_TRUE(identical(bias_values, first_dbias, "dbias, second run"));
    }
  }
}

TEST(FusedBiasBackwardCast, MatchesUnfused) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1500;
  for (const auto& shape : kGeluBackwardShapes) {
    for (Variant v : sweep_variants()) {
      if (!v.write_out) continue;  // there is no float32 output to leave out
      v.seed = ++seed;
      check_bias_backward_cast(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedBiasBackwardCast, UnalignedPointers) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1600;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 96}, {64, 768}, {7, 13}}) {
    for (Variant v : unaligned_variants()) {
      v.seed = ++seed;
      check_bias_backward_cast(shape.rows, shape.cols, v);
    }
  }
}

TEST(FusedBiasBackwardCast, NanGradient) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1700;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : nan_variants()) {
      v.seed = ++seed;
      check_bias_backward_cast(shape.rows, shape.cols, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------

TEST(FusedCast, RejectsInvalidArguments) {
  SKIP_WITHOUT_GPU();
  DeviceScale scale;
  CastSlots slots(16, 0);
  Guarded<float> x(16);
  Guarded<float> stats(4);
  const FusedCast good = slots.fused(Dtype::e4m3, scale.data(), true);
  FusedCast wrong_format = good;
  wrong_format.format = Dtype::bf16;
  FusedCast no_results = good;
  no_results.results = nullptr;
  FusedCast no_output = good;
  no_output.output = nullptr;
  EXPECT_THROW(octet::cuda::layernorm_forward_cast(x.data(), stats.data(), stats.data(), x.data(), x.data(),
                                                   x.data(), 4, 0, good, nullptr),
               octet::Error);
  EXPECT_THROW(octet::cuda::gelu_forward_cast(x.data(), x.data(), 4, 4, wrong_format, nullptr), octet::Error);
  EXPECT_THROW(octet::cuda::gelu_forward_cast(x.data(), x.data(), -1, 4, good, nullptr), octet::Error);
  EXPECT_THROW(octet::cuda::gelu_forward_cast(x.data(), x.data(), 4, 4, no_results, nullptr), octet::Error);
  EXPECT_THROW(octet::cuda::adamw_update_cast(x.data(), x.data(), x.data(), x.data(), 4, 4, 1e-3f, 0.9f,
                                              0.95f, 1e-8f, 0.0f, 1, 1.0f, no_output, nullptr),
               octet::Error);
  octet::cuda::Workspace workspace;
  EXPECT_THROW(octet::cuda::gelu_backward_cast(x.data(), x.data(), nullptr, 4, 4, good, nullptr, nullptr,
                                               workspace, nullptr),
               octet::Error)
      << "no dout";
  EXPECT_THROW(octet::cuda::gelu_backward_cast(x.data(), x.data(), x.data(), 4, 4, good, stats.data(),
                                               nullptr, workspace, nullptr),
               octet::Error)
      << "a bias gradient without column partials";
  EXPECT_THROW(octet::cuda::gelu_backward_cast(x.data(), x.data(), x.data(), 4, -4, good, nullptr, nullptr,
                                               workspace, nullptr),
               octet::Error);
  EXPECT_THROW(octet::cuda::gelu_backward_cast(x.data(), x.data(), x.data(), 4, 4, wrong_format, nullptr,
                                               nullptr, workspace, nullptr),
               octet::Error);
  EXPECT_THROW(
      octet::cuda::bias_backward_cast(nullptr, x.data(), 4, 4, good, stats.data(), workspace, nullptr),
      octet::Error)
      << "no dbias";
  const octet::cuda::Stream other;
  EXPECT_THROW(octet::cuda::bias_backward_cast(stats.data(), x.data(), 4, 4, good, stats.data(), workspace,
                                               nullptr, {other.get(), nullptr, nullptr, &workspace}),
               octet::Error)
      << "a second stream without its events, sharing the kernel's workspace";
  EXPECT_THROW(
      octet::cuda::bias_backward_cast(stats.data(), x.data(), 4, 4, good, nullptr, workspace, nullptr),
      octet::Error)
      << "a bias gradient without column partials";
  EXPECT_THROW(octet::cuda::bias_backward_cast(stats.data(), static_cast<const float*>(nullptr), 4, 4, good,
                                               stats.data(), workspace, nullptr),
               octet::Error)
      << "no dout";
  EXPECT_THROW(
      octet::cuda::bias_backward_cast(stats.data(), x.data(), -4, 4, good, stats.data(), workspace, nullptr),
      octet::Error);
  OCTET_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(x.guards_intact("x"));
}

// ---------------------------------------------------------------------------------------------------------
// GELU over bf16 inputs (the MLP's hidden activation and its gradient, stored in bf16): the fused and the
// plain kernels give the very bits they give over the inputs' float32 values.

std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = octet::float_to_bf16(x[i]);
  return b;
}

std::vector<float> widened(const std::vector<uint16_t>& b) {
  std::vector<float> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const uint32_t word = static_cast<uint32_t>(b[i]) << 16;
    std::memcpy(&x[i], &word, sizeof(float));
  }
  return x;
}

// `v.float_offset` / 2 bytes of offset for the bf16 inputs: 2 makes them unaligned for 8-byte loads.
void check_gelu_bf16(int64_t rows, int64_t cols, const Variant& v) {
  SCOPED_TRACE(describe("gelu over bf16", rows, cols, v));
  const auto n = static_cast<size_t>(rows * cols);
  const std::vector<uint16_t> bits = bf16_bits(gelu_inputs(n, v));
  octet::cuda::Stream stream;
  DeviceScale scale;
  Guarded<float> values(n);
  values.upload(widened(bits));
  Guarded<float> expected_out(n), expected_plain(n);
  CastSlots expected_cast(n, 0);
  octet::cuda::gelu_forward_cast(expected_out.data(), values.data(), rows, cols,
                                 expected_cast.fused(v.format, scale.data(), v.transposed), stream.get());
  octet::cuda::gelu_forward(expected_plain.data(), values.data(), rows * cols, stream.get());

  Guarded<uint16_t> inp(n, v.float_offset / 2);
  inp.upload(bits);
  Guarded<float> out(n), plain(n);
  CastSlots cast(n, v.code_offset);
  octet::cuda::gelu_forward_cast(v.write_out ? out.data() : nullptr, inp.data(), rows, cols,
                                 cast.fused(v.format, scale.data(), v.transposed), stream.get());
  octet::cuda::gelu_forward(plain.data(), inp.data(), rows * cols, stream.get());
  stream.synchronize();
  expect_same_cast(cast.read(v.transposed), expected_cast.read(v.transposed));
  EXPECT_TRUE(identical(plain.read(), expected_plain.read(), "gelu_forward"));
  EXPECT_TRUE(plain.guards_intact("gelu_forward's out"));
  if (v.write_out) {
    EXPECT_TRUE(identical(out.read(), expected_out.read(), "out"));
    EXPECT_TRUE(out.guards_intact("out"));
  } else {
    EXPECT_TRUE(out.untouched("out (not passed)"));
  }
  EXPECT_TRUE(identical(inp.read(), bits, "inp (an input)"));
  EXPECT_TRUE(inp.guards_intact("inp"));
}

void check_gelu_backward_bf16(int64_t rows, int64_t cols, const Variant& v) {
  SCOPED_TRACE(describe("gelu backward over bf16", rows, cols, v));
  const auto n = static_cast<size_t>(rows * cols);
  const GeluBackwardInputs in = gelu_backward_inputs(rows, cols, v);
  const std::vector<uint16_t> inp_bits = bf16_bits(in.inp), dout_bits = bf16_bits(in.dout);
  octet::cuda::Stream stream;
  octet::cuda::Workspace workspace;
  DeviceScale scale;
  const auto partial_rows = static_cast<size_t>(octet::cuda::column_partial_rows(rows) * cols);

  Guarded<float> inp_values(n), dout_values(n), expected_dinp(n), expected_plain(n);
  Guarded<float> expected_dbias(static_cast<size_t>(cols)), expected_partials(partial_rows);
  CastSlots expected_cast(n, 0);
  inp_values.upload(widened(inp_bits));
  dout_values.upload(widened(dout_bits));
  expected_dbias.upload(in.dbias);
  octet::cuda::gelu_backward_cast(expected_dinp.data(), inp_values.data(), dout_values.data(), rows, cols,
                                  expected_cast.fused(v.format, scale.data(), v.transposed),
                                  expected_dbias.data(), expected_partials.data(), workspace, stream.get());
  octet::cuda::gelu_backward(expected_plain.data(), inp_values.data(), dout_values.data(), rows * cols,
                             stream.get());

  Guarded<uint16_t> inp(n, v.float_offset / 2), dout(n, v.float_offset / 2);
  Guarded<float> dinp(n), plain(n), dbias(static_cast<size_t>(cols)), partials(partial_rows);
  CastSlots cast(n, v.code_offset);
  inp.upload(inp_bits);
  dout.upload(dout_bits);
  dbias.upload(in.dbias);
  octet::cuda::gelu_backward_cast(v.write_out ? dinp.data() : nullptr, inp.data(), dout.data(), rows, cols,
                                  cast.fused(v.format, scale.data(), v.transposed), dbias.data(),
                                  partials.data(), workspace, stream.get());
  octet::cuda::gelu_backward(plain.data(), inp.data(), dout.data(), rows * cols, stream.get());
  stream.synchronize();
  const CastDownload actual = cast.read(v.transposed);
  expect_same_cast(actual, expected_cast.read(v.transposed));
  // The same values in the same tiles: the bias gradient is added up in the same order.
  EXPECT_TRUE(identical(dbias.read(), expected_dbias.read(), "dbias"));
  EXPECT_TRUE(dbias.guards_intact("dbias"));
  EXPECT_TRUE(identical(plain.read(), expected_plain.read(), "gelu_backward"));
  if (v.write_out) {
    EXPECT_TRUE(identical(dinp.read(), expected_dinp.read(), "dinp"));
    EXPECT_TRUE(dinp.guards_intact("dinp"));
  } else {
    EXPECT_TRUE(dinp.untouched("dinp (not passed)"));
  }
  EXPECT_TRUE(identical(inp.read(), inp_bits, "inp (an input)"));
  EXPECT_TRUE(identical(dout.read(), dout_bits, "dout (an input)"));
  EXPECT_TRUE(inp.guards_intact("inp") && dout.guards_intact("dout"));
  if (n > 0) expect_edges_seen(actual.results, n, v);
}

TEST(FusedGeluCast, Bf16InputsGiveTheBitsOfTheirFloat32Values) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1500;
  for (const auto& shape : kElementwiseShapes) {
    std::vector<Variant> variants = sweep_variants();
    for (const Variant& u : unaligned_variants()) variants.push_back(u);
    for (const Variant& u : nan_variants()) variants.push_back(u);
    for (Variant v : variants) {
      v.seed = ++seed;
      check_gelu_bf16(shape.rows, shape.cols, v);
      check_gelu_backward_bf16(shape.rows, shape.cols, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// SwiGLU's backward with the gradient cast of the layer that produced its input, over float32 and bf16
// inputs, against swiglu_backward into float32 and then the cast of its result: bias_backward_cast where
// there is a bias gradient (the element-wise kernels' tile sums, so the column partials and dbias must be
// the same bits), else cast_amax.

// Pre-activations [rows, 2C] and the incoming gradient [rows, C]. At gate 4 and up 1 both gradients are
// about dout: planted huge and tiny douts saturate and underflow; a zero dout gives exact zeros.
struct SwigluBackwardInputs {
  std::vector<float> inp;
  std::vector<float> dout;
  std::vector<float> dbias;
};

SwigluBackwardInputs swiglu_backward_inputs(int64_t rows, int64_t C, const Variant& v) {
  const auto pairs = static_cast<size_t>(rows * C);
  const auto width = static_cast<size_t>(C);
  SwigluBackwardInputs in{octet::testing::random_normal(2 * pairs, v.seed, 2.0f),
                          octet::testing::random_normal(pairs, v.seed + 1, 0.1f),
                          octet::testing::random_normal(2 * width, v.seed + 2, 1.0f)};
  const auto plant = [&](size_t pair, float dout) {
    const size_t gate = pair / width * 2 * width + pair % width;
    in.inp[gate] = 4.0f;
    in.inp[gate + width] = 1.0f;
    in.dout[pair] = dout;
  };
  for (size_t p = 3; p < pairs; p += 29) plant(p, p % 2 == 0 ? kHuge : -kHuge);
  for (size_t p = 5; p < pairs; p += 31) plant(p, kTiny);
  for (size_t p = 7; p < pairs; p += 37) in.dout[p] = 0.0f;
  if (v.plant_nan && pairs > 0) in.dout[pairs / 2] = std::numeric_limits<float>::quiet_NaN();
  return in;
}

// The values as the op reads them: float32, or bf16 bits.
template <typename In>
std::vector<In> stored_as(const std::vector<float>& x) {
  if constexpr (std::is_same_v<In, uint16_t>) {
    return bf16_bits(x);
  } else {
    return x;
  }
}

template <typename In>
void check_swiglu_backward(int64_t rows, int64_t C, const Variant& v, bool bias) {
  constexpr bool kBf16 = std::is_same_v<In, uint16_t>;
  SCOPED_TRACE(
      describe(kBf16 ? "swiglu backward over bf16, [rows, C]" : "swiglu backward, [rows, C]", rows, C, v) +
      (bias ? " +dbias" : " dbias=null"));
  const auto pairs = static_cast<size_t>(rows * C);
  const size_t n = 2 * pairs;  // dinp [rows, 2C]
  const auto cols = static_cast<size_t>(2 * C);
  const auto partial_count = static_cast<size_t>(octet::cuda::column_partial_rows(rows)) * cols;
  const SwigluBackwardInputs in = swiglu_backward_inputs(rows, C, v);
  const std::vector<In> inp_values = stored_as<In>(in.inp), dout_values = stored_as<In>(in.dout);
  const size_t input_offset = kBf16 ? v.float_offset / 2 : v.float_offset;
  octet::cuda::Stream stream;
  octet::cuda::Workspace workspace;
  DeviceScale scale;
  Guarded<In> inp(n, input_offset), dout(pairs, input_offset);
  inp.upload(inp_values);
  dout.upload(dout_values);

  // The unfused ops.
  Guarded<float> expected_dinp(n), expected_dbias(cols), expected_partials(partial_count);
  CastSlots expected_cast(n, 0);
  expected_dbias.upload(in.dbias);
  octet::cuda::swiglu_backward(expected_dinp.data(), inp.data(), dout.data(), rows, C, stream.get());
  if (bias) {
    octet::cuda::bias_backward_cast(expected_dbias.data(), expected_dinp.data(), rows, 2 * C,
                                    expected_cast.fused(v.format, scale.data(), v.transposed),
                                    expected_partials.data(), workspace, stream.get());
  } else {
    expected_cast.cast_amax(expected_dinp.data(), rows, 2 * C, v.format, scale.data(), v.transposed,
                            stream.get());
  }
  stream.synchronize();
  const CastDownload expected = expected_cast.read(v.transposed);
  const std::vector<float> expected_values = expected_dinp.read();
  const std::vector<float> expected_bias = expected_dbias.read();
  const ColumnSumReference sums = column_sum_reference(expected_values, in.dbias, rows, 2 * C);

  Guarded<float> dinp(n, v.float_offset), dbias(cols), partials(partial_count);
  CastSlots cast(n, v.code_offset);
  CastDownload first;
  SecondStream aside;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run (tile sums on a second stream)");
    dbias.upload(in.dbias);
    // NaN: a partial sum left unwritten shows in partials and in its column of dbias.
    if (bias) partials.upload(std::vector<float>(partial_count, std::numeric_limits<float>::quiet_NaN()));
    octet::cuda::swiglu_backward_cast(v.write_out ? dinp.data() : nullptr, inp.data(), dout.data(), rows, C,
                                      cast.fused(v.format, scale.data(), v.transposed),
                                      bias ? dbias.data() : nullptr, bias ? partials.data() : nullptr,
                                      workspace, stream.get(),
                                      bias ? aside.sums(run) : octet::cuda::PartialSums{});
    aside.wait(stream.get());
    stream.synchronize();
    const CastDownload actual = cast.read(v.transposed);
    expect_same_cast(actual, expected);
    if (run == 1) expect_same_cast(actual, first);
    first = actual;
    if (v.write_out) {
      EXPECT_TRUE(identical(dinp.read(), expected_values, "dinp"));
      EXPECT_TRUE(dinp.guards_intact("dinp"));
    } else {
      EXPECT_TRUE(dinp.untouched("dinp (not passed)"));
    }
    EXPECT_TRUE(identical(inp.read(), inp_values, "inp (an input)"));
    EXPECT_TRUE(identical(dout.read(), dout_values, "dout (an input)"));
    EXPECT_TRUE(inp.guards_intact("inp") && dout.guards_intact("dout"));
    const std::vector<float> bias_values = dbias.read();
    EXPECT_TRUE(dbias.guards_intact("dbias"));
    if (bias) {
      EXPECT_TRUE(identical(partials.read(), expected_partials.read(), "column partials"));
      EXPECT_TRUE(partials.guards_intact("column partials"));
      EXPECT_TRUE(identical(bias_values, expected_bias, "dbias"));
      EXPECT_TRUE(close_to_column_sums(bias_values, sums, rows)) << "dbias";
      if (sums.sums != in.dbias) {
        EXPECT_FALSE(identical(bias_values, in.dbias, "dbias")) << "dbias unchanged";
      }
    } else {
      EXPECT_TRUE(identical(bias_values, in.dbias, "dbias (not passed)"));
      EXPECT_TRUE(partials.untouched("column partials (no dbias)"));
    }
    if (n > 0) expect_edges_seen(actual.results, n, v);
  }
}

template <typename Fn>
void for_both_input_types(Fn&& fn) {
  fn(float{});
  fn(uint16_t{});
}

// Pair tiles of 32 rows x 128 columns: partial tiles in either dimension, C not a multiple of 4 (one by
// one), rows not a multiple of 4 (the transposed codes byte by byte), a single pair column or row, and the
// MLP width of Llama 3 1B (C = 8192).
constexpr octet::testing::Shape2D kSwigluBackwardShapes[] = {{1, 1},    {7, 13},    {33, 48},    {64, 256},
                                                             {37, 200}, {130, 384}, {128, 1536}, {32, 8192},
                                                             {2333, 1}, {1, 3221},  {0, 5},      {5, 0}};

TEST(FusedSwigluBackwardCast, MatchesUnfused) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2100;
  for (const auto& shape : kSwigluBackwardShapes) {
    for (Variant v : sweep_variants()) {
      for (const bool bias : {true, false}) {
        v.seed = ++seed;
        for_both_input_types(
            [&](auto in) { check_swiglu_backward<decltype(in)>(shape.rows, shape.cols, v, bias); });
      }
    }
  }
}

TEST(FusedSwigluBackwardCast, UnalignedPointers) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2200;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 96}, {64, 768}, {7, 13}}) {
    for (Variant v : unaligned_variants()) {
      v.seed = ++seed;
      for_both_input_types(
          [&](auto in) { check_swiglu_backward<decltype(in)>(shape.rows, shape.cols, v, true); });
    }
  }
}

TEST(FusedSwigluBackwardCast, NanGradient) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2300;
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 768}}) {
    for (Variant v : nan_variants()) {
      v.seed = ++seed;
      for_both_input_types(
          [&](auto in) { check_swiglu_backward<decltype(in)>(shape.rows, shape.cols, v, true); });
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// BF16 outputs: LayerNorm and GELU writing the input of a layer whose GEMMs are BF16, GELU's backward
// writing that layer's output gradient, the bias gradient converting a BF16 backward's float32 output
// gradient in its own pass, and AdamW writing a BF16 layer's weight copy. Against the float32 op on the
// device, its values rounded on the host by the CPU's encoder (octet::float_to_bf16); mean, rstd and the
// bias sums must be the same bits as the float32 op's.

struct Bf16Case {
  int64_t rows, cols;
  size_t offset;  // bytes before the bf16 output (and a bf16 input): 2 breaks 8-byte alignment
  bool plant_nan;
};

// Row splits of the column sums: one ([1, 768]), two ([33, 97]) and many ([4096, 768]).
constexpr Bf16Case kBf16Cases[] = {{1, 768, 0, false}, {33, 97, 0, false},   {64, 768, 2, false},
                                   {7, 13, 2, true},   {4096, 768, 0, true}, {256, 3072, 2, false}};

std::string describe(const char* op, const Bf16Case& c) {
  std::ostringstream s;
  s << op << " [" << c.rows << ", " << c.cols << "] offset " << c.offset << (c.plant_nan ? " +NaN" : "");
  return s.str();
}

// Values across bf16's range: random, subnormal, zeros of both signs, ties, and past its largest finite
// value (rounding to Inf).
std::vector<float> bf16_edge_values(size_t n, uint64_t seed, bool plant_nan) {
  std::vector<float> x = octet::testing::random_normal(n, seed, 2.0f);
  for (size_t i = 3; i < n; i += 17) x[i] = 1.0e-39f;  // a float32 subnormal, kept by bf16 (rounded)
  for (size_t i = 5; i < n; i += 19) x[i] = -0.0f;
  for (size_t i = 7; i < n; i += 23) x[i] = 1.0f + 0x1p-8f;  // halfway between two bf16 values: to even
  for (size_t i = 11; i < n; i += 29) x[i] = -3.4e38f;       // rounds past bf16's largest finite: -Inf
  if (plant_nan && n > 0) x[n / 2] = std::numeric_limits<float>::quiet_NaN();
  return x;
}

TEST(Bf16Outputs, LayerNormWritesItsFloat32ValuesRounded) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2100;
  for (const Bf16Case& c : kBf16Cases) {
    SCOPED_TRACE(describe("layernorm", c));
    const auto n = static_cast<size_t>(c.rows * c.cols), channels = static_cast<size_t>(c.cols);
    std::vector<float> inp = octet::testing::random_normal(n, ++seed, 2.0f);
    const std::vector<float> weight = bf16_edge_values(channels, ++seed, false);
    const std::vector<float> bias = octet::testing::random_normal(channels, ++seed, 0.5f);
    if (c.plant_nan) inp[n / 2] = std::numeric_limits<float>::quiet_NaN();  // a whole row of NaN
    octet::cuda::Stream stream;
    Guarded<float> inp_device(n), weight_device(channels), bias_device(channels);
    inp_device.upload(inp);
    weight_device.upload(weight);
    bias_device.upload(bias);
    const auto rows = static_cast<size_t>(c.rows);
    Guarded<float> expected_out(n), expected_mean(rows), expected_rstd(rows), mean(rows), rstd(rows);
    Guarded<uint16_t> out(n, c.offset);
    octet::cuda::layernorm_forward(expected_out.data(), expected_mean.data(), expected_rstd.data(),
                                   inp_device.data(), weight_device.data(), bias_device.data(), c.rows,
                                   c.cols, stream.get());
    octet::cuda::layernorm_forward(out.data(), mean.data(), rstd.data(), inp_device.data(),
                                   weight_device.data(), bias_device.data(), c.rows, c.cols, stream.get());
    stream.synchronize();
    const std::vector<uint16_t> expected = bf16_bits(expected_out.read());
    EXPECT_TRUE(identical(out.read(), expected, "out"));
    EXPECT_TRUE(out.guards_intact("out"));
    EXPECT_TRUE(identical(mean.read(), expected_mean.read(), "mean"));
    EXPECT_TRUE(identical(rstd.read(), expected_rstd.read(), "rstd"));
    const std::vector<uint16_t> written = out.read();
    const auto infinite = [](uint16_t b) { return (b & 0x7FFFu) == 0x7F80u; };
    if (n >= 768) {
      EXPECT_NE(std::count_if(written.begin(), written.end(), infinite), 0) << "no Inf from rounding";
    }
    if (c.plant_nan) {
      EXPECT_NE(std::count(written.begin(), written.end(), uint16_t{0x7FFF}), 0) << "NaN row";
    }
  }
}

TEST(Bf16Outputs, GeluForwardAndBackwardWriteTheirFloat32ValuesRounded) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2200;
  for (const Bf16Case& c : kBf16Cases) {
    SCOPED_TRACE(describe("gelu", c));
    const auto n = static_cast<size_t>(c.rows * c.cols);
    const std::vector<float> x = bf16_edge_values(n, ++seed, c.plant_nan);
    const std::vector<uint16_t> x_bits = bf16_bits(x);
    octet::cuda::Stream stream;
    Guarded<float> x_device(n), x_widened(n), expected_out(n), expected_from_bf16(n);
    Guarded<uint16_t> x_bf16(n, c.offset), out(n, c.offset), out_from_bf16(n, c.offset);
    x_device.upload(x);
    x_widened.upload(widened(x_bits));
    x_bf16.upload(x_bits);
    octet::cuda::gelu_forward(expected_out.data(), x_device.data(), c.rows * c.cols, stream.get());
    octet::cuda::gelu_forward(expected_from_bf16.data(), x_widened.data(), c.rows * c.cols, stream.get());
    octet::cuda::gelu_forward(out.data(), x_device.data(), c.rows * c.cols, stream.get());
    octet::cuda::gelu_forward(out_from_bf16.data(), x_bf16.data(), c.rows * c.cols, stream.get());
    stream.synchronize();
    EXPECT_TRUE(identical(out.read(), bf16_bits(expected_out.read()), "out from float32"));
    EXPECT_TRUE(identical(out_from_bf16.read(), bf16_bits(expected_from_bf16.read()), "out from bf16"));
    EXPECT_TRUE(out.guards_intact("out") && out_from_bf16.guards_intact("out from bf16"));
    EXPECT_TRUE(identical(x_bf16.read(), x_bits, "inp (an input)"));
    if (c.plant_nan) {
      const std::vector<uint16_t> written = out.read();
      EXPECT_EQ(written[n / 2], uint16_t{0x7FFF}) << "the NaN input's output";
    }

    // The backward: dinp = dout * gelu'(x), rounded once.
    const std::vector<float> d = octet::testing::random_normal(n, ++seed, 1.0f);
    const std::vector<uint16_t> d_bits = bf16_bits(d);
    Guarded<float> d_device(n), d_widened(n), expected_dinp(n), expected_dinp_from_bf16(n);
    Guarded<uint16_t> d_bf16(n, c.offset), dinp(n, c.offset), dinp_from_bf16(n, c.offset);
    d_device.upload(d);
    d_widened.upload(widened(d_bits));
    d_bf16.upload(d_bits);
    octet::cuda::gelu_backward(expected_dinp.data(), x_device.data(), d_device.data(), c.rows * c.cols,
                               stream.get());
    octet::cuda::gelu_backward(expected_dinp_from_bf16.data(), x_widened.data(), d_widened.data(),
                               c.rows * c.cols, stream.get());
    octet::cuda::gelu_backward(dinp.data(), x_device.data(), d_device.data(), c.rows * c.cols, stream.get());
    octet::cuda::gelu_backward(dinp_from_bf16.data(), x_bf16.data(), d_bf16.data(), c.rows * c.cols,
                               stream.get());
    stream.synchronize();
    EXPECT_TRUE(identical(dinp.read(), bf16_bits(expected_dinp.read()), "dinp from float32"));
    EXPECT_TRUE(
        identical(dinp_from_bf16.read(), bf16_bits(expected_dinp_from_bf16.read()), "dinp from bf16"));
    EXPECT_TRUE(dinp.guards_intact("dinp") && dinp_from_bf16.guards_intact("dinp from bf16"));
  }
}

TEST(Bf16Outputs, BiasGradientConvertsItsOutputGradientInTheSamePass) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2300;
  for (const Bf16Case& c : kBf16Cases) {
    SCOPED_TRACE(describe("bias backward convert", c));
    const auto n = static_cast<size_t>(c.rows * c.cols), channels = static_cast<size_t>(c.cols);
    std::vector<float> dout = bf16_edge_values(n, ++seed, false);
    for (float& x : dout) x = std::isinf(octet::bf16_to_float(octet::float_to_bf16(x))) ? 0.25f : x;
    dout[n - 1] = -3.4e38f;  // one value that rounds to -Inf in the copy; the last row's sum stays finite
    if (c.plant_nan) dout[n / 2] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> dbias0 = octet::testing::random_normal(channels, ++seed, 1.0f);
    octet::cuda::Stream stream;
    octet::cuda::Workspace workspace;
    Guarded<float> dout_device(n, c.offset * 2), expected_dbias(channels), dbias(channels);
    Guarded<uint16_t> copy(n, c.offset);
    dout_device.upload(dout);
    expected_dbias.upload(dbias0);
    octet::cuda::bias_backward(expected_dbias.data(), dout_device.data(), c.rows, c.cols, workspace,
                               stream.get());
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      dbias.upload(dbias0);
      octet::cuda::bias_backward_convert(dbias.data(), reinterpret_cast<__nv_bfloat16*>(copy.data()),
                                         dout_device.data(), c.rows, c.cols, workspace, stream.get());
      stream.synchronize();
      const std::vector<float> sums = dbias.read();
      EXPECT_TRUE(identical(sums, expected_dbias.read(), "dbias (bias_backward's bits)"));
      EXPECT_FALSE(identical(sums, dbias0, "dbias")) << "dbias unchanged";
      if (run == 1) {
        EXPECT_TRUE(identical(sums, first, "dbias, second run"));
      }
      first = sums;
    }
    EXPECT_TRUE(identical(copy.read(), bf16_bits(dout), "the bf16 copy"));
    EXPECT_TRUE(copy.guards_intact("the bf16 copy") && dbias.guards_intact("dbias"));
    EXPECT_TRUE(identical(dout_device.read(), dout, "dout (an input)"));
  }
}

TEST(Bf16Outputs, AdamWWritesTheUpdatedWeightsRounded) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2400;
  const Hyper h;
  for (const Bf16Case& c : kBf16Cases) {
    SCOPED_TRACE(describe("adamw convert", c));
    const auto n = static_cast<size_t>(c.rows * c.cols);
    Variant variant;
    variant.seed = ++seed;
    variant.plant_nan = c.plant_nan;
    const AdamWState initial = adamw_inputs(n, variant);
    octet::cuda::Stream stream;
    DeviceAdamW expected(n, 0), state(n, c.offset * 2);
    Guarded<uint16_t> copy(n, c.offset);
    expected.upload(initial);
    state.upload(initial);
    octet::cuda::adamw_update(expected.params.data(), expected.m.data(), expected.v.data(),
                              expected.grads.data(), c.rows * c.cols, h.learning_rate, h.beta1, h.beta2,
                              h.eps, h.weight_decay, h.step, h.grad_scale, stream.get());
    octet::cuda::adamw_update_convert(state.params.data(), state.m.data(), state.v.data(), state.grads.data(),
                                      reinterpret_cast<__nv_bfloat16*>(copy.data()), c.rows * c.cols,
                                      h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay, h.step,
                                      h.grad_scale, stream.get());
    stream.synchronize();
    const std::vector<float> params = expected.params.read();
    EXPECT_TRUE(identical(state.params.read(), params, "params"));
    EXPECT_TRUE(identical(state.m.read(), expected.m.read(), "m"));
    EXPECT_TRUE(identical(state.v.read(), expected.v.read(), "v"));
    EXPECT_TRUE(identical(state.grads.read(), initial.grads, "grads (an input)"));
    EXPECT_TRUE(identical(copy.read(), bf16_bits(params), "the bf16 copy"));
    EXPECT_TRUE(copy.guards_intact("the bf16 copy") && state.params.guards_intact("params"));
    EXPECT_FALSE(identical(params, initial.params, "params")) << "params unchanged";
  }
}

// adamw_update_converts over every case at once (with decay on every other one; the unaligned copies and the
// sizes not a multiple of 4 go one by one) against adamw_update_convert on each alone, bit for bit. Twice
// from the same state: the second call finds its table uploaded.
TEST(Bf16Outputs, ManyAdamWConvertsMatchOneByOne) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2450;
  const Hyper h;
  octet::cuda::Stream stream;
  std::vector<AdamWState> initial;
  std::vector<std::unique_ptr<DeviceAdamW>> expected, state;
  std::vector<std::unique_ptr<Guarded<uint16_t>>> expected_copy, copy;
  for (const Bf16Case& c : kBf16Cases) {
    const auto n = static_cast<size_t>(c.rows * c.cols);
    Variant variant;
    variant.seed = ++seed;
    variant.plant_nan = c.plant_nan;
    initial.push_back(adamw_inputs(n, variant));
    expected.push_back(std::make_unique<DeviceAdamW>(n, 0));
    state.push_back(std::make_unique<DeviceAdamW>(n, c.offset * 2));
    expected_copy.push_back(std::make_unique<Guarded<uint16_t>>(n, 0));
    copy.push_back(std::make_unique<Guarded<uint16_t>>(n, c.offset));
  }
  auto decayed = [](size_t k) { return k % 2 == 0; };
  for (size_t k = 0; k < std::size(kBf16Cases); ++k) {
    const int64_t n = kBf16Cases[k].rows * kBf16Cases[k].cols;
    DeviceAdamW& e = *expected[k];
    e.upload(initial[k]);
    octet::cuda::adamw_update_convert(e.params.data(), e.m.data(), e.v.data(), e.grads.data(),
                                      reinterpret_cast<__nv_bfloat16*>(expected_copy[k]->data()), n,
                                      h.learning_rate, h.beta1, h.beta2, h.eps,
                                      decayed(k) ? h.weight_decay : 0.0f, h.step, h.grad_scale, stream.get());
  }
  stream.synchronize();
  octet::cuda::AdamWConvertTable table;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    std::vector<octet::cuda::AdamWConvertWeight> weights;
    for (size_t k = 0; k < std::size(kBf16Cases); ++k) {
      DeviceAdamW& d = *state[k];
      d.upload(initial[k]);
      weights.push_back({d.params.data(), d.m.data(), d.v.data(), d.grads.data(),
                         reinterpret_cast<__nv_bfloat16*>(copy[k]->data()),
                         kBf16Cases[k].rows * kBf16Cases[k].cols, decayed(k)});
    }
    octet::cuda::adamw_update_converts(weights, h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay,
                                       h.step, h.grad_scale, table, stream.get());
    stream.synchronize();
    for (size_t k = 0; k < std::size(kBf16Cases); ++k) {
      SCOPED_TRACE(describe("adamw_update_converts", kBf16Cases[k]));
      const std::vector<float> params = expected[k]->params.read();
      EXPECT_TRUE(identical(state[k]->params.read(), params, "params"));
      EXPECT_TRUE(identical(state[k]->m.read(), expected[k]->m.read(), "m"));
      EXPECT_TRUE(identical(state[k]->v.read(), expected[k]->v.read(), "v"));
      EXPECT_TRUE(identical(copy[k]->read(), expected_copy[k]->read(), "the bf16 copy"));
      EXPECT_TRUE(copy[k]->guards_intact("the bf16 copy") && state[k]->params.guards_intact("params") &&
                  state[k]->m.guards_intact("m") && state[k]->v.guards_intact("v"));
      EXPECT_FALSE(identical(params, initial[k].params, "params")) << "params unchanged";
    }
  }
}

// Column sums (bias_backward) come out the same, bit for bit, for every layout of a shape: float32 or the
// bf16 of the same values, at aligned addresses (vector loads) or one element off (scalar loads), since the
// order of the additions depends on the shape only. They stay within float32 reduction bounds of float64
// sums, add to the old values, repeat exactly, and a NaN reaches its own column only.
TEST(ColumnSums, EveryLayoutOfAShapeSumsTheSameBits) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t rows, cols;
  };
  uint64_t seed = 2500;
  for (const Shape s : {Shape{1, 1}, Shape{7, 5}, Shape{33, 130}, Shape{333, 768}, Shape{4099, 2304},
                        Shape{32768, 768}, Shape{8192, 6400}}) {
    SCOPED_TRACE("rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols));
    const auto n = static_cast<size_t>(s.rows * s.cols), channels = static_cast<size_t>(s.cols);
    // bf16 values, so that the float32 and bf16 inputs hold the same numbers.
    std::vector<float> dout = octet::testing::random_normal(n, ++seed, 1.0f);
    for (float& x : dout) x = octet::bf16_to_float(octet::float_to_bf16(x));
    const size_t nan_column = channels / 2;
    if (s.rows > 1) dout[channels + nan_column] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<uint16_t> dout_bits = bf16_bits(dout);
    const std::vector<float> dbias0 = octet::testing::random_normal(channels, ++seed, 1.0f);
    std::vector<float> finite = dout;
    if (s.rows > 1) finite[channels + nan_column] = 0.0f;
    const ColumnSumReference reference = column_sum_reference(finite, dbias0, s.rows, s.cols);

    octet::cuda::Stream stream;
    octet::cuda::Workspace workspace;
    std::vector<std::vector<float>> results;
    for (const size_t offset : {size_t{0}, size_t{1}}) {
      Guarded<float> as_float(n, offset * sizeof(float));
      Guarded<uint16_t> as_bf16(n, offset * sizeof(uint16_t));
      Guarded<float> from_float(channels), from_bf16(channels);
      as_float.upload(dout);
      as_bf16.upload(dout_bits);
      from_float.upload(dbias0);
      from_bf16.upload(dbias0);
      octet::cuda::bias_backward(from_float.data(), as_float.data(), s.rows, s.cols, workspace, stream.get());
      octet::cuda::bias_backward(from_bf16.data(), as_bf16.data(), s.rows, s.cols, workspace, stream.get());
      stream.synchronize();
      results.push_back(from_float.read());
      results.push_back(from_bf16.read());
      EXPECT_TRUE(from_float.guards_intact("dbias") && from_bf16.guards_intact("dbias"));
    }
    const std::vector<float>& first = results.front();
    EXPECT_TRUE(identical(results[1], first, "from bf16, aligned"));
    EXPECT_TRUE(identical(results[2], first, "from float32, one element off"));
    EXPECT_TRUE(identical(results[3], first, "from bf16, one element off"));
    std::vector<float> checked = first;
    if (s.rows > 1) {
      EXPECT_TRUE(std::isnan(first[nan_column])) << "the NaN's column";
      checked[nan_column] = reference.sums[nan_column];
      for (size_t c = 0; c < channels; ++c) {
        if (c != nan_column) {
          EXPECT_FALSE(std::isnan(first[c])) << "column " << c;
        }
      }
    }
    EXPECT_TRUE(close_to_column_sums(checked, reference, s.rows));
  }
}

// LayerNorm's backward over a bf16 output gradient gives the bits it gives over the gradient's float32
// values. At C = 1152 and 1600 the bf16 gradient's rows are held in registers (9 and 13 packs a lane, some
// past C) and the float32 one's streamed, so this also holds those two kernels to the same bits; at C = 4,
// 768 and 2000 both are streamed. dinp and the joint dweight, dbias accumulate onto non-zero values.
TEST(Bf16Outputs, LayerNormBackwardReadsBf16AsItsFloat32Values) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t rows, cols;
  };
  uint64_t seed = 2550;
  for (const Shape s : {Shape{1, 4}, Shape{37, 768}, Shape{70, 1152}, Shape{300, 1600}, Shape{45, 2000}}) {
    SCOPED_TRACE("rows=" + std::to_string(s.rows) + " cols=" + std::to_string(s.cols));
    const auto n = static_cast<size_t>(s.rows * s.cols), channels = static_cast<size_t>(s.cols);
    const auto rows = static_cast<size_t>(s.rows);
    std::vector<float> dout = octet::testing::random_normal(n, ++seed, 1.0f);
    for (float& x : dout) x = octet::bf16_to_float(octet::float_to_bf16(x));
    std::vector<float> inp = octet::testing::random_normal(n, ++seed, 2.0f);
    for (float& x : inp) x += 0.5f;
    const std::vector<float> weight = octet::testing::random_normal(channels, ++seed, 1.0f);
    const std::vector<float> bias = octet::testing::random_normal(channels, ++seed, 0.5f);
    const std::vector<float> dinp0 = octet::testing::random_normal(n, ++seed, 1.0f);
    const std::vector<float> dparams0 = octet::testing::random_normal(2 * channels, ++seed, 1.0f);

    octet::cuda::Stream stream;
    octet::cuda::Workspace workspace;
    Guarded<float> inp_device(n), weight_device(channels), bias_device(channels), out(n), mean(rows),
        rstd(rows), dout_float(n);
    Guarded<uint16_t> dout_bf16(n);
    inp_device.upload(inp);
    weight_device.upload(weight);
    bias_device.upload(bias);
    dout_float.upload(dout);
    dout_bf16.upload(bf16_bits(dout));
    octet::cuda::layernorm_forward(out.data(), mean.data(), rstd.data(), inp_device.data(),
                                   weight_device.data(), bias_device.data(), s.rows, s.cols, stream.get());
    std::vector<std::vector<float>> dinp, dparams;
    for (const bool bf16 : {false, true, true}) {
      Guarded<float> dinp_device(n), dparams_device(2 * channels);
      dinp_device.upload(dinp0);
      dparams_device.upload(dparams0);
      if (bf16) {
        octet::cuda::layernorm_backward(dinp_device.data(), dparams_device.data(),
                                        dparams_device.data() + s.cols, dout_bf16.data(), inp_device.data(),
                                        weight_device.data(), mean.data(), rstd.data(), s.rows, s.cols,
                                        workspace, stream.get());
      } else {
        octet::cuda::layernorm_backward(dinp_device.data(), dparams_device.data(),
                                        dparams_device.data() + s.cols, dout_float.data(), inp_device.data(),
                                        weight_device.data(), mean.data(), rstd.data(), s.rows, s.cols,
                                        workspace, stream.get());
      }
      stream.synchronize();
      EXPECT_TRUE(dinp_device.guards_intact("dinp") && dparams_device.guards_intact("dweight, dbias"));
      dinp.push_back(dinp_device.read());
      dparams.push_back(dparams_device.read());
    }
    EXPECT_TRUE(identical(dinp[1], dinp[0], "dinp from the bf16 gradient"));
    EXPECT_TRUE(identical(dparams[1], dparams[0], "dweight, dbias from the bf16 gradient"));
    EXPECT_TRUE(identical(dinp[2], dinp[1], "dinp, second run"));
    EXPECT_TRUE(identical(dparams[2], dparams[1], "dweight, dbias, second run"));
    EXPECT_EQ(std::count_if(dinp[0].begin(), dinp[0].end(), [](float x) { return !std::isfinite(x); }), 0);
    EXPECT_EQ(std::count_if(dparams[0].begin(), dparams[0].end(), [](float x) { return !std::isfinite(x); }),
              0);
    EXPECT_FALSE(identical(dinp[0], dinp0, "dinp")) << "dinp unchanged";
    EXPECT_FALSE(identical(dparams[0], dparams0, "dweight, dbias")) << "dweight, dbias unchanged";
  }
}

// adamw_update on each segment of `state` alone, one call per segment (the segments' gradients at their
// offsets in state.grads), finished before it returns.
void adamw_each_segment(DeviceAdamW& state, std::span<const octet::Backend::UpdateSegment> segments,
                        const Hyper& h, octet::cuda::Stream& stream) {
  for (const octet::Backend::UpdateSegment& s : segments) {
    octet::cuda::adamw_update(state.params.data() + s.offset, state.m.data() + s.offset,
                              state.v.data() + s.offset, state.grads.data() + s.offset, s.count,
                              h.learning_rate, h.beta1, h.beta2, h.eps, s.weight_decay, h.step, h.grad_scale,
                              stream.get());
  }
  stream.synchronize();
}

// The optimizer update over plain segments (one launch over many tensors) gives adamw_update's bits on each
// segment, with its own weight decay, at any offset and length, and leaves the gaps between segments alone.
TEST(AdamWSegments, OneLaunchGivesEachSegmentsOwnUpdate) {
  SKIP_WITHOUT_GPU();
  const Hyper h;
  using Segment = octet::Backend::UpdateSegment;
  // Lengths around the kernel's chunk, offsets off 16 bytes, a gap, decay on some; 40000 + 5 elements.
  const std::vector<Segment> segments = {
      {0, 768, 0.0f},  {768, 3, h.weight_decay},      {771, 4096, 0.0f},   {4867, 4097, h.weight_decay},
      {9000, 1, 0.0f}, {9004, 20000, h.weight_decay}, {29004, 11001, 0.0f}};
  const size_t n = 40005;
  Variant variant;
  variant.seed = 2600;
  variant.plant_nan = true;
  const AdamWState initial = adamw_inputs(n, variant);
  const auto backend = octet::make_cuda_backend();
  octet::cuda::Stream stream;
  DeviceAdamW expected(n, 0), state(n, 0);
  expected.upload(initial);
  for (int run = 0; run < 2; ++run) {  // the second run reuses the uploaded chunk table
    SCOPED_TRACE(run == 0 ? "first run" : "second run");
    state.upload(initial);
    if (run == 0) adamw_each_segment(expected, segments, h, stream);
    backend->optimizer_update(
        step_of(h), {state.params.data(), state.m.data(), state.v.data(), state.grads.data()}, segments);
    backend->synchronize();
    const std::vector<float> params = state.params.read();
    EXPECT_TRUE(identical(params, expected.params.read(), "params"));
    EXPECT_TRUE(identical(state.m.read(), expected.m.read(), "m"));
    EXPECT_TRUE(identical(state.v.read(), expected.v.read(), "v"));
    EXPECT_TRUE(identical(state.grads.read(), initial.grads, "grads (an input)"));
    EXPECT_EQ(params[9002], initial.params[9002]) << "the gap between segments";
    EXPECT_NE(params[28000], initial.params[28000]) << "params unchanged";
    EXPECT_TRUE(state.params.guards_intact("params") && state.v.guards_intact("v"));
  }
}

// The segmented AdamW with each segment's gradient at its own offset (UpdateSegment::grad_offset, where the
// model keeps some gradients apart): the bits of adamw_update over the gradient found there, with the
// gradients shifted by whole float4s (vector loads) and by one float (scalar loads).
TEST(AdamWSegments, GradientsAtTheirOwnOffsets) {
  SKIP_WITHOUT_GPU();
  const Hyper h;
  using Segment = octet::Backend::UpdateSegment;
  const size_t n = 12000;
  Variant variant;
  variant.seed = 2650;
  const AdamWState initial = adamw_inputs(n, variant);
  const auto backend = octet::make_cuda_backend();
  octet::cuda::Stream stream;
  for (const int64_t shift : {int64_t{8}, int64_t{1}}) {
    SCOPED_TRACE("gradients shifted by " + std::to_string(shift));
    // The segments' gradients in reverse order, `shift` floats into their buffer.
    const std::vector<Segment> segments = {{0, 5000, h.weight_decay, shift + 7000},
                                           {5000, 7000, 0.0f, shift}};
    std::vector<float> moved(n + static_cast<size_t>(shift), 0.0f);
    std::copy_n(initial.grads.begin(), 5000, moved.begin() + shift + 7000);
    std::copy_n(initial.grads.begin() + 5000, 7000, moved.begin() + shift);
    Guarded<float> grads(moved.size(), 0);
    grads.upload(moved);
    DeviceAdamW expected(n, 0), state(n, 0);
    expected.upload(initial);
    state.upload(initial);
    adamw_each_segment(expected, segments, h, stream);
    backend->optimizer_update(step_of(h), {state.params.data(), state.m.data(), state.v.data(), grads.data()},
                              segments);
    backend->synchronize();
    EXPECT_TRUE(identical(state.params.read(), expected.params.read(), "params"));
    EXPECT_TRUE(identical(state.m.read(), expected.m.read(), "m"));
    EXPECT_TRUE(identical(state.v.read(), expected.v.read(), "v"));
    EXPECT_FALSE(identical(state.params.read(), initial.params, "params")) << "params unchanged";
  }
}

// A weight gradient stored in bf16 (train.weight_gradients = "bf16") is read as its float32 values: AdamW
// with the FP8 cast (adamw_update_casts) and with the BF16 copy (adamw_update_converts) gives, bit for bit,
// what it gives from a float32 gradient holding the same values, in the one launch and one by one (odd
// sizes, and a gradient 2 bytes off 8-byte alignment); NaN included; so does the plain update of a weight
// whose copy is made apart (adamw_update). The gradient norm's sum of squares over
// the bf16 bits is the one over those float32 values, at aligned and unaligned addresses.
TEST(Bf16WeightGradients, AdamWAndTheNormReadThemAsTheirValues) {
  SKIP_WITHOUT_GPU();
  const Hyper h;
  octet::cuda::Stream stream;
  DeviceScale scale;
  uint64_t seed = 2800;
  std::vector<AdamWState> initial;
  std::vector<std::unique_ptr<Guarded<uint16_t>>> grads16;
  for (const Bf16Case& c : kBf16Cases) {
    const auto n = static_cast<size_t>(c.rows * c.cols);
    Variant variant;
    variant.seed = ++seed;
    variant.plant_nan = c.plant_nan;
    AdamWState s = adamw_inputs(n, variant);
    for (float& g : s.grads) g = octet::bf16_to_float(octet::float_to_bf16(g));
    grads16.push_back(std::make_unique<Guarded<uint16_t>>(n, c.offset));
    grads16.back()->upload(bf16_bits(s.grads));
    initial.push_back(std::move(s));
  }
  auto decayed = [](size_t k) { return k % 2 == 1; };
  const size_t cases = std::size(kBf16Cases);
  for (const bool casts : {true, false}) {
    SCOPED_TRACE(casts ? "adamw_update_casts" : "adamw_update_converts");
    std::vector<std::unique_ptr<DeviceAdamW>> expected, state;
    std::vector<std::unique_ptr<CastSlots>> expected_cast, cast;
    std::vector<std::unique_ptr<Guarded<uint16_t>>> expected_copy, copy;
    for (size_t k = 0; k < cases; ++k) {
      const auto n = static_cast<size_t>(kBf16Cases[k].rows * kBf16Cases[k].cols);
      expected.push_back(std::make_unique<DeviceAdamW>(n, 0));
      state.push_back(std::make_unique<DeviceAdamW>(n, 0));
      expected[k]->upload(initial[k]);
      state[k]->upload(initial[k]);
      expected_cast.push_back(std::make_unique<CastSlots>(n, 0));
      cast.push_back(std::make_unique<CastSlots>(n, 0));
      expected_copy.push_back(std::make_unique<Guarded<uint16_t>>(n, 0));
      copy.push_back(std::make_unique<Guarded<uint16_t>>(n, 0));
    }
    if (casts) {
      octet::cuda::AdamWCastTable expected_table, table;
      std::vector<octet::cuda::AdamWCastWeight> from_f32, from_bf16;
      for (size_t k = 0; k < cases; ++k) {
        const Bf16Case& c = kBf16Cases[k];
        DeviceAdamW& e = *expected[k];
        DeviceAdamW& d = *state[k];
        from_f32.push_back({e.params.data(), e.m.data(), e.v.data(), e.grads.data(), c.rows, c.cols,
                            decayed(k), expected_cast[k]->fused(Dtype::e4m3, scale.data(), true)});
        octet::cuda::AdamWCastWeight w{
            d.params.data(), d.m.data(), d.v.data(), nullptr,
            c.rows,          c.cols,     decayed(k), cast[k]->fused(Dtype::e4m3, scale.data(), true)};
        w.grads_bf16 = grads16[k]->data();
        from_bf16.push_back(w);
      }
      octet::cuda::adamw_update_casts(from_f32, h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay,
                                      h.step, h.grad_scale, expected_table, stream.get());
      octet::cuda::adamw_update_casts(from_bf16, h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay,
                                      h.step, h.grad_scale, table, stream.get());
    } else {
      octet::cuda::AdamWConvertTable expected_table, table;
      std::vector<octet::cuda::AdamWConvertWeight> from_f32, from_bf16;
      for (size_t k = 0; k < cases; ++k) {
        const int64_t n = kBf16Cases[k].rows * kBf16Cases[k].cols;
        DeviceAdamW& e = *expected[k];
        DeviceAdamW& d = *state[k];
        from_f32.push_back({e.params.data(), e.m.data(), e.v.data(), e.grads.data(),
                            reinterpret_cast<__nv_bfloat16*>(expected_copy[k]->data()), n, decayed(k)});
        octet::cuda::AdamWConvertWeight w{d.params.data(),
                                          d.m.data(),
                                          d.v.data(),
                                          nullptr,
                                          reinterpret_cast<__nv_bfloat16*>(copy[k]->data()),
                                          n,
                                          decayed(k)};
        w.grads_bf16 = grads16[k]->data();
        from_bf16.push_back(w);
      }
      octet::cuda::adamw_update_converts(from_f32, h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay,
                                         h.step, h.grad_scale, expected_table, stream.get());
      octet::cuda::adamw_update_converts(from_bf16, h.learning_rate, h.beta1, h.beta2, h.eps, h.weight_decay,
                                         h.step, h.grad_scale, table, stream.get());
    }
    stream.synchronize();
    for (size_t k = 0; k < cases; ++k) {
      SCOPED_TRACE(describe("bf16 gradient", kBf16Cases[k]));
      const std::vector<float> params = expected[k]->params.read();
      EXPECT_TRUE(identical(state[k]->params.read(), params, "params"));
      EXPECT_TRUE(identical(state[k]->m.read(), expected[k]->m.read(), "m"));
      EXPECT_TRUE(identical(state[k]->v.read(), expected[k]->v.read(), "v"));
      if (casts) {
        expect_same_cast(cast[k]->read(true), expected_cast[k]->read(true));
      } else {
        EXPECT_TRUE(identical(copy[k]->read(), expected_copy[k]->read(), "the bf16 copy"));
      }
      EXPECT_TRUE(grads16[k]->guards_intact("the bf16 gradient"));
      EXPECT_FALSE(identical(params, initial[k].params, "params")) << "params unchanged";
    }
  }

  // The plain update (a weight whose copy is made apart: the current recipe's cast), over the bf16 bits and
  // over their float32 values.
  for (size_t k = 0; k < cases; ++k) {
    SCOPED_TRACE(describe("adamw_update over a bf16 gradient", kBf16Cases[k]));
    const auto n = static_cast<int64_t>(initial[k].grads.size());
    DeviceAdamW expected(initial[k].grads.size(), 0), state(initial[k].grads.size(), 0);
    expected.upload(initial[k]);
    state.upload(initial[k]);
    octet::cuda::adamw_update(expected.params.data(), expected.m.data(), expected.v.data(),
                              expected.grads.data(), n, h.learning_rate, h.beta1, h.beta2, h.eps,
                              h.weight_decay, h.step, h.grad_scale, stream.get());
    octet::cuda::adamw_update(state.params.data(), state.m.data(), state.v.data(),
                              static_cast<const uint16_t*>(grads16[k]->data()), n, h.learning_rate, h.beta1,
                              h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale, stream.get());
    stream.synchronize();
    const std::vector<float> params = expected.params.read();
    EXPECT_TRUE(identical(state.params.read(), params, "params"));
    EXPECT_TRUE(identical(state.m.read(), expected.m.read(), "m"));
    EXPECT_TRUE(identical(state.v.read(), expected.v.read(), "v"));
    EXPECT_FALSE(identical(params, initial[k].params, "params")) << "params unchanged";
  }

  // The norm: the backend's sum of squares over the bf16 bits and over their float32 values.
  const auto backend = octet::make_cuda_backend();
  for (size_t k = 0; k < cases; ++k) {
    SCOPED_TRACE(describe("sum_of_squares of bf16", kBf16Cases[k]));
    const auto n = static_cast<int64_t>(initial[k].grads.size());
    Guarded<float> f32(initial[k].grads.size(), kBf16Cases[k].offset * 2);
    f32.upload(initial[k].grads);
    const double expected = backend->sum_of_squares(ConstTensorView(f32.data(), {n}));
    const double got = backend->sum_of_squares(ConstTensorView(grads16[k]->data(), Dtype::bf16, {n}));
    if (kBf16Cases[k].plant_nan) {
      EXPECT_TRUE(std::isnan(got)) << got;
    } else {
      EXPECT_TRUE(std::isfinite(got) && got > 0.0) << got;
      EXPECT_EQ(std::memcmp(&got, &expected, sizeof(double)), 0) << got << " against " << expected;
    }
  }
}

// The segmented zeroing (one launch) zeroes exactly its ranges, at any offset and length.
TEST(ZeroRanges, OneLaunchZeroesEachRangeAndNothingElse) {
  SKIP_WITHOUT_GPU();
  using Range = octet::Backend::Range;
  const std::vector<Range> ranges = {{0, 5}, {7, 4096}, {4103, 4097}, {8201, 1}, {8300, 10000}};
  const size_t n = 20000;
  std::vector<float> x = octet::testing::random_normal(n, 2700, 1.0f);
  for (float& v : x) v = v == 0.0f ? 1.0f : v;
  std::vector<float> expected = x;
  for (const Range& r : ranges) std::fill_n(expected.begin() + r.offset, r.count, 0.0f);
  const auto backend = octet::make_cuda_backend();
  Guarded<float> device(n, 0);
  for (int run = 0; run < 2; ++run) {  // the second run reuses the uploaded chunk table
    device.upload(x);
    backend->fill_zero_ranges(device.data(), ranges);
    backend->synchronize();
    EXPECT_TRUE(identical(device.read(), expected, run == 0 ? "first run" : "second run"));
    EXPECT_TRUE(device.guards_intact("x"));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// transpose_codes: byte for byte the host's transpose, every byte value, over shapes that take the word
// kernel (rows and cols multiples of 4, aligned) with partial 64 x 64 tiles, and the byte kernel (odd
// shapes, unaligned pointers); guards intact.

namespace {

void check_transpose(int64_t rows, int64_t cols, size_t offset, uint64_t seed) {
  const auto n = static_cast<size_t>(rows * cols);
  // Every byte value, in a seeded order.
  const std::vector<float> draws = octet::testing::random_uniform(n, seed, 0.0f, 256.0f);
  std::vector<uint8_t> codes(n);
  for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(draws[i]);
  std::vector<uint8_t> expected(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) expected[static_cast<size_t>(c * rows + r)] = codes[r * cols + c];
  }
  Guarded<uint8_t> in(n, offset);
  Guarded<uint8_t> out(n, offset);
  in.upload(codes);
  octet::cuda::Stream stream;
  octet::cuda::transpose_codes(in.data(), out.data(), rows, cols, stream.get());
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  const std::string what =
      std::to_string(rows) + " x " + std::to_string(cols) + " at +" + std::to_string(offset);
  EXPECT_TRUE(out.read() == expected) << what;
  EXPECT_TRUE(out.guards_intact(what));
  EXPECT_TRUE(in.read() == codes) << what << ": the codes are left as they were";
}

}  // namespace

TEST(TransposeCodes, MatchesTheHostTranspose) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1300;
  // Word kernel: whole tiles, partial tiles in either dimension, a GPT-2 weight's shape.
  for (const octet::testing::Shape2D shape :
       {octet::testing::Shape2D{64, 64}, {128, 192}, {4, 4}, {68, 132}, {196, 60}, {3072, 768}}) {
    check_transpose(shape.rows, shape.cols, 0, ++seed);
  }
  // Byte kernel: a dimension not a multiple of 4, or a pointer not 4-byte aligned.
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{33, 97}, {64, 66}, {1, 7}, {130, 3}}) {
    check_transpose(shape.rows, shape.cols, 0, ++seed);
  }
  check_transpose(64, 64, 1, ++seed);
  check_transpose(68, 132, 2, ++seed);
}

TEST(TransposeCodes, RefusesOverlapAndBadShapes) {
  SKIP_WITHOUT_GPU();
  octet::cuda::DeviceBuffer<uint8_t> buffer(256);
  octet::cuda::Stream stream;
  EXPECT_THROW(octet::cuda::transpose_codes(buffer.data(), buffer.data() + 8, 8, 8, stream.get()),
               octet::Error);
  EXPECT_THROW(octet::cuda::transpose_codes(buffer.data(), buffer.data() + 128, -1, 8, stream.get()),
               octet::Error);
  octet::cuda::transpose_codes(buffer.data(), buffer.data() + 128, 0, 8, stream.get());  // nothing to do
}
