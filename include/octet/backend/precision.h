// Precision of the model's GEMMs: the training mode, how each of a linear layer's three GEMMs runs, and the
// FP8 scaling state that belongs to each FP8 GEMM operand. The precision policy (precision_policy.h) fills
// these in; the backend executes them and never changes them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "octet/numerics/scaling.h"

namespace octet {

// The training mode: exactly these four spellings in configs and on the command line.
enum class MixedPrecision : uint8_t { fp32, bf16, fp16, fp8 };
std::string_view mixed_precision_name(MixedPrecision m);
std::optional<MixedPrecision> parse_mixed_precision(std::string_view s);

// How one GEMM multiplies: in float32, on operands rounded to BF16 or FP16 (float32 accumulation), or on
// FP8 operands scaled by a recipe.
enum class GemmMode : uint8_t { f32, bf16, f16, fp8 };
std::string_view gemm_mode_name(GemmMode m);

// The three GEMMs of a linear layer y = x W^T + b.
enum class GemmRole : uint8_t { forward, input_gradient, weight_gradient };

// FP8 formats of a layer's three operands: activation x, weight W, output gradient dy.
struct Fp8Formats {
  Dtype activation = Dtype::e4m3;
  Dtype weight = Dtype::e4m3;
  Dtype gradient = Dtype::e5m2;  // HYBRID; all-E4M3 sets this to e4m3
};

// The scaling state of one FP8 linear layer's operands, carried from step to step.
struct Fp8LinearState {
  ScalingState activation;
  ScalingState weight;
  ScalingState gradient;
  // The scale the layer's current FP8 weight copy was cast with (per-tensor recipes). The cast records the
  // weight's amax and so moves weight.scale on; a checkpoint keeps this to remake the very same copy.
  float weight_copy_scale = 1.0f;
};

// What the casts of one FP8 operand saw, as running totals (a backend only ever adds to them; the run reads
// them every N steps and takes the differences, so nothing on a device needs resetting): the counts behind
// the saturation and underflow fractions, and, when asked for, the signal and quantization-noise energies
// behind the cast's SQNR (sums over the finite inputs of x^2 and of (x - dequantized)^2). Only the primary
// cast of an operand counts, not a re-cast of its transposed copy.
struct CastTelemetry {
  int64_t casts = 0;
  int64_t elements = 0;
  int64_t nonzero = 0;      // non-zero finite inputs
  int64_t saturated = 0;    // as CastStats::saturated
  int64_t underflowed = 0;  // non-zero inputs that became zero
  double signal_energy = 0.0;
  double noise_energy = 0.0;
};

// The three operands of an FP8 linear layer.
struct Fp8LinearTelemetry {
  CastTelemetry activation;
  CastTelemetry weight;
  CastTelemetry gradient;
};

// How the backend runs one linear layer, and what it saw.
struct LinearExecution {
  GemmMode forward = GemmMode::f32;
  GemmMode input_gradient = GemmMode::f32;
  GemmMode weight_gradient = GemmMode::f32;
  // For FP8 GEMMs:
  const ScalingRecipe* recipe = nullptr;
  // Fast accumulation (PrecisionSettings) of the forward and of the two backward FP8 GEMMs; backends whose
  // FP8 GEMMs always accumulate in float32 (the CPU emulation) ignore it.
  bool fast_accumulation_forward = true;
  bool fast_accumulation_backward = false;
  Fp8Formats formats;
  Fp8LinearState* state = nullptr;
  // False during evaluation: casts use the current scales but leave the scaling state (amax histories)
  // untouched, so that evaluating never changes what training does next.
  bool update_scaling = true;
  // The backward runs the forward GEMM again (Backend::linear_recompute): the input's FP8 tensor keeps the
  // codes of x [N, C] too, not only those of x^T that the weight gradient reads.
  bool keep_input_codes = false;
  // The weight copy keeps the codes of W [OC, C] only, not those of W^T [C, OC] too: the input-gradient GEMM
  // reads W's codes transposed into a buffer shared by every layer, just before it runs
  // (fp8.recompute_weight_transposes). The same codes, so the same results; one byte a weight less, one
  // transpose per layer and backward. Only where the weight's scale is per tensor (block scales of W^T are
  // not W's).
  bool transpose_weight_per_use = false;
  // False for the first backward since the gradients were zeroed (Model::zero_grad leaves the linear layers'
  // weight gradients to their first backward): the weight-gradient GEMM writes dweight instead of adding to
  // it, which saves zeroing it and reading the zeros. The input gradient is always written.
  bool accumulate_weight_gradient = true;
  // Counters the backend increments: GEMMs that ran in FP8, and the others.
  int64_t* fp8_gemms = nullptr;
  int64_t* other_gemms = nullptr;
  // Casts' saturation and underflow, accumulated for telemetry.
  int64_t* saturated = nullptr;
  int64_t* underflowed = nullptr;
  // Per-operand cast telemetry of this layer (null: not collected); measure_sqnr adds the energies, at the
  // cost of a dequantizing pass.
  Fp8LinearTelemetry* telemetry = nullptr;
  bool measure_sqnr = false;
};

// Whether the FP8 cast of a layer's input is all its GEMMs read of that input: the forward and the weight
// gradient run in FP8 with a per-tensor scaled activation (whose transposed codes are the forward's codes
// transposed). The producer of such an input need not keep its float32 values.
bool input_cast_suffices(const LinearExecution& exec);

// Whether linear_backward casts the layer's output gradient to FP8: one of its two backward GEMMs runs in
// FP8. The producer of such a gradient may cast it for the layer (Backend::activation_backward with cast_for).
bool casts_gradient(const LinearExecution& exec);

// Whether the FP8 cast of a layer's output gradient is all its backward reads of that gradient once the
// producer has also summed the bias gradient: both backward GEMMs run in FP8 with a per-tensor scaled
// gradient (whose transposed codes are the codes transposed; block scales would be taken afresh from the
// float32 values). The producer of such a gradient need not write its float32 values.
bool gradient_cast_suffices(const LinearExecution& exec);

// linear_backward's start, the same in every backend: checks the producer's hand-over (cast_by_producer:
// the output gradient's FP8 cast came with it) against what the call was given: a producer's cast only for
// a layer with an FP8 backward GEMM and never with a second bias sum (dbias), and dout null only where that
// cast is all the layer reads.
void check_gradient_cast(const LinearExecution& exec, bool cast_by_producer, const void* dout,
                         const float* dbias);

}  // namespace octet
