// The fused FP8 cast kernel against the CPU reference octet::quantize_with_scale: codes byte for byte
// (row-major and transposed), amax, the three counts and scale_inv, on fresh seeded inputs over odd and prime
// shapes, both formats, both overflow modes and both roundings. Every device output is followed by sentinel
// bytes that must survive, to catch out-of-bounds writes. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "compare.h"
#include "octet/check.h"
#include "octet/cuda/cast.h"
#include "octet/cuda/device.h"
#include "octet/numerics/quantize.h"
#include "random.h"

namespace {

using octet::CastOptions;
using octet::Dtype;
using octet::Overflow;
using octet::QuantizedTensor;
using octet::Rounding;
using octet::cuda::CastResults;

#define SKIP_WITHOUT_GPU() \
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

constexpr size_t kGuardBytes = 64;
constexpr uint8_t kSentinel = 0xA5;

// `count` elements of T in device memory, `offset` elements into an allocation that has kGuardBytes more at
// the end. Everything starts as sentinel bytes, so that an element the kernel failed to write also shows.
template <typename T>
class Guarded {
 public:
  explicit Guarded(size_t count, size_t offset = 0)
      : count_(count), offset_(offset), bytes_((offset + count) * sizeof(T) + kGuardBytes) {
    bytes_.fill_bytes(kSentinel);
  }
  T* data() { return reinterpret_cast<T*>(bytes_.data()) + offset_; }

