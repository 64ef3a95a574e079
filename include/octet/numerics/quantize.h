// Quantizing a float32 matrix to FP8 with a scaling recipe, and back. The CPU reference for every cast
// kernel: a GPU cast must produce the same bytes, scales, amax and counts.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "octet/numerics/random.h"
#include "octet/numerics/scaling.h"

namespace octet {

enum class Rounding : uint8_t { nearest_even, stochastic };

struct CastOptions {
  Overflow overflow = Overflow::saturate;
  Rounding rounding = Rounding::nearest_even;
  uint64_t seed = 0;  // stochastic rounding: element i of the tensor uses CounterRng(seed).bits(i)
};

// What a cast saw. Saturated: elements whose scaled value lay beyond the largest finite value (the
// non-saturating cast would have produced Inf or NaN), Inf inputs included. Underflowed: non-zero inputs that
// became zero. Degenerate blocks: blocks whose amax was 0, Inf or NaN (scale 1 used).
struct CastStats {
  int64_t elements = 0;
  int64_t saturated = 0;
  int64_t underflowed = 0;
  int64_t nan_inputs = 0;
  int64_t degenerate_blocks = 0;
};

// A row-major [rows, cols] matrix of FP8 codes with its scales; cols is the contraction (K) dimension when
// the tensor is a GEMM operand, so the layout is K-major as Hopper's FP8 GEMMs require.
struct QuantizedTensor {
  Dtype format = Dtype::e4m3;
  int64_t rows = 0;
  int64_t cols = 0;
  ScaleGranularity granularity = ScaleGranularity::per_tensor;
  std::vector<uint8_t> data;        // rows * cols codes
  std::vector<float> scale_inv;     // one per block, row-major over the grid of blocks
  std::vector<uint8_t> scale_e8m0;  // MXFP8 only: scale_inv as E8M0 codes
  float amax = 0.0f;                // max |x| over the input, NaN if any input was NaN
  CastStats stats;

  int64_t block_grid_cols() const;
  // The scale_inv that applies to element (row, col).
  float scale_inv_at(int64_t row, int64_t col) const;
};

// max |x|; NaN if any element is NaN.
float compute_amax(std::span<const float> x);

// Casts a single value already multiplied by its scale; adds what happened to `stats`.
uint8_t cast_scaled(float scaled, Dtype format, const CastOptions& options, uint64_t index, CastStats& stats);

// Quantizes x ([rows, cols], row-major) as `role` under `recipe`. Per-tensor recipes read `state` for the
// scale and update it afterwards (delayed: records the amax); block recipes ignore it.
QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, Dtype format, TensorRole role,
                         const ScalingRecipe& recipe, ScalingState& state, const CastOptions& options = {});

// Quantizes with one given scale (no recipe, no state).
QuantizedTensor quantize_with_scale(std::span<const float> x, int64_t rows, int64_t cols, Dtype format,
                                    float scale, const CastOptions& options = {});

// code * scale_inv for every element.
std::vector<float> dequantize(const QuantizedTensor& q);

}  // namespace octet
