// The places of the decoder's parameters in Hugging Face checkpoints (see hf_tensor_map.h).
#include "hf_tensor_map.h"

#include <charconv>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::hf {

namespace {

// A parameter of a mixture-of-experts block, from its octet name: layers.N.mlp.gate.weight (the router,
// expert -1) or layers.N.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight.
struct ExpertParameter {
  int64_t layer = 0;
  int64_t expert = -1;
  std::string_view projection;  // "gate" for the router
};

// Reads a decimal number at the front of `text` and drops it; nullopt when there is none.
std::optional<int64_t> take_number(std::string_view& text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return std::nullopt;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return value;
}

bool take_prefix(std::string_view& text, std::string_view prefix) {
  if (!text.starts_with(prefix)) return false;
  text.remove_prefix(prefix.size());
  return true;
}

std::optional<ExpertParameter> expert_parameter(std::string_view name) {
  ExpertParameter p;
  if (!take_prefix(name, "layers.")) return std::nullopt;
  const std::optional<int64_t> layer = take_number(name);
  if (!layer || !take_prefix(name, ".mlp.")) return std::nullopt;
  p.layer = *layer;
  if (name == "gate.weight") {
    p.projection = "gate";
    return p;
  }
  if (!take_prefix(name, "experts.")) return std::nullopt;
  const std::optional<int64_t> expert = take_number(name);
  if (!expert || !take_prefix(name, ".") || !name.ends_with(".weight")) return std::nullopt;
  p.expert = *expert;
  p.projection = name.substr(0, name.size() - std::string_view(".weight").size());
  return p;
}

}  // namespace

std::vector<TensorPlace> tensor_places(const Model& model, const ParameterInfo& p, const ModelConfig& config,
                                       HfArchitecture architecture) {
  const std::vector<int64_t> shape = model.hf_shape(p);
  int64_t count = 1;
  for (const int64_t d : shape) count *= d;
  const TensorPlace own{model.hf_name(p), shape, 0, count};
  if (architecture != HfArchitecture::mixtral) return {own};
  OCTET_CHECK(p.name.find(".mlp.shared_expert.") == std::string::npos,
              "a Mixtral parameter (Mixtral has no shared expert), got {}", p.name);
  const std::optional<ExpertParameter> e = expert_parameter(p.name);
  if (!e) return {own};

  const int64_t C = config.channels, F = config.hidden(), E = config.experts;
  const std::string block = fmt::format("model.layers.{}.", e->layer);
  if (e->projection == "gate") {
    return {{block + "block_sparse_moe.gate.weight", shape, 0, count},
            {block + "mlp.gate.weight", shape, 0, count}};
  }
  // Mixtral's w1, w3 and w2 are Llama's gate_proj, up_proj and down_proj.
  const std::string classic = fmt::format("{}block_sparse_moe.experts.{}.", block, e->expert);
  if (e->projection == "gate_proj" || e->projection == "up_proj") {
    const bool up = e->projection == "up_proj";
    return {
        {classic + (up ? "w3.weight" : "w1.weight"), shape, 0, count},
        {block + "mlp.experts.gate_up_proj", {E, 2 * F, C}, (2 * e->expert + (up ? 1 : 0)) * F * C, F * C}};
  }
  OCTET_CHECK(e->projection == "down_proj", "an expert's gate_proj, up_proj or down_proj, got {}", p.name);
  return {{classic + "w2.weight", shape, 0, count},
          {block + "mlp.experts.down_proj", {E, C, F}, e->expert * C * F, C * F}};
}

}  // namespace octet::hf
