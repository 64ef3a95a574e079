// What every recipe shares: the scale-from-amax rule with its guards, block shapes, and names.
#include "octet/numerics/scaling.h"

#include <cfloat>
#include <cmath>

#include "octet/check.h"

namespace octet {

float scale_from_amax(float amax, float fp8_max, int margin, float previous_scale, bool* degenerate) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) {  // 0, negative, Inf and NaN all land here
    if (degenerate) *degenerate = true;
    return previous_scale;
  }
  if (degenerate) *degenerate = false;
  const double scale = static_cast<double>(fp8_max) / static_cast<double>(amax) / std::ldexp(1.0, margin);
  return scale > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(scale);
}

bool is_valid_scale(float scale) {
  return scale > 0.0f && std::isfinite(scale) && std::isfinite(1.0f / scale);
}

float round_scale_down_to_power_of_two(float scale) {
  OCTET_CHECK(scale > 0.0f && std::isfinite(scale), "a positive finite scale, got {}", scale);
  int exponent = 0;
  std::frexp(scale, &exponent);  // scale = f * 2^exponent, f in [0.5, 1)
  return std::ldexp(1.0f, exponent - 1);
}

BlockShape block_shape(ScaleGranularity g) {
  switch (g) {
    case ScaleGranularity::per_tensor:
      return {0, 0};
    case ScaleGranularity::tile_1x128:
      return {1, 128};
    case ScaleGranularity::block_128x128:
      return {128, 128};
    case ScaleGranularity::mx_1x32:
      return {1, 32};
  }
  return {0, 0};
}

const char* granularity_name(ScaleGranularity g) {
  switch (g) {
    case ScaleGranularity::per_tensor:
      return "per-tensor";
    case ScaleGranularity::tile_1x128:
      return "1x128";
    case ScaleGranularity::block_128x128:
      return "128x128";
    case ScaleGranularity::mx_1x32:
      return "mx 1x32";
  }
  return "?";
}

const char* recipe_name(RecipeKind k) {
  switch (k) {
    case RecipeKind::current:
      return "current";
    case RecipeKind::delayed:
      return "delayed";
    case RecipeKind::static_scale:
      return "static";
    case RecipeKind::block:
      return "block";
    case RecipeKind::mxfp8:
      return "mxfp8";
  }
  return "?";
}

float ScalingRecipe::cast_scale(const ScalingState&, float, Dtype) const {
  OCTET_CHECK(false, "recipe {} has no per-tensor scale", recipe_name(kind()));
  return 1.0f;
}

void ScalingRecipe::update(ScalingState&, float, Dtype) const {
  OCTET_CHECK(false, "recipe {} keeps no per-tensor state", recipe_name(kind()));
}

float ScalingRecipe::block_scale(float, Dtype, bool*) const {
  OCTET_CHECK(false, "recipe {} has no block scales", recipe_name(kind()));
  return 1.0f;
}

}  // namespace octet
