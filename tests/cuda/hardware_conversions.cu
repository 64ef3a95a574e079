// Test-only kernels: octet's encoder and decoder on the device against NVIDIA's conversions (see
// hardware_conversions.h). On compute capability 8.9 and later the saturating FP8 conversions and the FP8
// decode are single cvt instructions; cuda_fp8.h implements the non-saturating FP8 conversions in software
// on every GPU, which is still an implementation independent of octet's.
#include "hardware_conversions.h"

#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"

namespace octet::testing {

const char* conversion_name(HardwareConversion c) {
  switch (c) {
    case HardwareConversion::e4m3_satfinite:
      return "e4m3 satfinite";
    case HardwareConversion::e4m3_nosat:
      return "e4m3 nosat";
    case HardwareConversion::e5m2_satfinite:
      return "e5m2 satfinite";
    case HardwareConversion::e5m2_nosat:
      return "e5m2 nosat";
    case HardwareConversion::bf16_rn:
      return "bf16 rn";
    case HardwareConversion::f16_rn:
      return "f16 rn";
  }
  return "?";
}

namespace {

constexpr unsigned kMaxRecords = 16;
constexpr int kThreads = 256;

// Device-side accumulation for one conversion; one atomic per thread and quantity at the end, and a
// bounded list of examples.
struct DeviceReport {
  unsigned long long mismatches;
  unsigned long long nan_input_code_differs;
  unsigned long long numbers_to_nan;
  unsigned long long numbers_to_nan_code_differs;
  unsigned int nan_input_code_or;
  unsigned int nan_input_code_and;
  unsigned int mismatches_recorded;
  unsigned int nan_differences_recorded;
  ConversionRecord mismatch_records[kMaxRecords];
  ConversionRecord nan_records[kMaxRecords];
};

struct LocalTally {
  unsigned long long mismatches;
  unsigned long long nan_input_code_differs;
  unsigned long long numbers_to_nan;
  unsigned long long numbers_to_nan_code_differs;
  unsigned int nan_input_code_or;
  unsigned int nan_input_code_and;
};

OCTET_HOST_DEVICE constexpr MinifloatSpec spec_of(HardwareConversion c) {
  switch (c) {
    case HardwareConversion::e4m3_satfinite:
    case HardwareConversion::e4m3_nosat:
      return minifloat_spec(Dtype::e4m3);
    case HardwareConversion::e5m2_satfinite:
    case HardwareConversion::e5m2_nosat:
      return minifloat_spec(Dtype::e5m2);
    case HardwareConversion::bf16_rn:
      return minifloat_spec(Dtype::bf16);
    case HardwareConversion::f16_rn:
      return minifloat_spec(Dtype::f16);
  }
  return minifloat_spec(Dtype::f32);
}

OCTET_HOST_DEVICE constexpr Overflow overflow_of(HardwareConversion c) {
  return (c == HardwareConversion::e4m3_satfinite || c == HardwareConversion::e5m2_satfinite)
             ? Overflow::saturate
             : Overflow::non_saturating;
}

template <HardwareConversion C>
__device__ __forceinline__ uint32_t hardware_code(float x) {
  if constexpr (C == HardwareConversion::e4m3_satfinite)
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  if constexpr (C == HardwareConversion::e4m3_nosat) return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
  if constexpr (C == HardwareConversion::e5m2_satfinite)
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  if constexpr (C == HardwareConversion::e5m2_nosat) return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
  if constexpr (C == HardwareConversion::bf16_rn) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  if constexpr (C == HardwareConversion::f16_rn) return __half_as_ushort(__float2half_rn(x));
  return 0u;
}

// Exponent field all ones and, for IEEE-style formats, a non-zero mantissa; for E4M3 the mantissa all ones.
__device__ __forceinline__ bool is_nan_code(const MinifloatSpec& s, uint32_t code) {
  const uint32_t mantissa_mask = (1u << s.mantissa_bits) - 1u;
  const uint32_t exponent_mask = (1u << s.exponent_bits) - 1u;
  const uint32_t mantissa = code & mantissa_mask;
  if (((code >> s.mantissa_bits) & exponent_mask) != exponent_mask) return false;
  return s.specials == SpecialEncoding::ieee ? mantissa != 0u : mantissa == mantissa_mask;
}

__device__ void record(ConversionRecord* records, unsigned int* recorded, ConversionRecord r) {
  // Read before the atomic, so that a badly broken conversion does not serialise every thread on one counter.
  if (*static_cast<volatile unsigned int*>(recorded) >= kMaxRecords) return;
  const unsigned int slot = atomicAdd(recorded, 1u);
  if (slot < kMaxRecords) records[slot] = r;
}

template <HardwareConversion C>
__device__ __forceinline__ void check(uint32_t bits, LocalTally& t, DeviceReport* report) {
  constexpr MinifloatSpec spec = spec_of(C);
  const float x = __uint_as_float(bits);
  const uint32_t hardware = hardware_code<C>(x);
  const uint32_t ours = encode(spec, x, overflow_of(C));
  const bool input_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const bool hardware_nan = is_nan_code(spec, hardware);
  if (input_nan || hardware_nan) {
    // Both sides must write a NaN code; whether it is the same code is tallied, and the test requires it.
    if (!(hardware_nan && is_nan_code(spec, ours))) {
      t.mismatches += 1;
      record(report->mismatch_records, &report->mismatches_recorded, {bits, ours, hardware});
    } else if (input_nan) {
      t.nan_input_code_or |= hardware;
      t.nan_input_code_and &= hardware;
      t.nan_input_code_differs += hardware != ours ? 1u : 0u;
    } else {
      t.numbers_to_nan += 1;
      if (hardware != ours) {
        t.numbers_to_nan_code_differs += 1;
        record(report->nan_records, &report->nan_differences_recorded, {bits, ours, hardware});
      }
    }
  } else if (hardware != ours) {
    t.mismatches += 1;
    record(report->mismatch_records, &report->mismatches_recorded, {bits, ours, hardware});
  }
}

__device__ void flush(const LocalTally& t, DeviceReport* report) {
  if (t.mismatches != 0u) atomicAdd(&report->mismatches, t.mismatches);
  if (t.nan_input_code_differs != 0u) atomicAdd(&report->nan_input_code_differs, t.nan_input_code_differs);
  if (t.numbers_to_nan != 0u) atomicAdd(&report->numbers_to_nan, t.numbers_to_nan);
  if (t.numbers_to_nan_code_differs != 0u) {
    atomicAdd(&report->numbers_to_nan_code_differs, t.numbers_to_nan_code_differs);
  }
  if (t.nan_input_code_or != 0u) atomicOr(&report->nan_input_code_or, t.nan_input_code_or);
  if (t.nan_input_code_and != 0xFFFFFFFFu) atomicAnd(&report->nan_input_code_and, t.nan_input_code_and);
}

// One launch over all 2^32 patterns: each thread strides through about 2^32 / (blocks * 256) of them.
__global__ void __launch_bounds__(kThreads) compare_all_kernel(DeviceReport* reports) {
  LocalTally t[kHardwareConversionCount];
  for (LocalTally& one : t) one = {0ull, 0ull, 0ull, 0ull, 0u, 0xFFFFFFFFu};
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t{1} << 32);
       i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    check<HardwareConversion::e4m3_satfinite>(bits, t[0], reports + 0);
    check<HardwareConversion::e4m3_nosat>(bits, t[1], reports + 1);
    check<HardwareConversion::e5m2_satfinite>(bits, t[2], reports + 2);
    check<HardwareConversion::e5m2_nosat>(bits, t[3], reports + 3);
    check<HardwareConversion::bf16_rn>(bits, t[4], reports + 4);
    check<HardwareConversion::f16_rn>(bits, t[5], reports + 5);
  }
  for (int c = 0; c < kHardwareConversionCount; ++c) flush(t[c], reports + c);
}

