// GPT-2's Hugging Face map (see gpt2.h): the names, shapes and layout of transformers' GPT2LMHeadModel, which
// checkpoints write model.safetensors in, and the model's description (its config.json names) that they
// store beside it.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/model/gpt2.h"

namespace octet {

namespace {

// HF GPT-2's Conv1D layers store the weight [in, out], the transpose of octet's [out, in].
bool is_conv1d_weight(const ParameterInfo& p) {
  if (p.shape.size() != 2 || p.name.rfind("h.", 0) != 0) return false;
  for (const char* suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string_view s(suffix);
    if (p.name.size() > s.size() && p.name.compare(p.name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

}  // namespace

std::string Gpt2::hf_name(const ParameterInfo& p) const {
  if (p.name == "wte" || p.name == "wpe") return "transformer." + p.name + ".weight";
  return "transformer." + p.name;
}

std::vector<int64_t> Gpt2::hf_shape(const ParameterInfo& p) const {
  if (p.name == "wte") return {config_.vocab_size, config_.channels};  // only the real vocabulary rows
  if (is_conv1d_weight(p)) return {p.shape[1], p.shape[0]};
  return p.shape;
}

std::vector<float> Gpt2::to_hf(const ParameterInfo& p, std::span<const float> params) const {
  OCTET_CHECK(p.offset + p.count <= static_cast<int64_t>(params.size()), "parameter {} inside the {} given",
              p.name, params.size());
  const float* source = params.data() + p.offset;
  if (p.name == "wte") return {source, source + config_.vocab_size * config_.channels};
  if (!is_conv1d_weight(p)) return {source, source + p.count};
  const int64_t out = p.shape[0], in = p.shape[1];
  std::vector<float> t(static_cast<size_t>(p.count));
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) t[static_cast<size_t>(i * out + o)] = source[o * in + i];
  }
  return t;
}

void Gpt2::from_hf(const ParameterInfo& p, std::span<const float> hf, std::span<float> params) const {
  const std::vector<int64_t> shape = hf_shape(p);
  int64_t expected = 1;
  for (const int64_t d : shape) expected *= d;
  OCTET_CHECK(static_cast<int64_t>(hf.size()) == expected &&
                  p.offset + p.count <= static_cast<int64_t>(params.size()),
              "{} elements of {} in Hugging Face's layout ({} given) and the parameter inside the {} given",
              expected, p.name, hf.size(), params.size());
  float* target = params.data() + p.offset;
  if (!is_conv1d_weight(p)) {
    std::copy(hf.begin(), hf.end(), target);
    std::fill(target + hf.size(), target + p.count, 0.0f);  // wte's padded vocabulary rows
    return;
  }
  const int64_t out = p.shape[0], in = p.shape[1];
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) target[o * in + i] = hf[static_cast<size_t>(i * out + o)];
  }
}

std::string Gpt2::model_json() const {
  const nlohmann::json j = {{"n_layer", config_.layers},
                            {"n_head", config_.heads},
                            {"n_embd", config_.channels},
                            {"vocab_size", config_.vocab_size},
                            {"padded_vocab_size", config_.padded_vocab()},
                            {"n_positions", config_.max_seq_len}};
  return j.dump();
}

}  // namespace octet
