// octet's encoder and decoder, run on the GPU, against NVIDIA's conversions: every float32 bit pattern
// through E4M3 and E5M2 (saturating and not), BF16 and FP16, and every FP8 code decoded. Equality is exact
// except that a NaN is compared by NaN-ness; which NaN codes the hardware writes is printed, not asserted.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>

#include "hardware_conversions.h"
#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"

namespace {

using octet::testing::ConversionRecord;
using octet::testing::ConversionReport;

float bits_to_float(uint32_t bits) {
  float f = 0.0f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::string hex(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%X", v);
  return text;
}

std::string records_text(const std::vector<ConversionRecord>& records) {
  std::ostringstream s;
  for (const ConversionRecord& r : records) {
    s << "\n  input " << hex(r.input_bits) << " (" << bits_to_float(r.input_bits) << "): octet "
      << hex(r.octet_code) << ", hardware " << hex(r.hardware_code);
  }
  return s.str();
}

// One line per conversion for the log: what the hardware does with NaN inputs and numbers it cannot hold.
void print_summary(const ConversionReport& r) {
  const char* name = octet::testing::conversion_name(r.conversion);
  std::string nan_codes =
      r.nan_input_code_or == r.nan_input_code_and
          ? "always " + hex(r.nan_input_code_or)
          : "several (OR " + hex(r.nan_input_code_or) + ", AND " + hex(r.nan_input_code_and) + ")";
  std::printf(
      "%-15s mismatches %llu; NaN inputs -> hardware NaN code %s, differs from octet's on %llu; "
      "numbers -> NaN code %llu, differing from octet's NaN code on %llu\n",
      name, static_cast<unsigned long long>(r.mismatches), nan_codes.c_str(),
      static_cast<unsigned long long>(r.nan_input_code_differs),
      static_cast<unsigned long long>(r.numbers_to_nan),
      static_cast<unsigned long long>(r.numbers_to_nan_code_differs));
  if (!r.first_nan_code_differences.empty()) {
    std::printf("%-15s first numbers whose NaN codes differ:%s\n", name,
                records_text(r.first_nan_code_differences).c_str());
  }
}

TEST(HardwareConversions, EncodeMatchesHardwareForEveryFloat32) {
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const octet::cuda::DeviceInfo info = octet::cuda::device_info(0);
  std::printf("device 0: %s (compute capability %d.%d): FP8 conversions are %s\n", info.name.c_str(),
              info.compute_major, info.compute_minor,
              octet::cuda::has_fp8_tensor_cores(info)
                  ? "cvt instructions (satfinite) and cuda_fp8.h software (nosat)"
                  : "cuda_fp8.h software");
  const std::vector<ConversionReport> reports = octet::testing::compare_all_float32_conversions();
  ASSERT_EQ(reports.size(), static_cast<size_t>(octet::testing::kHardwareConversionCount));
  for (const ConversionReport& r : reports) {
    print_summary(r);
    const char* name = octet::testing::conversion_name(r.conversion);
    EXPECT_EQ(r.mismatches, 0u) << name << ": first mismatches:" << records_text(r.first_mismatches);
    // Finite values that overflow to NaN (E4M3 without saturation) must give the very same NaN code, and NaN
    // inputs the same canonical NaN.
    EXPECT_EQ(r.numbers_to_nan_code_differs, 0u) << name;
    EXPECT_EQ(r.nan_input_code_differs, 0u) << name;
    // Every NaN input went through (both signs, every payload): the OR has at least one bit set.
    EXPECT_NE(r.nan_input_code_or, 0u) << name;
  }
}

TEST(HardwareConversions, DecodeMatchesHardwareForEveryFp8Code) {
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const octet::testing::DecodeTable table = octet::testing::decode_all_fp8_codes();
  ASSERT_EQ(table.octet_bits.size(), size_t{512});
  ASSERT_EQ(table.hardware_bits.size(), size_t{512});
  int nan_codes = 0;
  for (size_t i = 0; i < 512; ++i) {
    const char* format = i < 256 ? "e4m3" : "e5m2";
    const uint32_t code = static_cast<uint32_t>(i % 256);
    const float ours = bits_to_float(table.octet_bits[i]);
    const float hardware = bits_to_float(table.hardware_bits[i]);
    if (std::isnan(ours) || std::isnan(hardware)) {
      EXPECT_TRUE(std::isnan(ours) && std::isnan(hardware))
          << format << " code " << hex(code) << ": octet " << ours << ", hardware " << hardware;
      ++nan_codes;
    } else {
      EXPECT_EQ(table.octet_bits[i], table.hardware_bits[i])
          << format << " code " << hex(code) << ": octet " << ours << ", hardware " << hardware;
    }
  }
  // E4M3: 0x7F and 0xFF; E5M2: three mantissas with each sign.
  EXPECT_EQ(nan_codes, 2 + 6);
}

}  // namespace
