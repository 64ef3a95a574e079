// `octet bench gemm`'s measurements on a GPU (octet/backend/gpu_bench.h): a large cube reports TFLOP/s that a
// tensor core can deliver and no more than the datasheet allows, FP8 beats BF16 there on a GPU with FP8
// tensor cores, shapes the FP8 products cannot take are skipped with the reason, the memory bandwidth is
// positive, finite and within what any GPU's memory delivers, and the device memory query is consistent.
// Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "octet/backend/gpu_bench.h"
#include "octet/check.h"
#include "octet/cuda/device.h"

namespace {

using octet::GemmBenchKind;
using octet::GemmBenchRow;

#define SKIP_WITHOUT_GPU() \
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

const octet::GemmBenchResult& result_of(const GemmBenchRow& row, GemmBenchKind kind) {
  for (const octet::GemmBenchResult& r : row.results) {
    if (r.kind == kind) return r;
  }
  throw std::runtime_error("no result for the kind");
}

TEST(GpuBench, CubeOf4096ReportsPlausibleThroughput) {
  SKIP_WITHOUT_GPU();
  octet::GemmBenchSettings settings;
  settings.warmup_iterations = 3;
  settings.iterations = 10;
  settings.repeats = 3;
  std::vector<GemmBenchRow> seen;
  const std::vector<GemmBenchRow> rows = octet::bench_gemms(
      {{4096, 4096, 4096, "cube"}}, settings, [&seen](const GemmBenchRow& row) { seen.push_back(row); });
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(seen.size(), 1u);  // the callback saw the row as it was measured
  const GemmBenchRow& row = rows[0];
  EXPECT_EQ(row.shape.label, "cube");
  ASSERT_EQ(row.results.size(), octet::kGemmBenchKinds.size());
  const bool fp8 = octet::cuda::has_fp8_tensor_cores(octet::cuda::device_info(0));
  for (const octet::GemmBenchResult& r : row.results) {
    SCOPED_TRACE(std::string(octet::gemm_bench_kind_key(r.kind)));
    if (octet::is_fp8_kind(r.kind) && !fp8) {
      EXPECT_NE(r.skipped.find("FP8 tensor cores"), std::string::npos) << r.skipped;
      continue;
    }
    ASSERT_TRUE(r.skipped.empty()) << r.skipped;
    EXPECT_GT(r.median_ms, 0.0);
    // 2 * 4096^3 flops over the median time, to rounding.
    EXPECT_NEAR(r.tflops, 2.0 * 4096.0 * 4096.0 * 4096.0 / (r.median_ms * 1e-3) / 1e12, 1e-6 * r.tflops);
    // Any tensor-core GPU does better than 10 TFLOP/s here; none beats 2.5 PFLOP/s dense (H100 FP8: 1979).
    EXPECT_GT(r.tflops, 10.0);
    EXPECT_LT(r.tflops, 2500.0);
  }
  if (fp8) {
    // On H100 cuBLASLt's FP8 cube runs at several hundred TFLOP/s and well above BF16.
    EXPECT_GT(result_of(row, GemmBenchKind::e4m3_fast_accumulation).tflops, 200.0);
    EXPECT_GT(result_of(row, GemmBenchKind::e4m3_fast_accumulation).tflops,
              1.2 * result_of(row, GemmBenchKind::bf16).tflops);
    EXPECT_GT(result_of(row, GemmBenchKind::bf16).tflops, result_of(row, GemmBenchKind::tf32).tflops);
  }
}

TEST(GpuBench, ShapesFp8CannotTakeAreSkippedWithTheReason) {
  SKIP_WITHOUT_GPU();
  octet::GemmBenchSettings settings;
  settings.warmup_iterations = 1;
  settings.iterations = 2;
  settings.repeats = 1;
  const std::vector<GemmBenchRow> rows = octet::bench_gemms({{127, 100, 50, ""}}, settings);
  ASSERT_EQ(rows.size(), 1u);
  for (const octet::GemmBenchResult& r : rows[0].results) {
    SCOPED_TRACE(std::string(octet::gemm_bench_kind_key(r.kind)));
    if (octet::is_fp8_kind(r.kind)) {
      EXPECT_FALSE(r.skipped.empty());
      EXPECT_EQ(r.tflops, 0.0);
    } else {
      EXPECT_TRUE(r.skipped.empty()) << r.skipped;
      EXPECT_GT(r.tflops, 0.0);
    }
  }
}

TEST(GpuBench, BadArgumentsAreRefused) {
  SKIP_WITHOUT_GPU();
  try {
    octet::bench_gemms({{16, 0, 16, ""}}, {});
    FAIL() << "a zero dimension was accepted";
  } catch (const octet::Error& e) {
    EXPECT_EQ(e.kind(), octet::ErrorKind::invalid_input);
  }
  octet::GemmBenchSettings settings;
  settings.iterations = 0;
  EXPECT_THROW(octet::bench_gemms({{16, 16, 16, ""}}, settings), octet::Error);
}

TEST(GpuBench, MemoryBandwidthIsPositiveAndFinite) {
  SKIP_WITHOUT_GPU();
  octet::BandwidthBenchSettings settings;
  settings.bytes = size_t{256} << 20;
  settings.warmup_iterations = 1;
  settings.repeats = 3;
  const octet::BandwidthBenchResult r = octet::bench_memory_bandwidth(settings);
  ASSERT_TRUE(r.skipped.empty()) << r.skipped;
  EXPECT_EQ(r.bytes, settings.bytes);
  for (const double gbs : {r.copy_gbs, r.read_gbs}) {
    EXPECT_TRUE(std::isfinite(gbs));
    // Any discrete GPU's memory beats 100 GB/s; none reaches 20 TB/s (H100 SXM: 3.35 TB/s on the datasheet).
    EXPECT_GT(gbs, 100.0);
    EXPECT_LT(gbs, 20000.0);
  }
  // A copy moves each byte twice (read and write), over its median time.
  EXPECT_NEAR(r.copy_gbs, 2.0 * static_cast<double>(r.bytes) / (r.copy_median_ms * 1e-3) / 1e9,
              1e-6 * r.copy_gbs);
  EXPECT_NEAR(r.read_gbs, static_cast<double>(r.bytes) / (r.read_median_ms * 1e-3) / 1e9, 1e-6 * r.read_gbs);
}

TEST(GpuBench, BadBandwidthSettingsAreRefused) {
  SKIP_WITHOUT_GPU();
  octet::BandwidthBenchSettings settings;
  settings.repeats = 0;
  EXPECT_THROW(octet::bench_memory_bandwidth(settings), octet::Error);
  settings.repeats = 1;
  settings.bytes = 1024;
  EXPECT_THROW(octet::bench_memory_bandwidth(settings), octet::Error);
}

TEST(GpuBench, DeviceMemoryInUseIsWithinTheDevice) {
  SKIP_WITHOUT_GPU();
  const octet::DeviceMemoryUse before = octet::device_memory_in_use();
  EXPECT_GT(before.total_bytes, 0u);
  EXPECT_LE(before.used_bytes, before.total_bytes);
  // 1 GiB more in use while a buffer holds it (other processes may allocate too: at least that much).
  octet::cuda::DeviceBuffer<uint8_t> buffer(size_t{1} << 30);
  const octet::DeviceMemoryUse during = octet::device_memory_in_use();
  EXPECT_GE(during.used_bytes, before.used_bytes + (size_t{1} << 30) - (size_t{64} << 20));
}

}  // namespace
