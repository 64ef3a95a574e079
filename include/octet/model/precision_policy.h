// The precision policy: for every GEMM of every linear layer, which precision it runs in and why. Built from
// the precision settings and the model's shapes; it is data the trainer prints (one grep-able line) and
// records (the per-layer map), and the backend executes without changing it.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "octet/backend/precision.h"
#include "octet/model/config.h"

namespace octet {

// train.activation_checkpointing: what each block keeps for its backward and what the backward computes
// again (docs/precision.md). Losses and gradients are the same at every level.
enum class ActivationCheckpointing : uint8_t {
  none,       // every activation the backward reads
  selective,  // not the outputs of the normalizations and of the MLP's activation (the inputs of the GEMMs
              // they feed): made again from what is kept just before the backward reads them, into one
              // buffer shared by every block
  full,       // only the block's input (the residual stream): the block's forward runs again before its
              // backward, into one set of block activations shared by every block
};
const char* activation_checkpointing_name(ActivationCheckpointing level);

struct PrecisionSettings {
  MixedPrecision mode = MixedPrecision::fp32;
  // FP8 recipe (mode fp8 only).
  RecipeKind recipe = RecipeKind::delayed;
  int amax_history = 16;
  AmaxAlgorithm amax_algorithm = AmaxAlgorithm::max;
  int margin = 0;
  float static_scale = 1.0f;
  // fp8.calibration: a calibration file (`octet calibrate`, model/calibration.h) whose per-layer scales the
  // static recipe casts with instead of static_scale; empty: none. Read when the policy is made.
  std::filesystem::path calibration;
  // fp8.precision_map: a precision map file (`octet localize`, model/precision_map_file.h); the layers it
  // sets to BF16 run their three GEMMs in BF16 with its reason. It only ever moves a layer to BF16: a layer
  // the settings above keep out of FP8 stays out. Empty: none. Read when the policy is made.
  std::filesystem::path precision_map;
  // fp8.auto_filter: on the CUDA backend, a layer whose FP8 form measures slower than BF16 at its shape
  // stays in BF16 (train/layer_gain.h, applied by the training run, not by the policy).
  bool auto_filter = false;
  bool power_of_two_scales = false;
  bool all_e4m3 = false;  // false: HYBRID (E4M3 forward tensors, E5M2 gradients)
  // Which linear layers convert: layer names such as "h.0.attn.c_attn", "h.3.mlp.c_proj", "lm_head".
  std::vector<std::string> include;  // empty: every block linear layer
  std::vector<std::string> exclude;
  // Which of a converted layer's GEMMs run in FP8 (the others run in BF16). The weight gradient multiplies
  // the forward's FP8 input, so it can be FP8 only when the forward is.
  bool fp8_forward = true;
  bool fp8_input_gradient = true;
  bool fp8_weight_gradient = true;
  // Hopper's FP8 GEMMs may keep the whole sum in the tensor cores' narrow accumulator (fast accumulation)
  // instead of promoting partial sums to float32 along K. Faster, less exact: on for the forward by default,
  // off for the two backward GEMMs. The GPU only: the CPU emulation always accumulates in float32.
  bool fast_accumulation_forward = true;
  bool fast_accumulation_backward = false;
  bool lm_head = false;                 // convert the LM head too
  bool experts = false;                 // convert the mixture-of-experts layers' experts too (never routers)
  bool first_last_blocks_bf16 = false;  // keep blocks 0 and L-1 in BF16
  // Keep the FP8 codes of each FP8 mlp.c_fc's input (C bytes a token) instead of its float32 output (the
  // GELU's input, 16C bytes a token), and run that forward GEMM again in the backward
  // (Backend::linear_recompute). Only where the input cast is all the layer reads (input_cast_suffices).
  bool recompute_mlp = false;
  // The same for each FP8 attn.c_attn: its input codes (C bytes a token) instead of q, k and v (6C bytes
  // a token in bf16), its forward GEMM run again before attention's backward.
  bool recompute_qkv = false;
  // The same for each FP8 attn.c_proj: its input codes (C bytes a token) instead of the residual stream it
  // writes (4C bytes a token, ln_2's input), its forward GEMM and residual add run again before ln_2's
  // backward (Backend::linear_recompute with a residual epilogue).
  bool recompute_residual = false;
  // Keep each FP8 weight copy's codes of W only, not of W^T too: the input-gradient GEMM's W^T is transposed
  // from them just before it runs (LinearExecution::transpose_weight_per_use). One byte a block weight less
  // on backends that keep weight copies (the CUDA backend); the same results. Only for per-tensor weight
  // scales.
  bool recompute_weight_transposes = false;
  // train.weight_gradients = "bf16": the block layers' weight gradients are kept rounded to bf16 (the GEMM's
  // float32 result rounded once, as PyTorch autocast's weight gradients are), where their weight-gradient
  // GEMM runs in BF16 or FP8; stored in bf16 where the backend's GEMM writes them so. Modes bf16 and fp8.
  bool bf16_weight_gradients = false;
  // train.activation_checkpointing. Here with the fp8.recompute_* settings because, like them, it decides
  // what the model keeps for its backward; it composes with them (a block that runs its forward again keeps
  // the same per-layer choices within that forward).
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::none;
};

// True when `name` matches the glob `pattern` ('*' any run of characters, '?' one character).
bool glob_match(std::string_view pattern, std::string_view name);

struct LinearPlan {
  std::string name;      // "h.0.attn.c_attn", ..., "lm_head"
  int64_t in_features;   // C (K of the forward GEMM)
  int64_t out_features;  // OC
  GemmMode forward = GemmMode::f32;
  GemmMode input_gradient = GemmMode::f32;
  GemmMode weight_gradient = GemmMode::f32;
  std::string reason;  // why this layer runs as it does, e.g. "excluded by pattern '*.mlp.*'"
  LinearKind kind = LinearKind::dense;
  // True when any of the layer's GEMMs runs in FP8.
  bool fp8() const {
    return forward == GemmMode::fp8 || input_gradient == GemmMode::fp8 || weight_gradient == GemmMode::fp8;
  }
};

class PrecisionPolicy {
 public:
  // `tokens_per_step` is B*T of a micro-batch (the M of the forward GEMMs).
  PrecisionPolicy(const PrecisionSettings& settings, const ModelConfig& model, int64_t tokens_per_step);