__global__ void decode_kernel(uint32_t* octet_bits, uint32_t* hardware_bits) {
  const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= 512u) return;
  const bool e5m2 = t >= 256u;
  const uint32_t code = t % 256u;
  octet_bits[t] = __float_as_uint(decode(minifloat_spec(e5m2 ? Dtype::e5m2 : Dtype::e4m3), code));
  const __half_raw raw =
      __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), e5m2 ? __NV_E5M2 : __NV_E4M3);
  hardware_bits[t] = __float_as_uint(__half2float(__half(raw)));
}

}  // namespace

std::vector<ConversionReport> compare_all_float32_conversions() {
  std::vector<DeviceReport> host(kHardwareConversionCount);
  for (DeviceReport& r : host) {
    r = DeviceReport{};
    r.nan_input_code_and = 0xFFFFFFFFu;
  }
  cuda::DeviceBuffer<DeviceReport> reports(host.size());
  reports.copy_from_host(host);

  int device = 0;
  int multiprocessors = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  compare_all_kernel<<<static_cast<unsigned>(multiprocessors * 8), kThreads>>>(reports.data());
  OCTET_CUDA_CHECK_LAUNCH("compare_all_kernel");
  OCTET_CUDA_CHECK(cudaDeviceSynchronize());
  reports.copy_to_host(host);

  std::vector<ConversionReport> out;
  for (int c = 0; c < kHardwareConversionCount; ++c) {
    const DeviceReport& d = host[static_cast<size_t>(c)];
    ConversionReport r;
    r.conversion = static_cast<HardwareConversion>(c);
    r.mismatches = d.mismatches;
    const unsigned mismatch_count = d.mismatches_recorded < kMaxRecords ? d.mismatches_recorded : kMaxRecords;
    r.first_mismatches.assign(d.mismatch_records, d.mismatch_records + mismatch_count);
    r.nan_input_code_or = d.nan_input_code_or;
    r.nan_input_code_and = d.nan_input_code_and;
    r.nan_input_code_differs = d.nan_input_code_differs;
    r.numbers_to_nan = d.numbers_to_nan;
    r.numbers_to_nan_code_differs = d.numbers_to_nan_code_differs;
    const unsigned nan_count =
        d.nan_differences_recorded < kMaxRecords ? d.nan_differences_recorded : kMaxRecords;
    r.first_nan_code_differences.assign(d.nan_records, d.nan_records + nan_count);
    out.push_back(std::move(r));
  }
  return out;
}

DecodeTable decode_all_fp8_codes() {
  cuda::DeviceBuffer<uint32_t> octet_bits(512);
  cuda::DeviceBuffer<uint32_t> hardware_bits(512);
  decode_kernel<<<2, 256>>>(octet_bits.data(), hardware_bits.data());
  OCTET_CUDA_CHECK_LAUNCH("decode_kernel");
  OCTET_CUDA_CHECK(cudaDeviceSynchronize());
  DecodeTable table;
  table.octet_bits.resize(512);
  table.hardware_bits.resize(512);
  octet_bits.copy_to_host(table.octet_bits);
  hardware_bits.copy_to_host(table.hardware_bits);
  return table;
}

}  // namespace octet::testing