  void upload(std::span<const T> values) {
    if (values.empty()) return;
    OCTET_CUDA_CHECK(cudaMemcpy(data(), values.data(), values.size_bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> read() const {
    const std::vector<uint8_t> raw = all_bytes();
    std::vector<T> out(count_);
    if (count_ > 0) std::memcpy(out.data(), raw.data() + offset_ * sizeof(T), count_ * sizeof(T));
    return out;
  }
  // The bytes before the payload (when offset) and after it still hold the sentinel.
  ::testing::AssertionResult guards_intact(const char* name) const {
    const std::vector<uint8_t> raw = all_bytes();
    const size_t begin = offset_ * sizeof(T);
    const size_t end = (offset_ + count_) * sizeof(T);
    for (size_t i = 0; i < raw.size(); ++i) {
      if ((i < begin || i >= end) && raw[i] != kSentinel) {
        return ::testing::AssertionFailure() << name << ": guard byte " << i << " (payload is [" << begin
                                             << ", " << end << ")) was overwritten with " << int{raw[i]};
      }
    }
    return ::testing::AssertionSuccess();
  }
  ::testing::AssertionResult untouched(const char* name) const {
    const std::vector<uint8_t> raw = all_bytes();
    const auto written = std::find_if(raw.begin(), raw.end(), [](uint8_t b) { return b != kSentinel; });
    if (written == raw.end()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << name << " should not have been written, byte " << (written - raw.begin()) << " was";
  }

 private:
  std::vector<uint8_t> all_bytes() const {
    std::vector<uint8_t> raw(bytes_.size());
    bytes_.copy_to_host(raw);
    return raw;
  }
  size_t count_;
  size_t offset_;
  octet::cuda::DeviceBuffer<uint8_t> bytes_;
};

// NaN agrees with NaN; everything else must have the same bits.
::testing::AssertionResult same_float(float actual, float expected) {
  if (std::isnan(actual) && std::isnan(expected)) return ::testing::AssertionSuccess();
  uint32_t a = 0;
  uint32_t e = 0;
  std::memcpy(&a, &actual, sizeof a);
  std::memcpy(&e, &expected, sizeof e);
  if (a == e) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "actual " << actual << " (0x" << std::hex << a << "), expected "
                                       << expected << " (0x" << e << ")";
}

std::vector<uint8_t> transpose(const std::vector<uint8_t>& codes, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(codes.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[static_cast<size_t>(c * rows + r)] = codes[static_cast<size_t>(r * cols + c)];
    }
  }
  return out;
}

struct CastCase {
  std::span<const float> x;
  int64_t rows = 0;
  int64_t cols = 0;
  Dtype format = Dtype::e4m3;
  float scale = 1.0f;
  CastOptions options;
  bool transposed = false;
  size_t input_offset = 0;       // elements: a non-zero offset makes the input unaligned for float4 loads
  size_t output_offset = 0;      // bytes
  size_t transposed_offset = 0;  // bytes: a non-zero offset defeats 4-byte stores of transposed codes
};

// Runs the kernel on guarded buffers and compares everything with the CPU reference, which it returns.
QuantizedTensor expect_cast_matches_cpu(const CastCase& c) {
  const QuantizedTensor expected =
      octet::quantize_with_scale(c.x, c.rows, c.cols, c.format, c.scale, c.options);
  const size_t n = c.x.size();
  Guarded<float> input(n, c.input_offset);
  input.upload(c.x);
  Guarded<float> scale(1);
  scale.upload(std::span<const float>(&c.scale, 1));
  Guarded<float> scale_inv(1);
  Guarded<uint8_t> output(n, c.output_offset);
  Guarded<uint8_t> output_transposed(n, c.transposed_offset);
  Guarded<CastResults> results(1);

  octet::cuda::CastAmaxArguments a;
  a.input = input.data();
  a.rows = c.rows;
  a.cols = c.cols;
  a.format = c.format;
  a.scale = scale.data();
  a.output = output.data();
  a.output_transposed = c.transposed ? output_transposed.data() : nullptr;
  a.scale_inv = scale_inv.data();
  a.results = results.data();
  a.options = c.options;
  octet::cuda::Stream stream;
  octet::cuda::cast_amax(a, stream.get());
  stream.synchronize();

  EXPECT_TRUE(octet::testing::bytes_equal(output.read(), expected.data, c.format));
  EXPECT_TRUE(output.guards_intact("output"));
  if (c.transposed) {
    EXPECT_TRUE(octet::testing::bytes_equal(output_transposed.read(),
                                            transpose(expected.data, c.rows, c.cols), c.format));
    EXPECT_TRUE(output_transposed.guards_intact("transposed output"));
  } else {
    EXPECT_TRUE(output_transposed.untouched("transposed output"));
  }
  const CastResults r = results.read()[0];
  EXPECT_TRUE(same_float(r.amax, expected.amax)) << "amax";
  EXPECT_EQ(static_cast<int64_t>(r.saturated), expected.stats.saturated);
  EXPECT_EQ(static_cast<int64_t>(r.underflowed), expected.stats.underflowed);
  EXPECT_EQ(static_cast<int64_t>(r.nan_inputs), expected.stats.nan_inputs);
  EXPECT_TRUE(results.guards_intact("results"));
  EXPECT_TRUE(same_float(scale_inv.read()[0], expected.scale_inv[0])) << "scale_inv";
  EXPECT_TRUE(scale_inv.guards_intact("scale_inv"));
  return expected;
}

// Edges of both formats at scale 1: largest finite values, the midpoints above them that decide saturation
// (464 and 61440 round down, ties to even; anything above them overflows), the smallest subnormals, the
// midpoints below them that decide underflow, and subnormal ties.
std::vector<float> boundary_values() {
  const float up = std::numeric_limits<float>::infinity();
  return {448.0f,
          464.0f,
          std::nextafter(464.0f, up),
          480.0f,
          57344.0f,
          61440.0f,
          std::nextafter(61440.0f, up),
          0x1p-9f,
          0x1p-10f,
          std::nextafter(0x1p-10f, up),
          3 * 0x1p-10f,
          5 * 0x1p-10f,
          0x1p-16f,
          0x1p-17f,
          std::nextafter(0x1p-17f, up),
          3 * 0x1p-17f,
          5 * 0x1p-17f};
}

// Magnitudes over 2^-30 .. 2^20 (both formats underflow and saturate) mixed with normal values; with_specials
// spreads special_values() and the boundary values (times 1/scale_for_specials, exact) over the tensor,
// starting at a seed-dependent one so that tiny shapes see different ones.
constexpr float kScaleForSpecials = 0.5f;
std::vector<float> cast_inputs(size_t n, uint64_t seed, bool with_specials) {
  std::vector<float> x = octet::testing::random_log_uniform(n, seed, -30, 20);
  const std::vector<float> typical = octet::testing::random_normal(n, seed ^ 0x5EEDull, 3.0f);
  for (size_t i = 0; i < n; i += 3) x[i] = typical[i];
  if (with_specials && n > 0) {
    std::vector<float> edges = octet::testing::special_values();
    for (const float b : boundary_values()) {
      edges.push_back(b / kScaleForSpecials);
      edges.push_back(-b / kScaleForSpecials);
    }
    const size_t count = std::min(n, edges.size());
    const size_t step = n / count;
    for (size_t j = 0; j < count; ++j) x[j * step] = edges[(j + seed) % edges.size()];
  }
  return x;
}

struct Config {
  Dtype format;
  Overflow overflow;
  Rounding rounding;
};

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  for (const Dtype format : {Dtype::e4m3, Dtype::e5m2}) {
    for (const Overflow overflow : {Overflow::saturate, Overflow::non_saturating}) {
      for (const Rounding rounding : {Rounding::nearest_even, Rounding::stochastic}) {
        configs.push_back({format, overflow, rounding});
      }
    }
  }
  return configs;
}

std::string describe(const Config& config, int64_t rows, int64_t cols, bool transposed, uint64_t seed) {
  std::ostringstream s;
  s << octet::dtype_name(config.format)
    << (config.overflow == Overflow::saturate ? " saturate" : " non-saturating")
    << (config.rounding == Rounding::stochastic ? " stochastic" : " nearest") << " [" << rows << ", " << cols
    << "]" << (transposed ? " +transposed" : "") << " seed " << seed;
  return s.str();
}

// The sweep shared by the two input families below.
void sweep(bool with_specials, float scale, uint64_t first_seed) {
  uint64_t seed = first_seed;
  for (const Config& config : all_configs()) {
    for (const octet::testing::Shape2D& shape : octet::testing::odd_shapes()) {
      for (const bool transposed : {false, true}) {
        ++seed;
        const size_t n = static_cast<size_t>(shape.rows * shape.cols);
        const std::vector<float> x = cast_inputs(n, seed, with_specials);
        SCOPED_TRACE(describe(config, shape.rows, shape.cols, transposed, seed));
        CastCase c;
        c.x = x;
        c.rows = shape.rows;
        c.cols = shape.cols;
        c.format = config.format;
        c.scale = scale;
        c.options = {config.overflow, config.rounding, seed * 7919u};
        c.transposed = transposed;
        const QuantizedTensor expected = expect_cast_matches_cpu(c);
        if (n >= 100) {
          // The inputs must exercise what is compared, or equality proves little.
          EXPECT_GT(expected.stats.saturated, 0);
          EXPECT_GT(expected.stats.underflowed, 0);
          EXPECT_TRUE(std::any_of(expected.data.begin(), expected.data.end(),
                                  [](uint8_t b) { return (b & 0x7F) != 0; }));
        }
        if (::testing::Test::HasFailure()) return;  // one failing case is enough to read
      }
    }
  }
}

TEST(CudaCast, MatchesCpuReferenceOnOddShapes) {
  SKIP_WITHOUT_GPU();
  sweep(/*with_specials=*/false, /*scale=*/0.37f, 1000);  // a scale that is not a power of two
}

TEST(CudaCast, MatchesCpuReferenceWithSpecialAndBoundaryValues) {
  SKIP_WITHOUT_GPU();
  sweep(/*with_specials=*/true, kScaleForSpecials, 2000);
}

TEST(CudaCast, UnalignedPointersMatchCpuReference) {
  SKIP_WITHOUT_GPU();
  // Offsets that defeat float4 loads or 4-byte code stores, so that the scalar path covers everything.
  const std::vector<float> x = cast_inputs(7 * 143, 31, true);
  for (const size_t input_offset : {0u, 1u, 2u, 3u}) {
    for (const size_t output_offset : {0u, 1u, 3u}) {
      SCOPED_TRACE("input offset " + std::to_string(input_offset) + ", output offset " +
                   std::to_string(output_offset));
      CastCase c;
      c.x = x;
      c.rows = 7;
      c.cols = 143;
      c.format = Dtype::e5m2;
      c.scale = 3.0f;
      c.options = {Overflow::saturate, Rounding::stochastic, 99};
      c.input_offset = input_offset;
      c.output_offset = output_offset;
      expect_cast_matches_cpu(c);
    }
  }
}

TEST(CudaCast, LargeTensorStridesOverTheGrid) {
  SKIP_WITHOUT_GPU();
  // More tiles and float4 groups than the grid has blocks and threads, and a size that is not a multiple
  // of 4.
  const int64_t rows = 1031;
  const int64_t cols = 4099;
  const std::vector<float> x = cast_inputs(static_cast<size_t>(rows * cols), 77, true);
  for (const bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed" : "row-major only");
    CastCase c;
    c.x = x;
    c.rows = rows;
    c.cols = cols;
    c.format = Dtype::e4m3;
    c.scale = 0.01f;
    c.options = {Overflow::saturate, transposed ? Rounding::stochastic : Rounding::nearest_even, 5};
    c.transposed = transposed;
    expect_cast_matches_cpu(c);
  }
}

TEST(CudaCast, TransposedTilesMatchCpuReference) {
  SKIP_WITHOUT_GPU();
  // The tiled kernel's paths: float4 loads and word stores of row-major codes (cols % 4 == 0, aligned), word
  // stores of transposed codes (rows % 4 == 0, aligned), and the element-by-element fallbacks, on shapes
  // around the 64 x 64 tile edge (whole tiles, tiles cut by rows, by columns, by both), with offsets that
  // turn each word path off in turn. The last shape has more tiles than the grid has blocks.
  const std::vector<octet::testing::Shape2D> shapes = {{64, 64}, {128, 192}, {100, 132}, {68, 4},
                                                       {4, 68},  {65, 64},   {64, 65},   {3, 1000},
                                                       {1, 64},  {64, 1},    {61, 124},  {1028, 4100}};
  struct Offsets {
    size_t input;
    size_t output;
    size_t transposed;
  };
  const std::vector<Offsets> offsets = {{0, 0, 0}, {4, 4, 4}, {1, 0, 0}, {0, 1, 0}, {0, 0, 2}};
  uint64_t seed = 3000;
  for (const Config& config : all_configs()) {
    for (const octet::testing::Shape2D& shape : shapes) {
      for (const Offsets& o : offsets) {
        ++seed;
        const size_t n = static_cast<size_t>(shape.rows * shape.cols);
        if (n > 100000 && (o.input != 0 || o.output != 0 || o.transposed != 0)) continue;
        const std::vector<float> x = cast_inputs(n, seed, true);
        SCOPED_TRACE(describe(config, shape.rows, shape.cols, true, seed) + ", offsets " +
                     std::to_string(o.input) + " " + std::to_string(o.output) + " " +
                     std::to_string(o.transposed));
        CastCase c;
        c.x = x;
        c.rows = shape.rows;
        c.cols = shape.cols;
        c.format = config.format;
        c.scale = kScaleForSpecials;
        c.options = {config.overflow, config.rounding, seed * 7919u};
        c.transposed = true;
        c.input_offset = o.input;
        c.output_offset = o.output;
        c.transposed_offset = o.transposed;
        expect_cast_matches_cpu(c);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(CudaCast, EmptyTensorsWriteZeroResultsAndScaleInv) {
  SKIP_WITHOUT_GPU();
  for (const octet::testing::Shape2D shape : {octet::testing::Shape2D{0, 5}, octet::testing::Shape2D{3, 0}}) {
    for (const bool transposed : {false, true}) {
      CastCase c;
      c.rows = shape.rows;
      c.cols = shape.cols;
      c.scale = 4.0f;
      c.transposed = transposed;
      expect_cast_matches_cpu(c);
    }
  }
}

TEST(CudaCast, HostConvenienceMatchesQuantizeWithScale) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 129;
  const int64_t cols = 127;
  const std::vector<float> x = cast_inputs(static_cast<size_t>(rows * cols), 4242, true);
  const CastOptions options{Overflow::non_saturating, Rounding::stochastic, 12345};
  const QuantizedTensor expected = octet::quantize_with_scale(x, rows, cols, Dtype::e5m2, 0.75f, options);
  const octet::cuda::DeviceCastOutput got =
      octet::cuda::cast_on_device(x, rows, cols, Dtype::e5m2, 0.75f, options);
  EXPECT_EQ(got.tensor.format, Dtype::e5m2);
  EXPECT_EQ(got.tensor.rows, rows);
  EXPECT_EQ(got.tensor.cols, cols);
  EXPECT_TRUE(octet::testing::bytes_equal(got.tensor.data, expected.data, Dtype::e5m2));
  EXPECT_TRUE(octet::testing::bytes_equal(got.transposed, transpose(expected.data, rows, cols), Dtype::e5m2));
  ASSERT_EQ(got.tensor.scale_inv.size(), size_t{1});
  EXPECT_TRUE(same_float(got.tensor.scale_inv[0], expected.scale_inv[0]));
  EXPECT_TRUE(same_float(got.tensor.amax, expected.amax));
  EXPECT_EQ(got.tensor.stats.elements, expected.stats.elements);
  EXPECT_EQ(got.tensor.stats.saturated, expected.stats.saturated);
  EXPECT_EQ(got.tensor.stats.underflowed, expected.stats.underflowed);
  EXPECT_EQ(got.tensor.stats.nan_inputs, expected.stats.nan_inputs);
  // The dequantized values agree too (the same codes and scale_inv, so exactly).
  const std::vector<float> a = octet::dequantize(got.tensor);
  const std::vector<float> b = octet::dequantize(expected);
  EXPECT_TRUE(octet::testing::all_close(a, b, {.dtype = Dtype::f32}));
}

TEST(CudaCast, RejectsInvalidArguments) {
  SKIP_WITHOUT_GPU();
  octet::cuda::DeviceBuffer<float> buffer(4);
  octet::cuda::DeviceBuffer<uint8_t> codes(4);
  octet::cuda::DeviceBuffer<CastResults> results(1);
  octet::cuda::CastAmaxArguments a;
  a.input = buffer.data();
  a.rows = 2;
  a.cols = 2;
  a.scale = buffer.data();
  a.output = codes.data();
  a.results = results.data();
  const auto kind_of = [](const octet::cuda::CastAmaxArguments& bad) {
    try {
      octet::cuda::cast_amax(bad, nullptr);
    } catch (const octet::Error& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  const int invalid = static_cast<int>(octet::ErrorKind::invalid_input);
  octet::cuda::CastAmaxArguments bad = a;
  bad.format = Dtype::bf16;
  EXPECT_EQ(kind_of(bad), invalid);
  bad = a;
  bad.rows = -1;
  EXPECT_EQ(kind_of(bad), invalid);
  bad = a;
  bad.results = nullptr;
  EXPECT_EQ(kind_of(bad), invalid);
  bad = a;
  bad.output = nullptr;
  EXPECT_EQ(kind_of(bad), invalid);
  EXPECT_EQ(kind_of(a), -1);  // the valid arguments run
  OCTET_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