  const PrecisionSettings& settings() const { return settings_; }
  MixedPrecision mode() const { return settings_.mode; }
  const std::vector<LinearPlan>& layers() const { return layers_; }
  const LinearPlan& layer(std::string_view name) const;
  // Runs all three GEMMs of `name` in BF16 from now on, with `reason` as the layer's reason (an FP8 alert's
  // action, see docs/telemetry.md).
  void move_layer_to_bf16(std::string_view name, std::string reason);
  const ScalingRecipe* recipe() const { return recipe_.get(); }
  Fp8Formats formats() const;
  int64_t fp8_layer_count() const;
  // The layers the precision map (settings().precision_map) moved to BF16.
  int64_t precision_map_moved() const { return precision_map_moved_; }
  // Whether the static recipe casts with per-layer scales from settings().calibration.
  bool calibrated() const { return !calibrated_scales_.empty(); }
  // The scales of an FP8 layer's activation, weight and gradient from the calibration file; nullopt when
  // there is none for it (no calibration, or the layer is not in FP8).
  std::optional<std::array<float, 3>> calibrated_scales(std::string_view layer) const;
  // The FP8 scaling state a layer starts with: the recipe's initial state, with the calibrated scales where
  // there are some.
  Fp8LinearState initial_fp8_state(std::string_view layer) const;

  // The line printed at start in fp8 mode, e.g. "FP8 training enabled: recipe=delayed (hybrid E4M3/E5M2,
  // history 16, margin 0); 48 of 49 linear layers in FP8; lm_head: excluded by config", ending "; weight
  // gradients in bf16" under train.weight_gradients = "bf16"; with a precision map, "...; 3 kept in BF16 by
  // precision map FILE" after the count; a calibrated static recipe says "recipe=static
  // (hybrid E4M3/E5M2, per-layer scales calibrated in FILE)". Empty otherwise.
  std::string startup_line() const;
  // The per-layer map as JSON (one object per layer: name, shape, the three GEMM modes, reason, and for a
  // calibrated FP8 layer its "scales" and their "calibration" file). With `more`, each object also holds the
  // members more(layer) returns (", \"key\": value" text, or empty).
  std::string map_json(const std::function<std::string(const LinearPlan&)>& more = nullptr) const;

 private:
  PrecisionSettings settings_;
  std::vector<LinearPlan> layers_;
  std::unique_ptr<ScalingRecipe> recipe_;
  // Per layer of layers_ (same order), where the layers are calibrated; empty otherwise.
  std::vector<std::optional<std::array<float, 3>>> calibrated_scales_;
  int64_t precision_map_moved_ = 0;
};

}  // namespace octet
