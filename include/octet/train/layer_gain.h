// What running one linear layer in FP8 saves against BF16 per micro-batch: the time of its three GEMMs
// (forward, input gradient, weight gradient) at its shapes in each precision, plus, for FP8, the casts of its
// three operands, timed as bytes moved over the device memory bandwidth. On a GPU the GEMMs and the bandwidth
// are measured with the machinery of `octet bench gemm` (DeviceBench); without one the times are modelled
// from an H100 SXM's peaks. Used by `octet localize` (the gain of each layer) and by fp8.auto_filter (which
// keeps a layer in BF16 where its FP8 form measures slower).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "octet/backend/gpu_bench.h"
#include "octet/model/precision_policy.h"

namespace octet {

class DeviceBench;

// The peaks the modelled gain assumes: an H100 SXM's dense BF16 and FP8 tensor-core rates and its HBM3
// bandwidth.
struct GainModel {
  double bf16_tflops = 989.0;
  double fp8_tflops = 1979.0;
  double bandwidth_gbs = 3350.0;  // 10^9 bytes per second; 0: casts modelled as free
};

// One layer's shapes: M = tokens per micro-batch (B*T), K = in_features, N = out_features.
struct LayerShape {
  int64_t tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  auto operator<=>(const LayerShape&) const = default;
};

struct LayerGain {
  bool measured = false;     // true: timed on the GPU; false: modelled (GainModel)
  double bf16_ms = 0.0;      // the three GEMMs in BF16
  double fp8_gemm_ms = 0.0;  // the three GEMMs in FP8
  double fp8_cast_ms = 0.0;  // the three operands' casts (bytes moved / bandwidth)
  double fp8_ms() const { return fp8_gemm_ms + fp8_cast_ms; }
  double saving_ms() const { return bf16_ms - fp8_ms(); }  // positive: FP8 is faster
};

// Bytes an FP8 layer's casts move per micro-batch: the activation [M, K] read in BF16 and written as FP8
// codes and their transpose (4 bytes an element), the weight [N, K] read in float32 and written as codes and
// their transpose (6), the output gradient [M, N] read in BF16 and written twice (4). An upper bound: where a
// cast is fused into the op that produces the operand, it moves less.
double fp8_cast_bytes(const LayerShape& shape);

// The GEMM shapes of a layer, as `octet bench gemm` names them (D [M, N] = A [M, K] x B [N, K]^T): the
// forward (M = tokens, N = out, K = in), the input gradient (tokens, in, out), the weight gradient (out, in,
// tokens).
std::array<GemmBenchShape, 3> layer_gemm_shapes(const LayerShape& shape, const std::string& label);

// Measures (with a DeviceBench) or models (without) the gain of layers, remembering each shape's answer so
// that the blocks' layers of one shape are timed once.
class LayerGainMeter {
 public:
  // `bench` null: modelled. `settings` decide which FP8 kinds the GEMMs run as (fp8.formats, fast
  // accumulation). The bandwidth is measured on first use.
  LayerGainMeter(const DeviceBench* bench, const PrecisionSettings& settings, GemmBenchSettings timing = {},
                 GainModel model = {});
  LayerGain gain(const LayerShape& shape);
  bool measured() const { return bench_ != nullptr; }
  // How the gains were had, in words: "measured on the GPU (GEMMs timed, casts at 3012 GB/s measured)" or
  // "modelled, not measured: H100 SXM peaks, BF16 989 TFLOP/s, FP8 1979 TFLOP/s, 3.35 TB/s".
  std::string basis() const;

 private:
  const DeviceBench* bench_;
  PrecisionSettings settings_;
  GemmBenchSettings timing_;
  GainModel model_;
  double bandwidth_gbs_ = 0.0;  // measured, once
  std::map<LayerShape, LayerGain> known_;
};

// fp8.auto_filter: moves every FP8 layer of `policy` whose FP8 form (casts included) measures slower than
// BF16 at its shape to BF16, with both times in its reason ("bf16: fp8 0.123 ms > bf16 0.110 ms at M=..,
// N=.., K=.."). Returns the number of layers moved. `tokens` is B*T.
int64_t auto_filter_layers(PrecisionPolicy& policy, const DeviceBench& bench, int64_t tokens);

}  // namespace octet
