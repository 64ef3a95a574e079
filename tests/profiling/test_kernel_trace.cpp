// The kernel trace of [profiling] without a GPU: the rule that marks FP8 GEMM kernels and octet's casts,
// tried on kernel names as cuBLASLt, CUTLASS and octet's own kernels spell them; the per-kernel summary of a
// hand-written kernels.jsonl against sums worked out by hand; the three files octet writes; and a reader
// that refuses everything that is not a whole trace (fuzzed with truncations and garbled copies).
#include <cmath>
#include <filesystem>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/telemetry/kernel_trace.h"
#include "process.h"

namespace octet {
namespace {

using nlohmann::json;

// Names as the profiled GPU reports them (cuBLASLt's are not mangled; octet's are demangled C++).
constexpr const char* kNvjetE4m3 = "nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT";
constexpr const char* kNvjetE5m2 = "nvjet_sm90_qrtst_64x128_128x4_1x2_h_bz_ovscale_NTT";
constexpr const char* kNvjetBf16 = "nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT";
constexpr const char* kCastAmax =
    "void octet::cuda::(anonymous namespace)::cast_amax_kernel<false>(octet::cuda::(anonymous "
    "namespace)::KernelParameters)";
constexpr const char* kLayernorm =
    "void octet::cuda::(anonymous namespace)::layernorm_forward_kernel(float*, float*, float*, const float*, "
    "const float*, const float*, long, long)";

TEST(KernelClassification, MarksFp8GemmsByTheirOperandTypes) {
  for (const char* fp8 : {
           kNvjetE4m3,
           kNvjetE5m2,
           "nvjet_qqtst_128x256_128x6_2x1_v_bz_TNN",  // no architecture word
           "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
           "off_"
           "kernel__5x_cublas",
           "sm89_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize64x64x64_stage4_warpsize2x2x1_tensor16x8x32",
           "sm90_xmma_gemm_e5m2e4m3_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_kernel",
           "cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_void_f16_128x128x64_1x1x1_0_tnn_align16",
           "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int>, "
           "cutlass::float_e4m3_t, cutlass::float_e5m2_t>>(Params)",
       }) {
    EXPECT_EQ(classify_kernel(fp8), KernelClass::fp8_gemm) << fp8;
  }
  for (const char* other : {
           kNvjetBf16,
           "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT",
           "nvjet_sm90_sss_64x64_32x8_1x1_v_bz_NNN",
           "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
           "off_"
           "kernel__5x_cublas",
           "cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>",
           "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_void_bf16_128x128x64_1x1x1_0_tnn_align8",
           // e4m3 in a name that is no GEMM: a conversion kernel is no FP8 GEMM
           "void at::native::unrolled_elementwise_kernel<float_to_e4m3_functor>(int)",
           // octet's own kernels are never taken for cuBLASLt's, whatever their template arguments say
           "void octet::cuda::dequantize_product_kernel(float*, const float*, long, long)",
           "void octet::cuda::(anonymous namespace)::sqnr_kernel<(octet::Fp8Format)0>(const float*, long)",
           kLayernorm,
           "splitKreduce_kernel",
       }) {
    EXPECT_EQ(classify_kernel(other), KernelClass::other) << other;
  }
}

TEST(KernelClassification, MarksOctetsCastKernels) {
  for (const char* cast : {
           kCastAmax,
           "void octet::cuda::(anonymous "
           "namespace)::cast_transpose_amax_kernel<true>(octet::cuda::(anonymous "
           "namespace)::KernelParameters)",
           "void octet::cuda::fused_internal::produce_cast_transpose_kernel<octet::cuda::fused_internal::"
           "GeluProducer>(octet::cuda::fused_internal::GeluProducer, octet::cuda::fused_internal::FusedCast, "
           "long, long, bool, float*)",
           "void octet::cuda::(anonymous namespace)::normalization_cast_kernel<(octet::cuda::Norm)1>(int)",
           "void octet::cuda::(anonymous namespace)::adamw_cast_tiles_kernel(octet::cuda::AdamwTiles)",
           "void octet::cuda::swiglu_backward_cast_kernel(float const*, float*, long)",
       }) {
    EXPECT_EQ(classify_kernel(cast), KernelClass::cast) << cast;
  }
  // "cast" must be a word of the function's own name: not inside another word, not in a parameter's type.
  EXPECT_EQ(classify_kernel("void octet::cuda::broadcast_rows_kernel(float*)"), KernelClass::other);
  EXPECT_EQ(classify_kernel("void octet::cuda::gelu_kernel(octet::cuda::FusedCast)"), KernelClass::other);
  // A cast kernel of another library is not octet's.
  EXPECT_EQ(classify_kernel("void at::native::cast_kernel<float>(int)"), KernelClass::other);
}

// The kernels of one fp8 training step on an H100 as Nsight Compute named them (docs/bench/
// gpu-step-kernels-h100.csv; it writes anonymous namespaces as <unnamed>).
TEST(KernelClassification, AnH100StepsKernels) {
  for (const char* fp8 :
       {"nvjet_sm90_qqsss_64x40_128x16_2x4_h_bz_TNT", "nvjet_sm90_qqsss_8x64_128x16_2x1_v_bz_TNN",
        "nvjet_sm90_qrsss_64x8_128x16_1x2_h_bz_algo2_TNT",
        "nvjet_sm90_qrsss_24x64_128x16_4x2_h_badd_algo2_TNN"}) {
    EXPECT_EQ(classify_kernel(fp8), KernelClass::fp8_gemm) << fp8;
  }
  for (const char* cast :
       {"void octet::<unnamed>::cast_transpose_amax_kernel<3, 0>(octet::<unnamed>::KernelParameters)",
        "void octet::<unnamed>::cast_transpose_amax_kernel<4, 0>(octet::<unnamed>::KernelParameters)"}) {
    EXPECT_EQ(classify_kernel(cast), KernelClass::cast) << cast;
  }
  for (const char* other : {
           "nvjet_sm90_tss_128x256_64x4_2x1_v_bz_coopA_TNN",
           "nvjet_sm90_tss_64x64_64x13_2x1_v_bz_splitK_NNT",
           "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, 0, float, float, "
           "float, 1, 0, "
           "0, 0>(cublasLt::cublasSplitKParams<T6>, const T4 *, const T10 *, T9 *, T5 *, const T6 *)",
           "octet::<unnamed>::prepare_scale_kernel(octet::<unnamed>::DeviceLayerState *, int, "
           "octet::<unnamed>::RecipeParameters, float, const octet::CastResults *, float *)",
           "void octet::<unnamed>::for_each_kernel<octet::<unnamed>::Map1<octet::<unnamed>::RoundBf16>>(T1, "
           "long, long)",
       }) {
    EXPECT_EQ(classify_kernel(other), KernelClass::other) << other;
  }
  EXPECT_EQ(
      kernel_display_name(
          "void octet::<unnamed>::cast_transpose_amax_kernel<3, 0>(octet::<unnamed>::KernelParameters)"),
      "cast_transpose_amax_kernel<3, 0>");
}

// Every __global__ kernel of the CUDA backend's sources, as the rule sees it when CUPTI names it: exactly the
// kernels that write FP8 codes are casts. A new kernel with "cast" in its name fails here until it is added
// to the list (or renamed), so that the summary's cast figures keep meaning what they say.
TEST(KernelClassification, OctetsOwnKernelsFromTheSources) {
  const std::set<std::string> casts = {"adamw_cast_tiles_kernel",
                                       "cast_amax_kernel",
                                       "cast_transpose_amax_kernel",
                                       "normalization_cast_kernel",
                                       "normalization_cast_transpose_kernel",
                                       "produce_cast_kernel",
                                       "produce_cast_transpose_grouped_kernel",
                                       "produce_cast_transpose_kernel",
                                       "swiglu_backward_cast_grouped_kernel",
                                       "swiglu_backward_cast_kernel"};
  const std::regex kernel(
      R"(__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\()");
  std::set<std::string> seen, marked;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(OCTET_SOURCE_DIR) /
                                                               "src" / "backends" / "cuda")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    const std::string text = testing::read_file(entry.path().string());
    for (std::sregex_iterator it(text.begin(), text.end(), kernel), end; it != end; ++it) {
      const std::string name = (*it)[1];
      seen.insert(name);
      // As CUPTI's demangled name gives it.
      const KernelClass c =
          classify_kernel("void octet::cuda::(anonymous namespace)::" + name + "<1>(float*, long)");
      EXPECT_NE(c, KernelClass::fp8_gemm) << name;
      if (c == KernelClass::cast) marked.insert(name);
    }
  }
  EXPECT_GT(seen.size(), 40u) << "the kernels of src/backends/cuda were not found";
  EXPECT_EQ(marked, casts);
}

