// Quantize and dequantize: the CPU reference for every FP8 cast kernel.
#include "octet/numerics/quantize.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "octet/check.h"

namespace octet {

int64_t QuantizedTensor::block_grid_cols() const {
  const BlockShape bs = block_shape(granularity);
  if (bs.cols == 0) return 1;
  return (cols + bs.cols - 1) / bs.cols;
}

float QuantizedTensor::scale_inv_at(int64_t row, int64_t col) const {
  const BlockShape bs = block_shape(granularity);
  if (bs.cols == 0) return scale_inv[0];
  return scale_inv[static_cast<size_t>((row / bs.rows) * block_grid_cols() + col / bs.cols)];
}

float compute_amax(std::span<const float> x) {
  float amax = 0.0f;
  bool nan = false;
  for (const float v : x) {
    const float a = std::fabs(v);
    nan |= std::isnan(v);
    amax = a > amax ? a : amax;
  }
  return nan ? std::nanf("") : amax;
}

static uint8_t cast_one(float x, float scale, const MinifloatSpec& spec, const CastOptions& options,
                        const CounterRng& rng, uint64_t index, CastStats& stats) {
  const float scaled = x * scale;
  uint32_t random_bits = 0;
  const uint32_t* random = nullptr;
  if (options.rounding == Rounding::stochastic) {
    random_bits = rng.bits(index);
    random = &random_bits;
  }
  const EncodeResult r = encode_checked(spec, scaled, options.overflow, random);
  const uint32_t sign_bit = 1u << (spec.exponent_bits + spec.mantissa_bits);
  stats.elements += 1;
  stats.nan_inputs += std::isnan(x) ? 1 : 0;
  stats.saturated += r.overflow ? 1 : 0;
  stats.underflowed += (x != 0.0f && !std::isnan(x) && (r.code & ~sign_bit) == 0) ? 1 : 0;
  return static_cast<uint8_t>(r.code);
}

uint8_t cast_scaled(float scaled, Dtype format, const CastOptions& options, uint64_t index,
                    CastStats& stats) {
  return cast_one(scaled, 1.0f, minifloat_spec(format), options, CounterRng(options.seed), index, stats);
}

static void check_shape(std::span<const float> x, int64_t rows, int64_t cols, Dtype format) {
  OCTET_REQUIRE(is_fp8(format), "quantize: the target format must be e4m3 or e5m2, got {}",
                dtype_name(format));
  OCTET_REQUIRE(rows >= 0 && cols >= 0 && static_cast<int64_t>(x.size()) == rows * cols,
                "quantize: a [{}, {}] matrix needs {} values, got {}", rows, cols, rows * cols, x.size());
}

static QuantizedTensor per_tensor_cast(std::span<const float> x, int64_t rows, int64_t cols, Dtype format,
                                       float scale, float amax, const CastOptions& options) {
  QuantizedTensor q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  q.granularity = ScaleGranularity::per_tensor;
  q.data.resize(x.size());
  q.scale_inv = {1.0f / scale};
  q.amax = amax;
  const CounterRng rng(options.seed);
  // The loop is instantiated per format and rounding so that the encoder's descriptor is a constant the
  // compiler folds (see docs/benchmarks.md for what that bought). Counts are kept in a local: stores
  // through uint8_t* may alias q's members and would force reloads.
  CastStats stats;
  uint8_t* out = q.data.data();
  auto run = [&](auto format_constant, auto stochastic_constant) {
    constexpr MinifloatSpec fixed = minifloat_spec(decltype(format_constant)::value);
    CastOptions o = options;
    o.rounding = decltype(stochastic_constant)::value ? Rounding::stochastic : Rounding::nearest_even;
    for (size_t i = 0; i < x.size(); ++i) out[i] = cast_one(x[i], scale, fixed, o, rng, i, stats);
  };
  using E4 = std::integral_constant<Dtype, Dtype::e4m3>;
  using E5 = std::integral_constant<Dtype, Dtype::e5m2>;
  const bool sr = options.rounding == Rounding::stochastic;
  if (format == Dtype::e4m3) {
    sr ? run(E4{}, std::true_type{}) : run(E4{}, std::false_type{});
  } else {
    sr ? run(E5{}, std::true_type{}) : run(E5{}, std::false_type{});
  }
  q.stats = stats;
  return q;
}

QuantizedTensor quantize_with_scale(std::span<const float> x, int64_t rows, int64_t cols, Dtype format,
                                    float scale, const CastOptions& options) {
  check_shape(x, rows, cols, format);
  OCTET_REQUIRE(is_valid_scale(scale),
                "quantize: the scale must be a positive finite number with a finite "
                "inverse (about 2.9e-39 to 3.4e38), got {}",
                scale);
  return per_tensor_cast(x, rows, cols, format, scale, compute_amax(x), options);
}

static QuantizedTensor block_cast(std::span<const float> x, int64_t rows, int64_t cols, Dtype format,
                                  ScaleGranularity granularity, const ScalingRecipe& recipe,
                                  const CastOptions& options) {
  QuantizedTensor q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  q.granularity = granularity;
  q.data.resize(x.size());
  q.amax = compute_amax(x);
  const BlockShape bs = block_shape(granularity);
  const int64_t grid_rows = (rows + bs.rows - 1) / bs.rows;
  const int64_t grid_cols = q.block_grid_cols();
  q.scale_inv.resize(static_cast<size_t>(grid_rows * grid_cols));
  const MinifloatSpec spec = minifloat_spec(format);
  const CounterRng rng(options.seed);
  for (int64_t br = 0; br < grid_rows; ++br) {
    for (int64_t bc = 0; bc < grid_cols; ++bc) {
      const int64_t r0 = br * bs.rows, r1 = std::min(rows, r0 + bs.rows);
      const int64_t c0 = bc * bs.cols, c1 = std::min(cols, c0 + bs.cols);
      float amax = 0.0f;
      bool nan = false;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const float v = x[static_cast<size_t>(r * cols + c)];
          nan |= std::isnan(v);
          amax = std::max(amax, std::fabs(v));
        }
      }
      bool degenerate = false;
      const float scale = recipe.block_scale(nan ? std::nanf("") : amax, format, &degenerate);
      q.stats.degenerate_blocks += degenerate ? 1 : 0;
      q.scale_inv[static_cast<size_t>(br * grid_cols + bc)] = 1.0f / scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          q.data[i] = cast_one(x[i], scale, spec, options, rng, i, q.stats);
        }
      }
    }
  }
  if (granularity == ScaleGranularity::mx_1x32) {
    q.scale_e8m0.resize(q.scale_inv.size());
    for (size_t i = 0; i < q.scale_inv.size(); ++i) {
      q.scale_e8m0[i] = static_cast<uint8_t>(encode(Dtype::e8m0, q.scale_inv[i], Overflow::non_saturating));
    }
  }
  return q;
}

QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, Dtype format, TensorRole role,
                         const ScalingRecipe& recipe, ScalingState& state, const CastOptions& options) {
  check_shape(x, rows, cols, format);
  const ScaleGranularity granularity = recipe.granularity(role);
  if (granularity != ScaleGranularity::per_tensor) {
    return block_cast(x, rows, cols, format, granularity, recipe, options);
  }
  // The amax is always measured: a fused cast kernel produces it in the same pass, and the delayed recipe
  // records it for later steps.
  const float amax = compute_amax(x);
  const float scale = recipe.cast_scale(state, amax, format);
  QuantizedTensor q = per_tensor_cast(x, rows, cols, format, scale, amax, options);
  recipe.update(state, amax, format);
  return q;
}

std::vector<float> dequantize(const QuantizedTensor& q) {
  OCTET_CHECK(static_cast<int64_t>(q.data.size()) == q.rows * q.cols, "{} codes, got {}", q.rows * q.cols,
              q.data.size());
  const MinifloatSpec spec = minifloat_spec(q.format);
  std::vector<float> out(q.data.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const size_t i = static_cast<size_t>(r * q.cols + c);
      out[i] = decode(spec, q.data[i]) * q.scale_inv_at(r, c);
    }
  }
  return out;
}

}  // namespace octet
