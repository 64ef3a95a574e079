// Scaling recipes: how the scale of an FP8 cast is chosen. One class per recipe behind one interface
// (ScalingRecipe); the per-tensor state a recipe keeps across steps lives in ScalingState, owned by the
// tensor it scales. Convention everywhere: an FP8 tensor stores q = cast(x * scale) and scale_inv = 1/scale;
// q * scale_inv stands for x.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "octet/numerics/format.h"

namespace octet {

enum class RecipeKind : uint8_t { current, delayed, static_scale, block, mxfp8 };
enum class AmaxAlgorithm : uint8_t { max, most_recent };

// What a tensor is to a GEMM; block recipes tile activations and gradients 1x128 and weights 128x128.
enum class TensorRole : uint8_t { activation, weight, gradient };

// How many scales a quantized tensor carries and which elements share one.
enum class ScaleGranularity : uint8_t {
  per_tensor,     // one scale
  tile_1x128,     // one scale per 1 x 128 run along a row (the K dimension)
  block_128x128,  // one scale per 128 x 128 block
  mx_1x32,        // one E8M0 power-of-two scale per 1 x 32 run along a row (MXFP8)
};

struct BlockShape {
  int64_t rows;
  int64_t cols;  // 0 means the whole extent (per-tensor)
};
BlockShape block_shape(ScaleGranularity g);
const char* granularity_name(ScaleGranularity g);
const char* recipe_name(RecipeKind k);

// The state a per-tensor recipe carries for one tensor from one step to the next.
struct ScalingState {
  float scale = 1.0f;               // used by the next cast
  float scale_inv = 1.0f;           // 1 / scale
  float last_amax = 0.0f;           // amax seen by the last cast
  std::vector<float> amax_history;  // delayed scaling only; [0] is the most recent
  int64_t updates = 0;              // amaxes recorded so far
  int64_t degenerate_amax = 0;      // updates whose amax was 0, Inf or NaN (previous scale kept)
};

// scale = fp8_max / amax / 2^margin. An amax of 0, Inf or NaN cannot give a scale: the previous scale is
// returned and *degenerate set. A scale that would overflow float32 (amax tiny) is clamped to the largest
// float32.
float scale_from_amax(float amax, float fp8_max, int margin, float previous_scale, bool* degenerate);

// A usable per-tensor scale: positive, finite, and with a finite inverse (scale_inv = 1 / scale is stored
// with the tensor), i.e. between 1 / FLT_MAX (about 2.9e-39) and FLT_MAX.
bool is_valid_scale(float scale);

// The largest power of two not above `scale` (the scale then never pushes amax past fp8_max).
float round_scale_down_to_power_of_two(float scale);

class ScalingRecipe {
 public:
  virtual ~ScalingRecipe() = default;
  virtual RecipeKind kind() const = 0;
  // One line for logs, e.g. "delayed (history 16, max, margin 0)".
  virtual std::string describe() const = 0;
  virtual ScaleGranularity granularity(TensorRole role) const = 0;

  // Per-tensor recipes. Whether the cast needs this tensor's amax before it can start (an extra read of the
  // tensor unless its producer computes the amax).
  virtual bool needs_amax_before_cast() const { return false; }
  // The scale for this cast; `tensor_amax` is this tensor's amax when needs_amax_before_cast().
  virtual float cast_scale(const ScalingState& state, float tensor_amax, Dtype format) const;
  // After the cast: record the amax and choose the scale for the next cast.
  virtual void update(ScalingState& state, float tensor_amax, Dtype format) const;
  // Fresh state for a tensor under this recipe.
  virtual ScalingState initial_state() const { return {}; }

  // Block recipes: the scale of one block from its amax. Degenerate blocks (amax 0, Inf, NaN) take scale 1
  // and set *degenerate; block recipes keep no state across steps.
  virtual float block_scale(float block_amax, Dtype format, bool* degenerate) const;
};

// Scale from this tensor's own amax, just in time.
class CurrentScaling final : public ScalingRecipe {
 public:
  explicit CurrentScaling(int margin = 0);
  RecipeKind kind() const override { return RecipeKind::current; }
  std::string describe() const override;
  ScaleGranularity granularity(TensorRole) const override { return ScaleGranularity::per_tensor; }
  bool needs_amax_before_cast() const override { return true; }
  float cast_scale(const ScalingState& state, float tensor_amax, Dtype format) const override;
  void update(ScalingState& state, float tensor_amax, Dtype format) const override;
  int margin() const { return margin_; }

 private:
  int margin_;
};

// Scale from the amaxes of earlier steps: the cast needs no extra pass, and this cast's amax feeds later
// ones.
class DelayedScaling final : public ScalingRecipe {
 public:
  DelayedScaling(int history_length = 16, AmaxAlgorithm algorithm = AmaxAlgorithm::max, int margin = 0);
  RecipeKind kind() const override { return RecipeKind::delayed; }
  std::string describe() const override;
  ScaleGranularity granularity(TensorRole) const override { return ScaleGranularity::per_tensor; }
  float cast_scale(const ScalingState& state, float tensor_amax, Dtype format) const override;
  void update(ScalingState& state, float tensor_amax, Dtype format) const override;
  ScalingState initial_state() const override;
  int history_length() const { return history_length_; }
  AmaxAlgorithm algorithm() const { return algorithm_; }
  int margin() const { return margin_; }

 private:
  int history_length_;
  AmaxAlgorithm algorithm_;
  int margin_;
};

// Fixed scales: each tensor keeps the scale its state starts with (`scale` by default, or a per-layer scale
// from a calibration pass that the model sets in the state), and casts with it on every step; amaxes are
// still recorded for telemetry. `calibration` names the calibration file the per-layer scales come from
// (empty: none), for describe(), which checkpoints compare on resume.
class StaticScaling final : public ScalingRecipe {
 public:
  explicit StaticScaling(float scale, std::string calibration = {});
  RecipeKind kind() const override { return RecipeKind::static_scale; }
  std::string describe() const override;
  ScaleGranularity granularity(TensorRole) const override { return ScaleGranularity::per_tensor; }
  float cast_scale(const ScalingState& state, float tensor_amax, Dtype format) const override;
  void update(ScalingState& state, float tensor_amax, Dtype format) const override;
  ScalingState initial_state() const override;
  float scale() const { return scale_; }
  const std::string& calibration() const { return calibration_; }

 private:
  float scale_;
  std::string calibration_;
};

// DeepSeek-V3 style: 1x128 tiles for activations and gradients, 128x128 blocks for weights, float32 scales
// (optionally rounded down to powers of two).
class BlockScaling final : public ScalingRecipe {
 public:
  explicit BlockScaling(bool power_of_two_scales = false);
  RecipeKind kind() const override { return RecipeKind::block; }
  std::string describe() const override;
  ScaleGranularity granularity(TensorRole role) const override;
  float block_scale(float block_amax, Dtype format, bool* degenerate) const override;

 private:
  bool power_of_two_;
};

// MXFP8: one E8M0 scale per 32 consecutive elements of a row. The scale is the smallest power of two that
// brings the block's amax within the format's largest finite value, so no element saturates.
class MxScaling final : public ScalingRecipe {
 public:
  RecipeKind kind() const override { return RecipeKind::mxfp8; }
  std::string describe() const override;
  ScaleGranularity granularity(TensorRole) const override { return ScaleGranularity::mx_1x32; }
  float block_scale(float block_amax, Dtype format, bool* degenerate) const override;
};

}  // namespace octet