TEST(KernelClassification, FunctionAndDisplayNames) {
  EXPECT_EQ(kernel_function_name(kCastAmax), "cast_amax_kernel");
  EXPECT_EQ(kernel_display_name(kCastAmax), "cast_amax_kernel<false>");
  EXPECT_EQ(kernel_function_name(kLayernorm), "layernorm_forward_kernel");
  EXPECT_EQ(kernel_function_name(kNvjetE4m3), kNvjetE4m3);
  EXPECT_EQ(kernel_function_name("void octet::cuda::f<a::b<(c::d)1>>(x::y)"), "f");
  const std::string shown = kernel_display_name(std::string(200, 'k'), 20);
  EXPECT_EQ(shown, std::string(17, 'k') + "...");
}

// A trace of two steps on device 0 written by hand: per kernel, the durations are
//   FP8 GEMM (nvjet qq): step 5: 1000 and 3000 ns; step 6: 2000 ns      -> 3 launches, 6000 ns
//   FP8 GEMM (nvjet qr): step 6: 4000 ns                                  -> 1 launch,  4000 ns
//   BF16 GEMM:           step 5: 5000 ns                                  -> 1 launch,  5000 ns
//   cast_amax_kernel:    step 5: 500 ns; step 6: 1500 ns                  -> 2 launches, 2000 ns
//   layernorm:           step 6: 2500 ns                                  -> 1 launch,  2500 ns
//   memcpy HtoD:         step 5: 500 ns                                   -> 1 launch,   500 ns
// Total 20000 ns in 9 launches: FP8 GEMMs 4 launches, 10000 ns (50%); casts 2 launches, 2000 ns (10%).
// clang-format off
std::string hand_written_trace() {
  return R"trace({"format":"octet-kernel-trace","version":1,"device":"H100 (test)","records":9,"first_step":5,"last_step":6,"dropped_records":0}
{"step":5,"kind":"kernel","name":"nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT","start_ns":1000000,"end_ns":1001000,"stream":7,"device":0,"grid":[132,1,1],"block":[384,1,1]}
{"step":5,"kind":"memcpy","name":"memcpy HtoD","start_ns":1001000,"end_ns":1001500,"stream":7,"device":0,"bytes":4096}
{"step":5,"kind":"kernel","name":"void octet::cuda::(anonymous namespace)::cast_amax_kernel<false>(octet::cuda::(anonymous namespace)::KernelParameters)","start_ns":1002000,"end_ns":1002500,"stream":7,"device":0,"grid":[264,1,1],"block":[256,1,1]}
{"step":5,"kind":"kernel","name":"nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT","start_ns":1003000,"end_ns":1006000,"stream":7,"device":0,"grid":[132,1,1],"block":[384,1,1]}
{"step":5,"kind":"kernel","name":"nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT","start_ns":1006000,"end_ns":1011000,"stream":7,"device":0,"grid":[66,2,1],"block":[256,1,1]}
{"step":6,"kind":"kernel","name":"nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT","start_ns":2000000,"end_ns":2002000,"stream":7,"device":0,"grid":[132,1,1],"block":[384,1,1]}
{"step":6,"kind":"kernel","name":"nvjet_sm90_qrtst_64x128_128x4_1x2_h_bz_ovscale_NTT","start_ns":2002000,"end_ns":2006000,"stream":7,"device":0,"grid":[132,1,1],"block":[384,1,1]}
{"step":6,"kind":"kernel","name":"void octet::cuda::(anonymous namespace)::cast_amax_kernel<false>(octet::cuda::(anonymous namespace)::KernelParameters)","start_ns":2006000,"end_ns":2007500,"stream":7,"device":0,"grid":[264,1,1],"block":[256,1,1]}
{"step":6,"kind":"kernel","name":"void octet::cuda::(anonymous namespace)::layernorm_forward_kernel(float*, float*, float*, const float*, const float*, const float*, long, long)","start_ns":2008000,"end_ns":2010500,"stream":13,"device":0,"grid":[8,1,1],"block":[128,1,1]}
)trace";
}
// clang-format on

