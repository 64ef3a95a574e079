// The decoder's Hugging Face map (see decoder.h): the names, shapes and layout of transformers'
// GPT2LMHeadModel and LlamaForCausalLM, which checkpoints write model.safetensors in, and the model's
// description (its config.json names) that they store beside it.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/model/decoder.h"

namespace octet {

namespace {

// HF GPT-2's Conv1D layers store the weight [in, out], the transpose of octet's [out, in]; Llama's Linear
// layers store octet's layout.
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

std::string Decoder::hf_name(const ParameterInfo& p) const {
  if (config_.arch == ModelArchitecture::llama) return p.name == "lm_head.weight" ? p.name : "model." + p.name;
  if (p.name == "wte" || p.name == "wpe") return "transformer." + p.name + ".weight";
  return "transformer." + p.name;
}

bool Decoder::vocabulary_rows(const ParameterInfo& p) const {
  return p.name == embedding_name() || p.name == "lm_head.weight";
}

std::vector<int64_t> Decoder::hf_shape(const ParameterInfo& p) const {
  if (vocabulary_rows(p)) return {config_.vocab_size, config_.channels};  // only the real vocabulary rows
  if (is_conv1d_weight(p)) return {p.shape[1], p.shape[0]};
  return p.shape;
}

std::vector<float> Decoder::to_hf(const ParameterInfo& p, std::span<const float> params) const {
  OCTET_CHECK(p.offset + p.count <= static_cast<int64_t>(params.size()), "parameter {} inside the {} given",
              p.name, params.size());
  const float* source = params.data() + p.offset;
  if (vocabulary_rows(p)) return {source, source + config_.vocab_size * config_.channels};
  if (!is_conv1d_weight(p)) return {source, source + p.count};
  const int64_t out = p.shape[0], in = p.shape[1];
  std::vector<float> t(static_cast<size_t>(p.count));
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) t[static_cast<size_t>(i * out + o)] = source[o * in + i];
  }
  return t;
}

void Decoder::from_hf(const ParameterInfo& p, std::span<const float> hf, std::span<float> params) const {
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
    std::fill(target + hf.size(), target + p.count, 0.0f);  // the padded vocabulary rows
    return;
  }
  const int64_t out = p.shape[0], in = p.shape[1];
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) target[o * in + i] = hf[static_cast<size_t>(i * out + o)];
  }
}

std::string Decoder::model_json() const {
  if (config_.arch == ModelArchitecture::llama) {
    nlohmann::json j = {{"num_hidden_layers", config_.layers},
                        {"num_attention_heads", config_.heads},
                        {"num_key_value_heads", config_.kv()},
                        {"hidden_size", config_.channels},
                        {"intermediate_size", config_.hidden()},
                        {"vocab_size", config_.vocab_size},
                        {"padded_vocab_size", config_.padded_vocab()},
                        {"max_position_embeddings", config_.max_seq_len},
                        {"rope_theta", config_.rope_theta},
                        {"rms_norm_eps", 1e-5},
                        {"tie_word_embeddings", config_.tied_head()}};
    if (config_.rope_scaling.factor > 0.0) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", config_.rope_scaling.factor},
                           {"low_freq_factor", config_.rope_scaling.low_freq_factor},
                           {"high_freq_factor", config_.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", config_.rope_scaling.original_max_seq_len}};
    }
    if (config_.moe()) {  // MixtralConfig's names, and the shared expert Mixtral lacks
      j["num_local_experts"] = config_.experts;
      j["num_experts_per_tok"] = config_.experts_per_token;
      j["shared_expert"] = config_.shared_expert;
    }
    return j.dump();
  }
  const nlohmann::json j = {{"n_layer", config_.layers},
                            {"n_head", config_.heads},
                            {"n_embd", config_.channels},
                            {"vocab_size", config_.vocab_size},
                            {"padded_vocab_size", config_.padded_vocab()},
                            {"n_positions", config_.max_seq_len}};
  return j.dump();
}

}  // namespace octet
