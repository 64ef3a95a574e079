// Builds the per-GEMM precision plan of a GPT model from the precision settings (see precision_policy.h).
#include "octet/model/precision_policy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/model/calibration.h"
#include "octet/model/precision_map_file.h"

namespace octet {

const char* activation_checkpointing_name(ActivationCheckpointing level) {
  switch (level) {
    case ActivationCheckpointing::none:
      return "none";
    case ActivationCheckpointing::selective:
      return "selective";
    case ActivationCheckpointing::full:
      return "full";
  }
  return "?";
}

bool glob_match(std::string_view pattern, std::string_view name) {
  // Iterative matcher with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p, ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

static std::unique_ptr<ScalingRecipe> make_recipe(const PrecisionSettings& s) {
  switch (s.recipe) {
    case RecipeKind::current:
      return std::make_unique<CurrentScaling>(s.margin);
    case RecipeKind::delayed:
      return std::make_unique<DelayedScaling>(s.amax_history, s.amax_algorithm, s.margin);
    case RecipeKind::static_scale:
      return std::make_unique<StaticScaling>(s.static_scale, s.calibration.string());
    case RecipeKind::block:
      return std::make_unique<BlockScaling>(s.power_of_two_scales);
    case RecipeKind::mxfp8:
      return std::make_unique<MxScaling>();
  }
  return nullptr;
}

// Hopper's FP8 GEMMs need every dimension to be a multiple of 16 (16-byte aligned leading dimensions of
// 1-byte elements); the CPU emulation holds itself to the same rule so that both backends decide alike.
static std::string fp8_shape_problem(int64_t m, int64_t n, int64_t k) {
  for (const auto& [what, v] : {std::pair{"tokens per micro-batch (B*T)", m}, std::pair{"out_features", n},
                                std::pair{"in_features", k}}) {
    if (v % 16 != 0) return fmt::format("{} = {} is not a multiple of 16, which FP8 GEMMs need", what, v);
  }
  return {};
}

PrecisionPolicy::PrecisionPolicy(const PrecisionSettings& settings, const ModelConfig& model,
                                 int64_t tokens_per_step)
    : settings_(settings) {
  const GemmMode base = settings.mode == MixedPrecision::fp32   ? GemmMode::f32
                        : settings.mode == MixedPrecision::fp16 ? GemmMode::f16
                                                                : GemmMode::bf16;
  const bool fp8 = settings.mode == MixedPrecision::fp8;
  if (fp8) recipe_ = make_recipe(settings);
  auto add = [&](std::string name, int64_t in, int64_t out, int64_t block, LinearKind kind) {
    LinearPlan plan;
    plan.name = std::move(name);
    plan.in_features = in;
    plan.out_features = out;
    plan.kind = kind;
    plan.forward = plan.input_gradient = plan.weight_gradient = base;
    if (!fp8) {
      plan.reason = fmt::format("mode {}", mixed_precision_name(settings.mode));
      layers_.push_back(std::move(plan));
      return;
    }
    std::string why;
    const bool is_head = kind == LinearKind::head;
    if (is_head && !settings.lm_head) why = "excluded by config";
    // A router's logits choose the experts: FP8's rounding would change the choice, and its GEMM is tiny.
    if (kind == LinearKind::router) why = "router: excluded by default";
    if (kind == LinearKind::expert && !settings.experts) why = "experts: excluded by default";
    if (why.empty() && !is_head && settings.first_last_blocks_bf16 &&
        (block == 0 || block == model.layers - 1)) {
      why = "first and last blocks kept in BF16 by config";
    }
    if (why.empty() && !settings.include.empty() && !is_head) {
      bool included = false;
      for (const std::string& p : settings.include) included |= glob_match(p, plan.name);
      if (!included) why = "not matched by any include pattern";
    }
    for (const std::string& p : settings.exclude) {
      if (why.empty() && glob_match(p, plan.name)) why = fmt::format("excluded by pattern '{}'", p);
    }
    if (why.empty()) {
      // An expert's rows are its tokens, grouped in multiples of 16 (Backend::group_by_expert's alignment).
      const std::string shape = fp8_shape_problem(kind == LinearKind::expert ? 16 : tokens_per_step, out, in);
      if (!shape.empty()) why = "kept in BF16: " + shape;
    }
    if (why.empty()) {
      plan.forward = settings.fp8_forward ? GemmMode::fp8 : base;
      plan.input_gradient = settings.fp8_input_gradient ? GemmMode::fp8 : base;
      plan.weight_gradient = settings.fp8_weight_gradient && settings.fp8_forward ? GemmMode::fp8 : base;
      plan.reason = "FP8 by policy";
      std::vector<std::string> kept;
      if (plan.forward != GemmMode::fp8) kept.push_back("forward");
      if (plan.input_gradient != GemmMode::fp8) kept.push_back("input gradient");
      if (plan.weight_gradient != GemmMode::fp8) kept.push_back("weight gradient");
      if (!kept.empty()) {
        plan.reason += fmt::format("; {} in BF16 by config", fmt::join(kept, " and "));
        if (settings.fp8_weight_gradient && !settings.fp8_forward) {
          plan.reason += " (an FP8 weight gradient needs the FP8 forward's input)";
        }
      }
      if (!plan.fp8()) plan.reason = "every GEMM kept in BF16 by config";
    } else {
      plan.reason = why;
    }
    layers_.push_back(std::move(plan));
  };
  for (const LinearShape& l : model.linear_layers()) {
    add(l.name, l.in_features, l.out_features, l.block, l.kind);
  }
  if (fp8 && !settings.precision_map.empty()) {
    const std::string origin = settings.precision_map.string();
    const std::vector<std::optional<std::string>> moves =
        precision_map_moves(read_precision_map_file(settings.precision_map), origin, model, layers_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (!moves[i]) continue;
      LinearPlan& p = layers_[i];
      p.forward = p.input_gradient = p.weight_gradient = base;
      p.reason = fmt::format("{} (precision map {})", *moves[i], origin);
      ++precision_map_moved_;
    }
  }
  if (fp8 && !settings.calibration.empty()) {
    OCTET_REQUIRE(settings.recipe == RecipeKind::static_scale,
                  "fp8.calibration = \"{}\" gives the static recipe its scales; fp8.recipe is \"{}\": set "
                  "fp8.recipe = \"static\", or leave fp8.calibration out",
                  settings.calibration.string(), recipe_name(settings.recipe));
    const Calibration calibration = read_calibration_file(settings.calibration);
    calibrated_scales_ =
        octet::calibrated_scales(calibration, settings.calibration.string(), model, layers_, formats());
  }
}

std::optional<std::array<float, 3>> PrecisionPolicy::calibrated_scales(std::string_view layer) const {
  for (size_t i = 0; i < calibrated_scales_.size(); ++i) {
    if (layers_[i].name == layer) return calibrated_scales_[i];
  }
  return std::nullopt;
}

Fp8LinearState PrecisionPolicy::initial_fp8_state(std::string_view layer) const {
  OCTET_CHECK(recipe_ != nullptr, "a policy in fp8 mode for the FP8 state of {}", layer);
  Fp8LinearState state{recipe_->initial_state(), recipe_->initial_state(), recipe_->initial_state()};
  if (const std::optional<std::array<float, 3>> scales = calibrated_scales(layer)) {
    ScalingState* operands[3] = {&state.activation, &state.weight, &state.gradient};
    for (size_t k = 0; k < 3; ++k) {
      operands[k]->scale = (*scales)[k];
      operands[k]->scale_inv = 1.0f / (*scales)[k];
    }
  }
  return state;
}

const LinearPlan& PrecisionPolicy::layer(std::string_view name) const {
  for (const LinearPlan& p : layers_) {
    if (p.name == name) return p;
  }
  OCTET_CHECK(false, "a linear layer named {}", name);
  return layers_.front();
}

void PrecisionPolicy::move_layer_to_bf16(std::string_view name, std::string reason) {
  for (LinearPlan& p : layers_) {
    if (p.name != name) continue;
    p.forward = p.input_gradient = p.weight_gradient = GemmMode::bf16;
    p.reason = std::move(reason);
    return;
  }
  OCTET_CHECK(false, "a linear layer named {}", name);
}

Fp8Formats PrecisionPolicy::formats() const {
  Fp8Formats f;
  if (settings_.all_e4m3) f.gradient = Dtype::e4m3;
  return f;
}

int64_t PrecisionPolicy::fp8_layer_count() const {
  int64_t n = 0;
  for (const LinearPlan& p : layers_) n += p.fp8() ? 1 : 0;
  return n;
}

std::string PrecisionPolicy::startup_line() const {
  if (settings_.mode != MixedPrecision::fp8) return {};
  std::string recipe = recipe_name(settings_.recipe);
  std::string details;
  const std::string formats = settings_.all_e4m3 ? "all E4M3" : "hybrid E4M3/E5M2";
  switch (settings_.recipe) {
    case RecipeKind::delayed:
      details = fmt::format("{}, history {}, {}margin {}", formats, settings_.amax_history,
                            settings_.amax_algorithm == AmaxAlgorithm::max ? "" : "most_recent, ",
                            settings_.margin);
      break;
    case RecipeKind::current:
      details = fmt::format("{}, margin {}", formats, settings_.margin);
      break;
    case RecipeKind::static_scale:
      details = calibrated() ? fmt::format("{}, per-layer scales calibrated in {}", formats,
                                           settings_.calibration.string())
                             : fmt::format("{}, scale {}", formats, settings_.static_scale);
      break;
    case RecipeKind::block:
      details = fmt::format("{}, 1x128 activations and gradients, 128x128 weights{}", formats,
                            settings_.power_of_two_scales ? ", power-of-two scales" : "");
      break;
    case RecipeKind::mxfp8:
      details = fmt::format("{}, E8M0 scale per 32 values", formats);
      break;
  }
  const LinearPlan& head = layers_.back();
  // Routers and experts, by what the first of each kind runs in: "router: excluded by default".
  std::string moe;
  for (const LinearKind kind : {LinearKind::router, LinearKind::expert}) {
    for (const LinearPlan& p : layers_) {
      if (p.kind != kind) continue;
      const char* what = kind == LinearKind::router ? "router" : "experts";
      const std::string prefix = fmt::format("{}: ", what);
      const std::string reason = p.reason.starts_with(prefix) ? p.reason.substr(prefix.size()) : p.reason;
      moe += fmt::format("; {}: {}", what, p.fp8() ? std::string("FP8") : reason);
      break;
    }
  }
  const std::string map = settings_.precision_map.empty()
                              ? std::string()
                              : fmt::format("; {} kept in BF16 by precision map {}", precision_map_moved_,
                                            settings_.precision_map.string());
  return fmt::format("FP8 training enabled: recipe={} ({}); {} of {} linear layers in FP8{}; lm_head: {}{}{}",
                     recipe, details, fp8_layer_count(), layers_.size(), map,
                     head.fp8() ? "FP8" : head.reason, moe,
                     settings_.bf16_weight_gradients ? "; weight gradients in bf16" : "");
}

std::string PrecisionPolicy::map_json(const std::function<std::string(const LinearPlan&)>& more) const {
  std::string out = "[\n";
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LinearPlan& p = layers_[i];
    std::string scales;
    if (i < calibrated_scales_.size() && calibrated_scales_[i]) {
      const std::array<float, 3>& s = *calibrated_scales_[i];
      scales = fmt::format(
          ", \"scales\": {{\"activation\": {}, \"weight\": {}, \"gradient\": {}}}, \"calibration\": {}",
          nlohmann::json(s[0]).dump(), nlohmann::json(s[1]).dump(), nlohmann::json(s[2]).dump(),
          nlohmann::json(settings_.calibration.string()).dump());
    }
    out += fmt::format(
        "  {{\"layer\": \"{}\", \"in_features\": {}, \"out_features\": {}, \"forward\": \"{}\", "
        "\"input_gradient\": \"{}\", \"weight_gradient\": \"{}\", \"reason\": {}{}{}}}{}\n",
        p.name, p.in_features, p.out_features, gemm_mode_name(p.forward), gemm_mode_name(p.input_gradient),
        gemm_mode_name(p.weight_gradient), nlohmann::json(p.reason).dump(), scales,
        more ? more(p) : std::string(), i + 1 < layers_.size() ? "," : "");
  }
  return out + "]\n";
}

}  // namespace octet