const KernelSummaryRow& row_of(const KernelSummary& s, const std::string& name) {
  for (const KernelSummaryRow& r : s.rows) {
    if (r.name == name) return r;
  }
  throw std::runtime_error("no row " + name);
}

TEST(KernelSummary, AggregatesAHandWrittenTrace) {
  const KernelTrace trace = parse_kernels_jsonl(hand_written_trace(), "kernels.jsonl");
  ASSERT_EQ(trace.activities.size(), 9u);
  EXPECT_EQ(trace.device, "H100 (test)");
  const KernelSummary s = summarize_kernels(trace);
  EXPECT_EQ(s.first_step, 5);
  EXPECT_EQ(s.last_step, 6);
  EXPECT_EQ(s.launches, 9);
  EXPECT_EQ(s.total_ns, 20000u);
  EXPECT_EQ(s.fp8_gemm_launches, 4);
  EXPECT_EQ(s.fp8_gemm_ns, 10000u);
  EXPECT_EQ(s.cast_launches, 2);
  EXPECT_EQ(s.cast_ns, 2000u);
  ASSERT_EQ(s.rows.size(), 6u);
  // Most time first: 6000, 5000, 4000, 2500, 2000, 500 ns.
  EXPECT_EQ(s.rows[0].name, kNvjetE4m3);
  EXPECT_EQ(s.rows[1].name, kNvjetBf16);
  EXPECT_EQ(s.rows[2].name, kNvjetE5m2);
  EXPECT_EQ(s.rows[5].name, "memcpy HtoD");
  const KernelSummaryRow& qq = row_of(s, kNvjetE4m3);
  EXPECT_EQ(qq.count, 3);
  EXPECT_EQ(qq.total_ns, 6000u);
  EXPECT_EQ(qq.mean_ns, 2000.0);
  EXPECT_EQ(qq.share, 0.3);  // 6000 / 20000, exact in double as the division rounds it
  EXPECT_EQ(qq.kernel_class, KernelClass::fp8_gemm);
  const KernelSummaryRow& cast = row_of(s, kCastAmax);
  EXPECT_EQ(cast.count, 2);
  EXPECT_EQ(cast.mean_ns, 1000.0);
  EXPECT_EQ(cast.share, 0.1);
  EXPECT_EQ(cast.kernel_class, KernelClass::cast);
  EXPECT_EQ(row_of(s, kNvjetBf16).kernel_class, KernelClass::other);
  EXPECT_EQ(row_of(s, "memcpy HtoD").kind, DeviceActivity::Kind::memcpy);
  EXPECT_EQ(row_of(s, "memcpy HtoD").kernel_class, KernelClass::other);
}

