// Hugging Face's description of a model: config.json of a GPT2LMHeadModel, LlamaForCausalLM or
// MixtralForCausalLM, read into a ModelConfig with every field octet cannot honour refused by name, and
// written back from one; and the index of a sharded checkpoint (model.safetensors.index.json). The readers
// take text and an origin (the file's path) so that the fuzz tests can drive them without files; every
// refusal is an octet::Error of kind invalid_input whose message starts with the origin. See
// docs/huggingface.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "octet/model/config.h"

namespace octet::hf {

// The Hugging Face classes octet reads and writes. A Llama with experts (model.experts > 0) is a Mixtral:
// Mixtral's block is Llama's with the MLP replaced by the mixture of experts octet builds (softmax router,
// top-k renormalized, SwiGLU experts), and transformers has no Llama class with experts.
enum class HfArchitecture : uint8_t { gpt2, llama, mixtral };

HfArchitecture hf_architecture(const ModelConfig& model);
// The class ("GPT2LMHeadModel", "LlamaForCausalLM", "MixtralForCausalLM") and model_type ("gpt2", "llama",
// "mixtral") of each.
std::string_view architecture_class(HfArchitecture architecture);
std::string_view model_type(HfArchitecture architecture);

struct HfModelConfig {
  HfArchitecture architecture = HfArchitecture::gpt2;
  ModelConfig model;  // padded_vocab_size 0: octet's padding of vocab_size
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  // the first one where config.json lists several
};

// Reads config.json's text. Refused, naming the field: not a JSON object, no or an unknown architecture, a
// missing or mistyped shape field, and anything octet's decoder computes differently (GPT-2: an activation
// other than gelu_new, layer_norm_epsilon other than 1e-5, an untied head, n_inner other than 4 n_embd;
// Llama: rms_norm_eps other than 1e-5 (absent means Hugging Face's 1e-6), hidden_act other than silu,
// attention or MLP biases, a head_dim other than hidden_size / num_attention_heads, rope scaling other than
// "llama3"; Mixtral: as Llama, with transformers' Mixtral defaults for absent fields (rms_norm_eps 1e-5,
// 8 key/value heads, rope_theta 1e6, router_aux_loss_coef 0.001), and also a sliding_window or router jitter
// noise); the shape must pass ModelConfig::validate.
HfModelConfig parse_config(std::string_view text, std::string_view origin);

// The token ids a config.json names for a model trained with a tokenizer octet knows.
struct TokenIds {
  std::optional<int64_t> bos;
  std::optional<int64_t> eos;
};

// config.json for `model` (float32 weights), as transformers' from_pretrained reads it, of the class
// hf_architecture(model) names; `quantization` is a JSON object added as "quantization_config" when not
// empty. A model with a shared expert has no Hugging Face class: an internal error (the export refuses it).
std::string config_json(const ModelConfig& model, const TokenIds& tokens, std::string_view quantization = {});

// Reads model.safetensors.index.json's text: {"weight_map": {tensor: file}} (other members ignored). Every
// file must be a plain file name in the same directory (no separator, not "." or ".."). Returns the map.
std::map<std::string, std::string> parse_shard_index(std::string_view text, std::string_view origin);

}  // namespace octet::hf
