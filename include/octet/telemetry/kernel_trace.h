// A run's kernel trace ([profiling], docs/gpu.md "Profiling"): the device work of the profiled steps, launch
// by launch, as RUN_DIR/profile/kernels.jsonl (the record octet reads back), trace.json (Chrome's trace event
// format, for chrome://tracing and Perfetto) and summary.json (per kernel name: launches, time, share, and
// whether it is an FP8 GEMM or one of octet's FP8 casts); and the summary `octet inspect --kernels` prints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/kernel_profiler.h"

namespace octet {

// What a kernel is, from its name alone (kernel_trace.cpp states the rule; docs/gpu.md explains it).
enum class KernelClass : uint8_t {
  fp8_gemm,  // a GEMM on FP8 tensor cores (cuBLASLt's or CUTLASS's kernels with FP8 operands)
  cast,      // one of octet's kernels that write FP8 codes (cast, cast-transpose, fused casts)
  other,
};
std::string_view kernel_class_name(KernelClass c);  // "fp8_gemm", "cast", "other"
KernelClass classify_kernel(std::string_view name);
// The function a kernel name names, without return type, namespaces, template arguments and parameters:
// "cast_amax_kernel" for "void octet::cuda::(anonymous namespace)::cast_amax_kernel<false>(...)"; a name
// that is no C++ signature (cuBLASLt's) as it is.
std::string kernel_function_name(std::string_view name);
// A shorter name for a table: the function with its template arguments, at most `width` characters.
std::string kernel_display_name(std::string_view name, size_t width = 64);

// The trace as recorded: the device and every activity, each tagged with its step, in order of step and
// start time.
struct KernelTrace {
  std::string device;  // "NVIDIA H100 80GB HBM3 (CUDA device 0, compute capability 9.0)"
  uint64_t dropped_records = 0;
  std::vector<DeviceActivity> activities;
};

// One kernel name (or copy or fill kind) of a summary.
struct KernelSummaryRow {
  std::string name;
  DeviceActivity::Kind kind = DeviceActivity::Kind::kernel;
  KernelClass kernel_class = KernelClass::other;
  int64_t count = 0;
  uint64_t total_ns = 0;
  double mean_ns = 0.0;
  double share = 0.0;  // of the summed time of every recorded activity
};

// One part of the steps as the host spent it (the trace's host records of one name).
struct HostPartRow {
  std::string name;
  int64_t count = 0;      // stretches: one a step, or one a micro-batch
  uint64_t total_ns = 0;  // summed over the profiled steps
};

struct KernelSummary {
  std::string device;
  int64_t first_step = 0;  // 0 and 0 for an empty trace
  int64_t last_step = 0;
  int64_t launches = 0;   // the device's activities of every kind
  uint64_t total_ns = 0;  // their summed durations ("GPU time"; overlapping work counts twice)
  int64_t fp8_gemm_launches = 0;
  uint64_t fp8_gemm_ns = 0;
  int64_t cast_launches = 0;
  uint64_t cast_ns = 0;
  uint64_t dropped_records = 0;
  std::vector<KernelSummaryRow> rows;  // most time first, then by name
  // The host's parts of the steps, in the order each first began; not in the counts and times above.
  std::vector<HostPartRow> host_parts;
};
KernelSummary summarize_kernels(const KernelTrace& trace);

// The three files' contents.
std::string kernels_jsonl(const KernelTrace& trace);
std::string chrome_trace_json(const KernelTrace& trace);
std::string kernel_summary_json(const KernelSummary& summary);
// Writes kernels.jsonl, trace.json and summary.json into `dir` (created where missing), each atomically.
void write_kernel_trace(const std::filesystem::path& dir, const KernelTrace& trace);

// Reads kernels.jsonl text back. Throws octet::Error (invalid input) naming `origin` and the line for
// anything that is not a whole trace as octet writes it: a header whose record count the lines do not
// match (a truncated file), a line that is not one JSON object, a missing or mistyped field, a number that
// is not an integer in range, an end before its start, a step outside the header's.
KernelTrace parse_kernels_jsonl(std::string_view text, std::string_view origin);
// The same from a file (at most 1 GiB).
KernelTrace read_kernel_trace(const std::filesystem::path& kernels_file);

// The kernels.jsonl that `octet inspect DIR --kernels` reads: DIR/kernels.jsonl, or DIR/profile/kernels.jsonl
// (a run directory with the default profiling.trace_dir). Throws octet::Error (invalid input) saying how
// to make one when neither exists.
std::filesystem::path find_kernel_trace(const std::filesystem::path& dir);

}  // namespace octet