TEST(KernelSummary, EmptyTraceHasNoShares) {
  const KernelSummary s = summarize_kernels(KernelTrace{});
  EXPECT_EQ(s.launches, 0);
  EXPECT_EQ(s.total_ns, 0u);
  EXPECT_TRUE(s.rows.empty());
  EXPECT_FALSE(json::parse(kernel_summary_json(s))["fp8_gemm"]["share"].get<double>() != 0.0);
}

TEST(KernelTraceFiles, WrittenFilesReadBackAndAgree) {
  const KernelTrace trace = parse_kernels_jsonl(hand_written_trace(), "kernels.jsonl");
  // What octet writes reads back as the same trace.
  const KernelTrace again = parse_kernels_jsonl(kernels_jsonl(trace), "again");
  ASSERT_EQ(again.activities.size(), trace.activities.size());
  for (size_t i = 0; i < trace.activities.size(); ++i) {
    const DeviceActivity &a = trace.activities[i], &b = again.activities[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.start_ns, b.start_ns);
    EXPECT_EQ(a.end_ns, b.end_ns);
    EXPECT_EQ(a.grid, b.grid);
    EXPECT_EQ(a.block, b.block);
    EXPECT_EQ(a.stream, b.stream);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.bytes, b.bytes);
  }
  EXPECT_EQ(kernels_jsonl(again), kernels_jsonl(trace));

  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "octet-kernel-trace-files";
  std::filesystem::remove_all(dir);
  write_kernel_trace(dir / "profile", trace);
  EXPECT_EQ(find_kernel_trace(dir), dir / "profile" / "kernels.jsonl");
  EXPECT_EQ(find_kernel_trace(dir / "profile"), dir / "profile" / "kernels.jsonl");
  EXPECT_EQ(read_kernel_trace(dir / "profile" / "kernels.jsonl").activities.size(), 9u);

  const json summary = json::parse(testing::read_file((dir / "profile" / "summary.json").string()));
  EXPECT_EQ(summary["format"], "octet-kernel-summary");
  EXPECT_EQ(summary["launches"], 9);
  EXPECT_EQ(summary["total_ms"].get<double>(), 0.02);
  EXPECT_EQ(summary["fp8_gemm"]["launches"], 4);
  EXPECT_EQ(summary["fp8_gemm"]["share"].get<double>(), 0.5);
  EXPECT_EQ(summary["casts"]["launches"], 2);
  ASSERT_EQ(summary["kernels"].size(), 6u);
  EXPECT_EQ(summary["kernels"][0]["name"], kNvjetE4m3);
  EXPECT_EQ(summary["kernels"][0]["fp8"], true);
  EXPECT_EQ(summary["kernels"][0]["count"], 3);
  EXPECT_EQ(summary["kernels"][0]["mean_us"].get<double>(), 2.0);
  EXPECT_EQ(summary["kernels"][1]["fp8"], false);

  // Chrome's trace event format: one complete event per activity on its device and stream, in microseconds
  // from the first start, a span per step, and names for the rows.
  const json chrome = json::parse(testing::read_file((dir / "profile" / "trace.json").string()));
  ASSERT_TRUE(chrome["traceEvents"].is_array());
  int complete = 0, steps = 0, metadata = 0;
  for (const json& e : chrome["traceEvents"]) {
    if (e["ph"] == "M") {
      ++metadata;
    } else if (e["cat"] == "step") {
      ++steps;
    } else {
      ASSERT_EQ(e["ph"], "X");
      ++complete;
      if (e["name"] == kNvjetE5m2) {
        EXPECT_EQ(e["ts"].get<double>(), 1002.0);  // (2002000 - 1000000) ns
        EXPECT_EQ(e["dur"].get<double>(), 4.0);
        EXPECT_EQ(e["tid"], 7);
        EXPECT_EQ(e["args"]["class"], "fp8_gemm");
        EXPECT_EQ(e["args"]["step"], 6);
      }
    }
  }
  EXPECT_EQ(complete, 9);
  EXPECT_EQ(steps, 2);
  EXPECT_GE(metadata, 4);  // the device, its step row and its two streams
  std::filesystem::remove_all(dir);
}

