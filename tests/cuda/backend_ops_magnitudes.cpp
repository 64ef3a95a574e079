// Backend::count_magnitudes, what a calibration counts of each operand, on the CUDA backend against the CPU
// reference: the bins, zeros, Inf and NaN counts and amax must be the same integers and the same float, for
// float32 and bf16 tensors of odd sizes holding every special value, values across the whole exponent range,
// and enough values to spread over many blocks. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <vector>

#include "backend_ops_harness.h"
#include "random.h"

namespace {

using namespace octet::testing::backend_ops;  // NOLINT(google-build-using-namespace): the harness's
                                              // vocabulary
using octet::ConstTensorView;
using octet::Dtype;
using octet::MagnitudeCounts;

// Values over many orders of magnitude with every special value planted at spread positions.
std::vector<float> planted_values(size_t n, uint64_t seed) {
  std::vector<float> values = octet::testing::random_log_uniform(n, seed, -140, 127);
  const std::vector<float> special = octet::testing::special_values();
  for (size_t i = 0; i < special.size() && i * 97 < n; ++i) values[i * 97] = special[i];
  for (size_t i = 13; i < n; i += 211) values[i] = 0.0f;
  return values;
}

MagnitudeCounts count_on(octet::Backend& backend, const void* host, size_t bytes, Dtype dtype, int64_t n) {
  auto buffer = backend.allocate(bytes);
  backend.copy_from_host(buffer->data(), host, bytes);
  MagnitudeCounts counts;
  backend.count_magnitudes(counts, ConstTensorView(buffer->data(), dtype, {n}));
  return counts;
}

void expect_same(const MagnitudeCounts& expected, const MagnitudeCounts& got) {
  EXPECT_EQ(got.values, expected.values);
  EXPECT_EQ(got.zeros, expected.zeros);
  EXPECT_EQ(got.non_finite, expected.non_finite);
  EXPECT_EQ(std::bit_cast<uint32_t>(got.amax), std::bit_cast<uint32_t>(expected.amax));
  size_t differing = 0;
  for (size_t b = 0; b < MagnitudeCounts::kBins; ++b) differing += got.bins[b] != expected.bins[b] ? 1 : 0;
  EXPECT_EQ(differing, 0u) << "bins differ from the reference's";
  // Not a vacuous agreement: the reference saw values in many bins.
  const auto filled = std::count_if(expected.bins.begin(), expected.bins.end(), [](uint64_t c) { return c > 0; });
  EXPECT_GT(filled, 1);
  EXPECT_EQ(std::accumulate(expected.bins.begin(), expected.bins.end(), uint64_t{0}) +
                static_cast<uint64_t>(expected.zeros + expected.non_finite),
            static_cast<uint64_t>(expected.values));
}

TEST(BackendOpsMagnitudes, Float32AndBf16AgreeWithTheReference) {
  SKIP_WITHOUT_TESTED_BACKEND();
  auto reference = make_reference_backend();
  auto tested = make_tested_backend();
  for (const int64_t n : {int64_t{211}, int64_t{1023}, int64_t{4099}, int64_t{1} << 20, (int64_t{1} << 22) + 3}) {
    SCOPED_TRACE(testing::Message() << n << " values");
    const std::vector<float> values = planted_values(static_cast<size_t>(n), seed_of("count_magnitudes", "n"));
    const size_t f32_bytes = values.size() * sizeof(float);
    expect_same(count_on(*reference, values.data(), f32_bytes, Dtype::f32, n),
                count_on(*tested, values.data(), f32_bytes, Dtype::f32, n));
    std::vector<uint16_t> bf16(values.size());
    std::vector<float> widened(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      bf16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(values[i]) >> 16);  // truncated: any bits do
      widened[i] = std::bit_cast<float>(static_cast<uint32_t>(bf16[i]) << 16);
    }
    // The reference of a bf16 tensor is the count of its float32 values.
    MagnitudeCounts expected;
    expected.add(widened);
    const MagnitudeCounts got = count_on(*tested, bf16.data(), bf16.size() * sizeof(uint16_t), Dtype::bf16, n);
    expect_same(expected, got);
    expect_same(expected, count_on(*reference, bf16.data(), bf16.size() * sizeof(uint16_t), Dtype::bf16, n));
  }
}

TEST(BackendOpsMagnitudes, CountsAddUpAcrossCalls) {
  SKIP_WITHOUT_TESTED_BACKEND();
  auto tested = make_tested_backend();
  const std::vector<float> a = planted_values(5003, 7), b = planted_values(3001, 8);
  MagnitudeCounts expected;
  expected.add(a);
  expected.add(b);
  auto buffer_a = tested->allocate(a.size() * sizeof(float));
  auto buffer_b = tested->allocate(b.size() * sizeof(float));
  tested->copy_from_host(buffer_a->data(), a.data(), a.size() * sizeof(float));
  tested->copy_from_host(buffer_b->data(), b.data(), b.size() * sizeof(float));
  MagnitudeCounts got;
  tested->count_magnitudes(got, ConstTensorView(static_cast<const float*>(buffer_a->data()), {5003}));
  tested->count_magnitudes(got, ConstTensorView(static_cast<const float*>(buffer_b->data()), {3001}));
  expect_same(expected, got);
}

}  // namespace
