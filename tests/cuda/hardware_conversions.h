// Test-only kernels that hold octet's encoder and decoder (octet/numerics/minifloat.h), compiled for the
// device, to NVIDIA's own conversions from cuda_fp8.h, cuda_bf16.h and cuda_fp16.h over every float32 bit
// pattern. Plain C++ interface so that the GoogleTest side compiles with the host compiler alone.
#pragma once

#include <cstdint>
#include <vector>

namespace octet::testing {

enum class HardwareConversion : uint8_t {
  e4m3_satfinite,  // __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) vs Overflow::saturate
  e4m3_nosat,      // __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3) vs Overflow::non_saturating
  e5m2_satfinite,  // __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2) vs Overflow::saturate
  e5m2_nosat,      // __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2) vs Overflow::non_saturating
  bf16_rn,         // __float2bfloat16_rn(x) vs encode(bf16, x, non_saturating)
  f16_rn,          // __float2half_rn(x) vs encode(f16, x, non_saturating)
};
inline constexpr int kHardwareConversionCount = 6;
const char* conversion_name(HardwareConversion c);

// One input on which the two sides wrote different codes.
struct ConversionRecord {
  uint32_t input_bits;
  uint32_t octet_code;
  uint32_t hardware_code;
};

struct ConversionReport {
  HardwareConversion conversion = HardwareConversion::e4m3_satfinite;
  // Inputs whose codes differ. Where the input is a NaN, or the hardware wrote a NaN code, only NaN-ness is
  // compared: both codes must be NaN codes (which NaN is reported below, not counted here).
  uint64_t mismatches = 0;
  std::vector<ConversionRecord> first_mismatches;
  // NaN inputs (2^24 - 2 of them): the OR and the AND of every code the hardware wrote for one. They are
  // equal exactly when the hardware always wrote the same code, which is then its canonical NaN.
  uint32_t nan_input_code_or = 0;
  uint32_t nan_input_code_and = 0;
  uint64_t nan_input_code_differs = 0;  // NaN inputs where the hardware's NaN code differs from octet's
  // Numbers (not NaN) that the hardware turned into a NaN code (E4M3 without saturation has no Inf), and how
  // many of those NaN codes differ from octet's.
  uint64_t numbers_to_nan = 0;
  uint64_t numbers_to_nan_code_differs = 0;
  std::vector<ConversionRecord> first_nan_code_differences;
};

// Runs every float32 bit pattern through all six conversions in one launch.
std::vector<ConversionReport> compare_all_float32_conversions();

// All 256 codes of E4M3 (index 0) and E5M2 (index 1) decoded by octet::decode and by
// __nv_cvt_fp8_to_halfraw followed by __half2float, as float32 bits.
struct DecodeTable {
  std::vector<uint32_t> octet_bits;     // 2 * 256
  std::vector<uint32_t> hardware_bits;  // 2 * 256
};
DecodeTable decode_all_fp8_codes();

}  // namespace octet::testing