// The host's parts of two steps beside the device's kernels: a trainer's step of one micro-batch
// ("step start", "data", "forward", "backward", "gradient norm", "update"), its times on the device's clock.
KernelTrace with_host_parts() {
  KernelTrace trace = parse_kernels_jsonl(hand_written_trace(), "kernels.jsonl");
  const auto part = [](int64_t step, const char* name, uint64_t start, uint64_t end) {
    DeviceActivity a;
    a.kind = DeviceActivity::Kind::host;
    a.name = name;
    a.step = step;
    a.start_ns = start;
    a.end_ns = end;
    return a;
  };
  for (const int64_t step : {5, 6}) {
    const uint64_t at = step == 5 ? 999000 : 1999000;
    const std::vector<DeviceActivity> parts = {part(step, "step start", at, at + 100),
                                               part(step, "data", at + 100, at + 150),
                                               part(step, "forward", at + 150, at + 5150),
                                               part(step, "backward", at + 5150, at + 5400),
                                               part(step, "gradient norm", at + 5400, at + 11400),
                                               part(step, "update", at + 11400, at + 11600)};
    trace.activities.insert(trace.activities.end(), parts.begin(), parts.end());
  }
  std::stable_sort(trace.activities.begin(), trace.activities.end(),
                   [](const DeviceActivity& a, const DeviceActivity& b) {
                     return a.step != b.step ? a.step < b.step : a.start_ns < b.start_ns;
                   });
  return trace;
}

