// See layer_gain.h.
#include "octet/train/layer_gain.h"

#include <fmt/format.h>

#include "octet/backend/registry.h"
#include "octet/check.h"

namespace octet {
namespace {

double gemm_flops(const GemmBenchShape& s) {
  return 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
}

// The kind each of a layer's three FP8 GEMMs runs as: the forward multiplies E4M3 by E4M3; the backward ones
// take the gradient, E5M2 under the hybrid formats.
std::array<GemmBenchKind, 3> fp8_kinds(const PrecisionSettings& s) {
  const GemmBenchKind forward =
      s.fast_accumulation_forward ? GemmBenchKind::e4m3_fast_accumulation : GemmBenchKind::e4m3;
  GemmBenchKind backward = s.all_e4m3 ? GemmBenchKind::e4m3 : GemmBenchKind::e4m3_e5m2;
  if (s.fast_accumulation_backward) {
    backward =
        s.all_e4m3 ? GemmBenchKind::e4m3_fast_accumulation : GemmBenchKind::e4m3_e5m2_fast_accumulation;
  }
  return {forward, backward, backward};
}

const GemmBenchResult& result_of(const GemmBenchRow& row, GemmBenchKind kind) {
  for (const GemmBenchResult& r : row.results) {
    if (r.kind == kind) {
      OCTET_REQUIRE(r.skipped.empty(), "timing the {} GEMM {} x {} x {} ({}): {}",
                    gemm_bench_kind_heading(kind), row.shape.M, row.shape.N, row.shape.K, row.shape.label,
                    r.skipped);
      return r;
    }
  }
  OCTET_CHECK(false, "a {} result for {}", gemm_bench_kind_heading(kind), row.shape.label);
  return row.results.front();
}

}  // namespace

double fp8_cast_bytes(const LayerShape& s) {
  const auto M = static_cast<double>(s.tokens), K = static_cast<double>(s.in_features),
             N = static_cast<double>(s.out_features);
  return 4.0 * M * K + 6.0 * N * K + 4.0 * M * N;
}

std::array<GemmBenchShape, 3> layer_gemm_shapes(const LayerShape& s, const std::string& label) {
  return {GemmBenchShape{s.tokens, s.out_features, s.in_features, label + " forward"},
          GemmBenchShape{s.tokens, s.in_features, s.out_features, label + " input gradient"},
          GemmBenchShape{s.out_features, s.in_features, s.tokens, label + " weight gradient"}};
}

LayerGainMeter::LayerGainMeter(const DeviceBench* bench, const PrecisionSettings& settings,
                               GemmBenchSettings timing, GainModel model)
    : bench_(bench), settings_(settings), timing_(timing), model_(model) {}

LayerGain LayerGainMeter::gain(const LayerShape& shape) {
  const auto known = known_.find(shape);
  if (known != known_.end()) return known->second;
  OCTET_CHECK(shape.tokens > 0 && shape.in_features > 0 && shape.out_features > 0,
              "a layer shape with positive sizes, got M={} K={} N={}", shape.tokens, shape.in_features,
              shape.out_features);
  const std::array<GemmBenchShape, 3> gemms =
      layer_gemm_shapes(shape, fmt::format("[{} -> {}]", shape.in_features, shape.out_features));
  const std::array<GemmBenchKind, 3> kinds = fp8_kinds(settings_);
  LayerGain g;
  g.measured = bench_ != nullptr;
  if (bench_ == nullptr) {
    for (const GemmBenchShape& s : gemms) {
      g.bf16_ms += gemm_flops(s) / (model_.bf16_tflops * 1e12) * 1e3;
      g.fp8_gemm_ms += gemm_flops(s) / (model_.fp8_tflops * 1e12) * 1e3;
    }
    g.fp8_cast_ms =
        model_.bandwidth_gbs > 0.0 ? fp8_cast_bytes(shape) / (model_.bandwidth_gbs * 1e9) * 1e3 : 0.0;
  } else {
    if (bandwidth_gbs_ == 0.0) {
      BandwidthBenchSettings b;
      b.bytes = size_t{256} << 20;
      const BandwidthBenchResult r = bench_->bench_memory_bandwidth(b);
      OCTET_REQUIRE(r.skipped.empty(), "measuring the device memory bandwidth: {}", r.skipped);
      bandwidth_gbs_ = r.copy_gbs;
    }
    const std::vector<GemmBenchRow> rows =
        bench_->bench_gemms({gemms.begin(), gemms.end()}, timing_, nullptr);
    OCTET_CHECK(rows.size() == 3, "3 timed GEMMs, got {}", rows.size());
    for (size_t i = 0; i < 3; ++i) {
      g.bf16_ms += result_of(rows[i], GemmBenchKind::bf16).median_ms;
      g.fp8_gemm_ms += result_of(rows[i], kinds[i]).median_ms;
    }
    g.fp8_cast_ms = fp8_cast_bytes(shape) / (bandwidth_gbs_ * 1e9) * 1e3;
  }
  known_.emplace(shape, g);
  return g;
}

std::string LayerGainMeter::basis() const {
  if (bench_ != nullptr) {
    return fmt::format(
        "measured on the GPU: GEMMs timed as `octet bench gemm` times them, casts as bytes "
        "moved over the measured copy bandwidth ({:.0f} GB/s)",
        bandwidth_gbs_);
  }
  return fmt::format(
      "modelled, not measured (no GPU): H100 SXM peaks, dense BF16 {:.0f} TFLOP/s, FP8 {:.0f} "
      "TFLOP/s, {}",
      model_.bf16_tflops, model_.fp8_tflops,
      model_.bandwidth_gbs > 0.0 ? fmt::format("casts at {:.2f} TB/s", model_.bandwidth_gbs / 1e3)
                                 : std::string("casts free (--free-casts)"));
}

int64_t auto_filter_layers(PrecisionPolicy& policy, const DeviceBench& bench, int64_t tokens) {
  LayerGainMeter meter(&bench, policy.settings());
  int64_t moved = 0;
  for (const LinearPlan& plan : std::vector<LinearPlan>(policy.layers())) {
    if (!plan.fp8()) continue;
    const LayerShape shape{tokens, plan.in_features, plan.out_features};
    const LayerGain g = meter.gain(shape);
    if (g.fp8_ms() <= g.bf16_ms) continue;
    policy.move_layer_to_bf16(
        plan.name, fmt::format("bf16: fp8 {:.3f} ms > bf16 {:.3f} ms at M={}, N={}, K={} "
                               "(fp8.auto_filter)",
                               g.fp8_ms(), g.bf16_ms, shape.tokens, shape.out_features, shape.in_features));
    ++moved;
  }
  return moved;
}

}  // namespace octet
