// Measurements on the GPU for `octet bench`: the throughput of the matrix products octet runs, timed through
// the CUDA backend's own GEMM engine (octet/cuda/gemm.h), the device memory bandwidth, and the device memory
// in use. No CUDA header: the types are shared with the backend registry (registry.h), whose DeviceBench is
// how code above the backends (the command-line tool, `octet bench train`) reaches these measurements; the
// functions are defined in the octet_cuda library, which only a CUDA build has.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace octet {

// The products `octet bench gemm` times. FP8 and BF16 write BF16 outputs, TF32 (float32 operands rounded to
// TF32 on the tensor cores) writes float32; every kind accumulates in float32 (FP8 without fast accumulation:
// promoted into float32 at intervals along K).
enum class GemmBenchKind : uint8_t {
  e4m3,                    // E4M3 x E4M3
  e4m3_fast_accumulation,  // E4M3 x E4M3, fast accumulation (octet's forward GEMMs)
  e4m3_e5m2,               // E4M3 x E5M2
  e4m3_e5m2_fast_accumulation,
  bf16,
  tf32,
};

inline constexpr std::array<GemmBenchKind, 6> kGemmBenchKinds = {
    GemmBenchKind::e4m3,      GemmBenchKind::e4m3_fast_accumulation,
    GemmBenchKind::e4m3_e5m2, GemmBenchKind::e4m3_e5m2_fast_accumulation,
    GemmBenchKind::bf16,      GemmBenchKind::tf32};

// The kind as a table heading ("e4m3 fast") and as a JSON key ("e4m3_fast_accum").
constexpr std::string_view gemm_bench_kind_heading(GemmBenchKind kind) {
  switch (kind) {
    case GemmBenchKind::e4m3:
      return "e4m3";
    case GemmBenchKind::e4m3_fast_accumulation:
      return "e4m3 fast";
    case GemmBenchKind::e4m3_e5m2:
      return "e4m3xe5m2";
    case GemmBenchKind::e4m3_e5m2_fast_accumulation:
      return "e4m3xe5m2 fast";
    case GemmBenchKind::bf16:
      return "bf16";
    case GemmBenchKind::tf32:
      return "tf32";
  }
  return "?";
}
constexpr std::string_view gemm_bench_kind_key(GemmBenchKind kind) {
  switch (kind) {
    case GemmBenchKind::e4m3:
      return "e4m3";
    case GemmBenchKind::e4m3_fast_accumulation:
      return "e4m3_fast_accum";
    case GemmBenchKind::e4m3_e5m2:
      return "e4m3_e5m2";
    case GemmBenchKind::e4m3_e5m2_fast_accumulation:
      return "e4m3_e5m2_fast_accum";
    case GemmBenchKind::bf16:
      return "bf16";
    case GemmBenchKind::tf32:
      return "tf32";
  }
  return "?";
}
constexpr bool is_fp8_kind(GemmBenchKind kind) {
  return kind != GemmBenchKind::bf16 && kind != GemmBenchKind::tf32;
}

// D [M, N] = A [M, K] x B [N, K]^T, both operands K-major (the only layout Hopper's FP8 tensor cores take;
// the other kinds use it too, so that every column times the same problem). `label` names where octet runs
// this shape ("h.*.mlp.c_fc forward"), or is empty.
struct GemmBenchShape {
  int64_t M = 0;
  int64_t N = 0;
  int64_t K = 0;
  std::string label;
};

struct GemmBenchSettings {
  int64_t warmup_iterations = 5;  // untimed products first (the plan cache fills, clocks rise)
  int64_t iterations = 20;        // products between one pair of CUDA events
  int64_t repeats = 5;            // timed groups; the median per-product time of the groups is reported
  // Each shape's cuBLASLt algorithm: the heuristic's first answer, or the fastest of its candidates timed in
  // the warm-up, as training with train.gemm_algorithms = "timed" runs them.
  bool timed_algorithms = false;
};

// One kind on one shape: measured, or skipped with the reason (the engine cannot run it here, or the
// operands do not fit in the free device memory).
struct GemmBenchResult {
  GemmBenchKind kind = GemmBenchKind::e4m3;
  std::string skipped;     // empty when measured
  double median_ms = 0.0;  // per product
  double tflops = 0.0;     // 2 M N K / median time
};

struct GemmBenchRow {
  GemmBenchShape shape;
  std::vector<GemmBenchResult> results;  // in the order of kGemmBenchKinds
};

// Times every kind on every shape on CUDA device 0, on random operands in [-1, 1). `on_row` (optional) sees
// each row as soon as it is measured. Throws octet::Error: invalid_input without a GPU, or for a shape with
// a dimension below 1.
std::vector<GemmBenchRow> bench_gemms(const std::vector<GemmBenchShape>& shapes,
                                      const GemmBenchSettings& settings,
                                      const std::function<void(const GemmBenchRow&)>& on_row = {});

// Device memory bandwidth, measured two ways on the same buffer of `bytes`: a device-to-device copy
// (cudaMemcpyAsync, counted as read plus write: 2 * bytes per copy) and a kernel that only reads the buffer
// (a float32 sum, each block writing one partial). Each is run `warmup_iterations` times untimed, then
// `repeats` times between pairs of CUDA events; the median repeat is reported, in GB/s (10^9 bytes).
struct BandwidthBenchSettings {
  size_t bytes = size_t{1} << 30;  // per buffer; lowered to what fits in the free device memory
  int64_t warmup_iterations = 3;
  int64_t repeats = 10;
};

struct BandwidthBenchResult {
  std::string skipped;  // empty when measured; otherwise why not (too little free device memory)
  size_t bytes = 0;     // the buffer size used
  double copy_median_ms = 0.0;
  double copy_gbs = 0.0;  // 2 * bytes / copy_median_ms
  double read_median_ms = 0.0;
  double read_gbs = 0.0;  // bytes / read_median_ms
};

// Measures the bandwidth of CUDA device 0. Throws octet::Error (invalid_input) without a GPU, or for settings
// with no repeat or a buffer under 1 MiB.
BandwidthBenchResult bench_memory_bandwidth(const BandwidthBenchSettings& settings = {});

// Device memory in use on the whole device (cudaMemGetInfo: total less free, every process and the CUDA
// context included). Throws octet::Error (invalid_input) without a GPU.
struct DeviceMemoryUse {
  size_t used_bytes = 0;
  size_t total_bytes = 0;
};
DeviceMemoryUse device_memory_in_use(int device = 0);

}  // namespace octet