TEST(KernelSummary, TheHostsPartsStandBesideTheDevicesWork) {
  const KernelTrace trace = with_host_parts();
  ASSERT_EQ(trace.activities.size(), 9u + 12u);
  const KernelSummary s = summarize_kernels(trace);
  // The device's figures are those of the kernels alone (AggregatesAHandWrittenTrace).
  EXPECT_EQ(s.launches, 9);
  EXPECT_EQ(s.total_ns, 20000u);
  EXPECT_EQ(s.fp8_gemm_ns, 10000u);
  EXPECT_EQ(s.rows.size(), 6u);
  EXPECT_EQ(s.first_step, 5);
  EXPECT_EQ(s.last_step, 6);
  // The parts in the order each first began, summed over the two steps.
  ASSERT_EQ(s.host_parts.size(), 6u);
  const std::vector<std::string> order = {"step start", "data",          "forward",
                                          "backward",   "gradient norm", "update"};
  const std::vector<uint64_t> totals = {200, 100, 10000, 500, 12000, 400};
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(s.host_parts[i].name, order[i]);
    EXPECT_EQ(s.host_parts[i].count, 2);
    EXPECT_EQ(s.host_parts[i].total_ns, totals[i]) << order[i];
  }

  // The files: the host records read back; summary.json lists the parts; trace.json puts them on a process
  // of their own, outside the device's step spans.
  EXPECT_EQ(kernels_jsonl(parse_kernels_jsonl(kernels_jsonl(trace), "again")), kernels_jsonl(trace));
  const json summary = json::parse(kernel_summary_json(s));
  EXPECT_EQ(summary["launches"], 9);
  ASSERT_EQ(summary["host_parts"].size(), 6u);
  EXPECT_EQ(summary["host_parts"][2]["name"], "forward");
  EXPECT_EQ(summary["host_parts"][2]["count"], 2);
  EXPECT_EQ(summary["host_parts"][2]["total_ms"].get<double>(), 0.01);
  EXPECT_EQ(summary["host_parts"][2]["mean_ms"].get<double>(), 0.005);
  const json chrome = json::parse(chrome_trace_json(trace));
  std::set<int64_t> host_processes;
  int host_events = 0;
  bool named = false;
  for (const json& e : chrome["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "host") {
      ++host_events;
      host_processes.insert(e["pid"].get<int64_t>());
      if (e["name"] == "forward" && e["args"]["step"] == 5) {
        EXPECT_EQ(e["ts"].get<double>(), 0.15);  // (999150 - 999000) ns: the trace begins with a part
        EXPECT_EQ(e["dur"].get<double>(), 5.0);
      }
    }
    if (e["ph"] == "X" && e["cat"] == "step" && e["name"] == "step 5") {
      EXPECT_EQ(e["ts"].get<double>(), 1.0);  // the device's span: from its first kernel, not the host's part
    }
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "host") named = true;
  }
  EXPECT_EQ(host_events, 12);
  ASSERT_EQ(host_processes.size(), 1u);
  EXPECT_NE(*host_processes.begin(), 0) << "not the device's process";
  EXPECT_TRUE(named);
}

// The message of the refusal `text` gets; empty when it reads.
std::string refusal(const std::string& text) {
  try {
    parse_kernels_jsonl(text, "kernels.jsonl");
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return {};
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(KernelTraceReader, RefusesWhatIsNotAWholeTrace) {
  const std::string good = hand_written_trace();
  ASSERT_EQ(refusal(good), "");
  const std::string last_line = good.substr(good.rfind('\n', good.size() - 2) + 1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {good.substr(0, good.size() - 1), "cut short"},
      {good.substr(0, good.size() - last_line.size()), "8 records where the first line announces 9"},
      {good + last_line, "more lines than the 9 records"},
      {replaced(good, "octet-kernel-trace", "other-trace"), "format"},
      {replaced(good, R"("version":1)", R"("version":2)"), "version 2"},
      {replaced(good, R"("start_ns":1003000)", R"("start_ns":NaN)"), "not one JSON object"},
      {replaced(good, R"("start_ns":1003000)", R"("start_ns":1003000.5)"), "must be an integer"},
      {replaced(good, R"("start_ns":1003000)", R"("start_ns":-1)"), "out of range"},
      {replaced(good, R"("start_ns":1003000)", R"("start_ns":"1003000")"), "must be an integer"},
      {replaced(good, R"("start_ns":1003000)", R"("start_ns":1e400)"), "not one JSON object"},
      {replaced(good, R"("end_ns":1006000)", R"("end_ns":1002999)"), "out of range"},
      {replaced(good, R"("start_ns":1003000,)", ""), R"(no "start_ns")"},
      {replaced(good, R"("step":6,"kind":"kernel")", R"("step":7,"kind":"kernel")"), R"("step" = 7 is out)"},
      {replaced(good, R"("kind":"memcpy")", R"("kind":"memmove")"), R"("kind" must be)"},
      {replaced(good, R"("name":"memcpy HtoD")", R"("name":"")"), R"("name" must have)"},
      {replaced(good, R"("grid":[132,1,1])", R"("grid":[132,1])"), R"("grid" must be a list of 3)"},
      {replaced(good, R"("block":[384,1,1])", R"("block":[384,1,-1])"), R"("block" must be a list)"},
      {replaced(good, R"("bytes":4096)", R"("bytes":true)"), R"("bytes" must be an integer)"},
      {replaced(good, R"("stream":13)", R"("stream":4294967296)"), "out of range"},
      {replaced(good, "\n{\"step\":5", "\n\n{\"step\":5"), "not one JSON object"},
      {replaced(good, "{\"step\":5", "[{\"step\":5}]"), "not one JSON object"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = refusal(text);
    EXPECT_NE(message.find(expected), std::string::npos)
        << "expected \"" << expected << "\", got: " << message;
    EXPECT_NE(message.find("kernels.jsonl:"), std::string::npos) << message;
  }
}

// Every truncation and many seeded garbled copies: each is refused with one invalid-input error or, where
// the damage left a valid trace, reads as one whose records keep their invariants. Nothing else escapes.
TEST(KernelTraceReader, FuzzedCopiesAreRefusedOrConsistent) {
  const std::string good = hand_written_trace();
  size_t refused = 0, read = 0;
  const auto check = [&](const std::string& text) {
    try {
      const KernelTrace t = parse_kernels_jsonl(text, "fuzz");
      ++read;
      for (const DeviceActivity& a : t.activities) {
        ASSERT_LE(a.start_ns, a.end_ns);
        ASSERT_GE(a.step, 1);
        ASSERT_FALSE(a.name.empty());
      }
      const KernelSummary s = summarize_kernels(t);
      ASSERT_FALSE(std::isnan(s.rows.empty() ? 0.0 : s.rows[0].share));
    } catch (const Error& e) {
      ASSERT_EQ(e.exit_code(), 2) << e.what();
      ++refused;
    }
  };
  for (size_t n = 0; n < good.size(); ++n) check(good.substr(0, n));
  EXPECT_EQ(read, 0u) << "a truncated trace read as a whole one";
  std::mt19937 random(20261127);
  for (int copy = 0; copy < 3000; ++copy) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = random() % text.size();
      switch (random() % 3) {
        case 0:
          text[at] = static_cast<char>(random() % 256);
          break;
        case 1:
          text.erase(at, 1 + random() % 8);
          break;
        default:
          text.insert(at, 1, "0123456789{}[],:\"-.eE \n"[random() % 23]);
          break;
      }
      if (text.empty()) text.push_back('x');
    }
    check(text);
  }
  std::printf("fuzzed copies: %zu refused, %zu read\n", refused, read);
  EXPECT_GT(refused, 2 * read);
}

}  // namespace
}  // namespace octet
