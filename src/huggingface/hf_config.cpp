// Reading and writing Hugging Face's config.json and shard index (see hf_config.h).
#include "octet/huggingface/hf_config.h"

#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/input.h"

namespace octet::hf {

namespace {

using nlohmann::json;

// A config.json is a flat object with a few small nested ones; deeper text is refused before it is parsed
// (the JSON library recurses).
constexpr int64_t kMaxDepth = 16;
// The epsilon of octet's LayerNorm and RMSNorm.
constexpr double kNormEpsilon = 1e-5;

json parse_object(std::string_view text, std::string_view origin, std::string_view what) {
  OCTET_REQUIRE(io::json_nesting_depth(text, kMaxDepth) <= kMaxDepth, "{}: nested more than {} deep; {}",
                origin, kMaxDepth, what);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    OCTET_REQUIRE(false, "{}: not valid JSON: {}", origin, io::printable(e.what(), 200));
  }
  OCTET_REQUIRE(j.is_object(), "{}: not a JSON object; {}", origin, what);
  return j;
}

// Present and not null.
bool has(const json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

// A required whole number of at least `min`.
int64_t size_field(const json& j, const char* key, std::string_view origin, int64_t min = 1) {
  OCTET_REQUIRE(has(j, key), "{}: \"{}\" is missing", origin, key);
  const json& v = j.at(key);
  OCTET_REQUIRE(v.is_number_integer(), "{}: \"{}\" must be a whole number, got {}", origin, key,
                io::printable(v.dump()));
  OCTET_REQUIRE(v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(int64_t{1} << 40) &&
                    v.get<int64_t>() >= min,
                "{}: \"{}\" must be a whole number from {} to 2^40, got {}", origin, key, min,
                io::printable(v.dump()));
  return v.get<int64_t>();
}

double number_field(const json& j, const char* key, std::string_view origin, double fallback) {
  if (!has(j, key)) return fallback;
  const json& v = j.at(key);
  OCTET_REQUIRE(v.is_number() && std::isfinite(v.get<double>()), "{}: \"{}\" must be a finite number, got {}",
                origin, key, io::printable(v.dump()));
  return v.get<double>();
}

bool bool_field(const json& j, const char* key, std::string_view origin, bool fallback) {
  if (!has(j, key)) return fallback;
  const json& v = j.at(key);
  OCTET_REQUIRE(v.is_boolean(), "{}: \"{}\" must be true or false, got {}", origin, key,
                io::printable(v.dump()));
  return v.get<bool>();
}

std::string string_field(const json& j, const char* key, std::string_view origin, std::string fallback) {
  if (!has(j, key)) return fallback;
  const json& v = j.at(key);
  OCTET_REQUIRE(v.is_string(), "{}: \"{}\" must be a string, got {}", origin, key, io::printable(v.dump()));
  return v.get<std::string>();
}

// A token id: a whole number, or the first of a list of them (Llama 3.1's eos_token_id).
std::optional<int64_t> token_field(const json& j, const char* key, std::string_view origin) {
  if (!has(j, key)) return std::nullopt;
  const json& v = j.at(key);
  const json& first = v.is_array() && !v.empty() ? v.front() : v;
  OCTET_REQUIRE(first.is_number_unsigned() && first.get<uint64_t>() < (uint64_t{1} << 31),
                "{}: \"{}\" must be a token id (or a list of them), got {}", origin, key,
                io::printable(v.dump()));
  return first.get<int64_t>();
}

// The double of the shortest decimal that reads back as `x` (0.02, not 0.019999999552965164), so that
// config.json shows the number a person wrote.
double shortest_double(float x) {
  const std::string text = fmt::format("{}", x);
  double value = static_cast<double>(x);
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

void require_epsilon(double eps, const char* key, std::string_view origin, std::string_view norm) {
  OCTET_REQUIRE(std::fabs(eps - kNormEpsilon) <= 1e-12, "{}: \"{}\" is {}; octet's {} uses 1e-5 and cannot load it",
                origin, key, eps, norm);
}

ModelConfig gpt2_config(const json& j, std::string_view origin) {
  ModelConfig c;
  c.arch = ModelArchitecture::gpt2;
  c.layers = size_field(j, "n_layer", origin);
  c.heads = size_field(j, "n_head", origin);
  c.channels = size_field(j, "n_embd", origin);
  c.vocab_size = size_field(j, "vocab_size", origin, 2);
  c.max_seq_len = size_field(j, "n_positions", origin);
  const std::string activation = string_field(j, "activation_function", origin, "gelu_new");
  OCTET_REQUIRE(activation == "gelu_new",
                "{}: \"activation_function\" is \"{}\"; octet's GPT-2 uses gelu_new (GELU, tanh approximation)",
                origin, io::printable(activation));
  require_epsilon(number_field(j, "layer_norm_epsilon", origin, kNormEpsilon), "layer_norm_epsilon", origin,
                  "LayerNorm");
  if (has(j, "n_inner")) {
    OCTET_REQUIRE(size_field(j, "n_inner", origin) == 4 * c.channels,
                  "{}: \"n_inner\" must be null or 4 n_embd ({}); octet's GPT-2 MLP is 4 n_embd wide", origin,
                  4 * c.channels);
  }
  OCTET_REQUIRE(bool_field(j, "tie_word_embeddings", origin, true),
                "{}: \"tie_word_embeddings\" is false; octet's GPT-2 head is the token embedding", origin);
  OCTET_REQUIRE(bool_field(j, "scale_attn_weights", origin, true) &&
                    !bool_field(j, "scale_attn_by_inverse_layer_idx", origin, false) &&
                    !bool_field(j, "add_cross_attention", origin, false),
                "{}: octet's GPT-2 attention scales by 1/sqrt(head size) only and has no cross-attention "
                "(scale_attn_weights true, scale_attn_by_inverse_layer_idx and add_cross_attention false)",
                origin);
  return c;
}

void read_rope_scaling(const json& scaling, std::string_view origin, ModelConfig& c) {
  OCTET_REQUIRE(scaling.is_object(), "{}: \"rope_scaling\" must be an object or null", origin);
  const std::string type = has(scaling, "rope_type") ? string_field(scaling, "rope_type", origin, "")
                                                      : string_field(scaling, "type", origin, "default");
  if (type == "default") return;
  OCTET_REQUIRE(type == "llama3",
                "{}: rope scaling of type \"{}\" is not supported; octet has Llama 3.1's (\"llama3\") only",
                origin, io::printable(type));
  c.rope_scaling.factor = static_cast<float>(number_field(scaling, "factor", origin, 0.0));
  c.rope_scaling.low_freq_factor = static_cast<float>(number_field(scaling, "low_freq_factor", origin, 1.0));
  c.rope_scaling.high_freq_factor = static_cast<float>(number_field(scaling, "high_freq_factor", origin, 4.0));
  c.rope_scaling.original_max_seq_len = size_field(scaling, "original_max_position_embeddings", origin);
  OCTET_REQUIRE(c.rope_scaling.factor > 0.0f, "{}: the llama3 rope scaling \"factor\" must be positive", origin);
}

// What transformers assumes for the fields a config.json may leave out, where Llama and Mixtral differ.
struct LlamaFamilyDefaults {
  std::optional<int64_t> kv_heads;  // nullopt: as many as the attention heads
  double rope_theta = 10000.0;
  std::optional<double> rms_norm_eps;  // nullopt: absent is refused (LlamaConfig's 1e-6 is not octet's)
};

// The fields Llama and Mixtral share: the attention, the norms, the rotary embedding and the SwiGLU width
// (Mixtral's intermediate_size is each expert's).
ModelConfig llama_family_config(const json& j, std::string_view origin, const LlamaFamilyDefaults& defaults) {
  ModelConfig c;
  c.arch = ModelArchitecture::llama;
  c.layers = size_field(j, "num_hidden_layers", origin);
  c.heads = size_field(j, "num_attention_heads", origin);
  if (has(j, "num_key_value_heads")) {
    c.kv_heads = size_field(j, "num_key_value_heads", origin);
  } else {
    // Both configurations turn an explicit null into as many as the heads; an absent field takes the default.
    c.kv_heads = j.contains("num_key_value_heads") ? c.heads : defaults.kv_heads.value_or(c.heads);
  }
  c.channels = size_field(j, "hidden_size", origin);
  c.ffn_hidden = size_field(j, "intermediate_size", origin);
  c.vocab_size = size_field(j, "vocab_size", origin, 2);
  c.max_seq_len = size_field(j, "max_position_embeddings", origin);
  c.tie_embeddings = bool_field(j, "tie_word_embeddings", origin, false);
  OCTET_REQUIRE(has(j, "rms_norm_eps") || defaults.rms_norm_eps.has_value(),
                "{}: \"rms_norm_eps\" is missing (Hugging Face then uses 1e-6); octet's RMSNorm uses 1e-5",
                origin);
  require_epsilon(number_field(j, "rms_norm_eps", origin, defaults.rms_norm_eps.value_or(0.0)),
                  "rms_norm_eps", origin, "RMSNorm");
  const std::string activation = string_field(j, "hidden_act", origin, "silu");
  OCTET_REQUIRE(activation == "silu", "{}: \"hidden_act\" is \"{}\"; octet's Llama MLP uses silu (SwiGLU)",
                origin, io::printable(activation));
  OCTET_REQUIRE(!bool_field(j, "attention_bias", origin, false),
                "{}: \"attention_bias\" is true; octet's Llama attention has no biases", origin);
  OCTET_REQUIRE(!bool_field(j, "mlp_bias", origin, false),
                "{}: \"mlp_bias\" is true; octet's Llama MLP has no biases", origin);
  if (has(j, "head_dim")) {
    const int64_t head_dim = size_field(j, "head_dim", origin);
    OCTET_REQUIRE(c.channels % c.heads == 0 && head_dim == c.channels / c.heads,
                  "{}: \"head_dim\" {} is not hidden_size / num_attention_heads; octet's heads split the "
                  "hidden size evenly",
                  origin, head_dim);
  }
  // Transformers 5 keeps the rotary settings in rope_parameters; earlier versions in rope_theta and
  // rope_scaling.
  const json none;
  const json& parameters = has(j, "rope_parameters") ? j.at("rope_parameters") : none;
  OCTET_REQUIRE(parameters.is_null() || parameters.is_object(), "{}: \"rope_parameters\" must be an object",
                origin);
  c.rope_theta = static_cast<float>(number_field(j, "rope_theta", origin, defaults.rope_theta));
  if (parameters.is_object()) {
    c.rope_theta = static_cast<float>(number_field(parameters, "rope_theta", origin, c.rope_theta));
    read_rope_scaling(parameters, origin, c);
  } else if (has(j, "rope_scaling")) {
    read_rope_scaling(j.at("rope_scaling"), origin, c);
  }
  OCTET_REQUIRE(c.rope_theta > 0.0f && std::isfinite(c.rope_theta), "{}: \"rope_theta\" must be positive",
                origin);
  return c;
}

ModelConfig llama_config(const json& j, std::string_view origin) {
  return llama_family_config(j, origin, LlamaFamilyDefaults{});
}

// MixtralConfig's defaults (transformers 4 and 5 alike): 8 key/value heads, rope_theta 1e6, rms_norm_eps
// 1e-5, router_aux_loss_coef 0.001. The experts' counts are shape fields and required.
ModelConfig mixtral_config(const json& j, std::string_view origin) {
  ModelConfig c = llama_family_config(j, origin, LlamaFamilyDefaults{8, 1e6, kNormEpsilon});
  c.experts = size_field(j, "num_local_experts", origin);
  c.experts_per_token = size_field(j, "num_experts_per_tok", origin);
  c.shared_expert = false;
  const double coefficient = number_field(j, "router_aux_loss_coef", origin, 0.001);
  OCTET_REQUIRE(coefficient >= 0.0 && coefficient <= 1e6,
                "{}: \"router_aux_loss_coef\" must be from 0 to 1e6, got {}", origin, coefficient);
  c.router_aux_loss_coef = static_cast<float>(coefficient);
  // Mistral's sliding-window attention: octet's attention sees the whole causal context.
  OCTET_REQUIRE(!has(j, "sliding_window"),
                "{}: \"sliding_window\" is {}; octet's attention is not windowed (it must be null)", origin,
                io::printable(j.at("sliding_window").dump()));
  const double jitter = number_field(j, "router_jitter_noise", origin, 0.0);
  OCTET_REQUIRE(jitter == 0.0,
                "{}: \"router_jitter_noise\" is {}; octet's router multiplies no noise into its input in "
                "training (it must be 0)",
                origin, jitter);
  return c;
}

}  // namespace

HfArchitecture hf_architecture(const ModelConfig& model) {
  if (model.arch == ModelArchitecture::gpt2) return HfArchitecture::gpt2;
  return model.moe() ? HfArchitecture::mixtral : HfArchitecture::llama;
}

std::string_view architecture_class(HfArchitecture architecture) {
  switch (architecture) {
    case HfArchitecture::gpt2:
      return "GPT2LMHeadModel";
    case HfArchitecture::llama:
      return "LlamaForCausalLM";
    case HfArchitecture::mixtral:
      return "MixtralForCausalLM";
  }
  return "unknown";
}

std::string_view model_type(HfArchitecture architecture) {
  switch (architecture) {
    case HfArchitecture::gpt2:
      return "gpt2";
    case HfArchitecture::llama:
      return "llama";
    case HfArchitecture::mixtral:
      return "mixtral";
  }
  return "unknown";
}

HfModelConfig parse_config(std::string_view text, std::string_view origin) {
  const json j = parse_object(text, origin, "expected a Hugging Face config.json");
  OCTET_REQUIRE(has(j, "architectures") && j.at("architectures").is_array() &&
                    j.at("architectures").size() == 1 && j.at("architectures").front().is_string(),
                "{}: \"architectures\" must list one class name (GPT2LMHeadModel, LlamaForCausalLM or "
                "MixtralForCausalLM)",
                origin);
  const std::string name = j.at("architectures").front().get<std::string>();
  std::optional<HfArchitecture> architecture;
  for (const HfArchitecture a : {HfArchitecture::gpt2, HfArchitecture::llama, HfArchitecture::mixtral}) {
    if (name == architecture_class(a)) architecture = a;
  }
  OCTET_REQUIRE(
      architecture.has_value(),
      "{}: architecture \"{}\" is not one octet builds; it imports GPT2LMHeadModel, LlamaForCausalLM "
      "and MixtralForCausalLM",
      origin, io::printable(name));
  const std::string type = string_field(j, "model_type", origin, std::string(model_type(*architecture)));
  OCTET_REQUIRE(type == model_type(*architecture), "{}: \"model_type\" is \"{}\" but the architecture is {}",
                origin, io::printable(type), name);
  HfModelConfig result;
  result.architecture = *architecture;
  switch (*architecture) {
    case HfArchitecture::gpt2:
      result.model = gpt2_config(j, origin);
      break;
    case HfArchitecture::llama:
      result.model = llama_config(j, origin);
      break;
    case HfArchitecture::mixtral:
      result.model = mixtral_config(j, origin);
      break;
  }
  result.bos_token_id = token_field(j, "bos_token_id", origin);
  result.eos_token_id = token_field(j, "eos_token_id", origin);
  try {
    result.model.validate();
  } catch (const Error& e) {
    OCTET_REQUIRE(false, "{}: the model's shape is not one octet can build: {}", origin, e.what());
  }
  return result;
}

std::string config_json(const ModelConfig& m, const TokenIds& tokens, std::string_view quantization) {
  OCTET_CHECK(!(m.moe() && m.shared_expert), "a model without a shared expert (Mixtral has none), got {}",
              m.describe());
  const HfArchitecture architecture = hf_architecture(m);
  json j;
  j["architectures"] = {std::string(architecture_class(architecture))};
  j["model_type"] = std::string(model_type(architecture));
  j["vocab_size"] = m.vocab_size;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  // Transformers 5 reads "dtype", earlier versions "torch_dtype".
  j["dtype"] = "float32";
  j["torch_dtype"] = "float32";
  if (m.arch == ModelArchitecture::llama) {
    j["hidden_size"] = m.channels;
    j["intermediate_size"] = m.hidden();
    j["num_hidden_layers"] = m.layers;
    j["num_attention_heads"] = m.heads;
    j["num_key_value_heads"] = m.kv();
    j["head_dim"] = m.head_size();
    j["max_position_embeddings"] = m.max_seq_len;
    j["rms_norm_eps"] = kNormEpsilon;
    j["hidden_act"] = "silu";
    j["attention_dropout"] = 0.0;
    j["tie_word_embeddings"] = m.tie_embeddings;
    if (architecture == HfArchitecture::llama) {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      j["pretraining_tp"] = 1;
    } else {
      // intermediate_size above is each expert's width. output_router_logits false: from_pretrained's
      // model returns no router logits and adds no balance loss unless asked, as for any Mixtral.
      j["num_local_experts"] = m.experts;
      j["num_experts_per_tok"] = m.experts_per_token;
      j["router_aux_loss_coef"] = shortest_double(m.router_aux_loss_coef);
      j["output_router_logits"] = false;
      j["router_jitter_noise"] = 0.0;
      j["sliding_window"] = nullptr;
    }
    // Both spellings: rope_theta and rope_scaling for transformers 4, rope_parameters for 5.
    const double theta = static_cast<double>(m.rope_theta);
    j["rope_theta"] = theta;
    json parameters = {{"rope_type", "default"}, {"rope_theta", theta}};
    if (m.rope_scaling.factor > 0.0f) {
      const json scaling = {{"rope_type", "llama3"},
                            {"factor", static_cast<double>(m.rope_scaling.factor)},
                            {"low_freq_factor", static_cast<double>(m.rope_scaling.low_freq_factor)},
                            {"high_freq_factor", static_cast<double>(m.rope_scaling.high_freq_factor)},
                            {"original_max_position_embeddings", m.rope_scaling.original_max_seq_len}};
      j["rope_scaling"] = scaling;
      parameters = scaling;
      parameters["rope_theta"] = theta;
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["rope_parameters"] = parameters;
  } else {
    j["n_layer"] = m.layers;
    j["n_head"] = m.heads;
    j["n_embd"] = m.channels;
    j["n_positions"] = m.max_seq_len;
    j["n_ctx"] = m.max_seq_len;
    j["n_inner"] = nullptr;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = kNormEpsilon;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
  }
  if (tokens.bos) j["bos_token_id"] = *tokens.bos;
  if (tokens.eos) j["eos_token_id"] = *tokens.eos;
  if (architecture == HfArchitecture::mixtral) {
    // MixtralConfig takes 1 and 2 for absent token ids: a model without them says null.
    if (!tokens.bos) j["bos_token_id"] = nullptr;
    if (!tokens.eos) j["eos_token_id"] = nullptr;
  }
  if (!quantization.empty()) j["quantization_config"] = json::parse(quantization);
  return j.dump(2) + "\n";
}

std::map<std::string, std::string> parse_shard_index(std::string_view text, std::string_view origin) {
  const json j = parse_object(text, origin, "expected a safetensors shard index");
  OCTET_REQUIRE(j.contains("weight_map") && j.at("weight_map").is_object(),
                "{}: \"weight_map\" (an object of tensor name: file) is missing", origin);
  std::map<std::string, std::string> map;
  for (const auto& [tensor, file] : j.at("weight_map").items()) {
    OCTET_REQUIRE(file.is_string(), "{}: the file of tensor '{}' is not a string", origin, io::printable(tensor));
    const std::string name = file.get<std::string>();
    OCTET_REQUIRE(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                      name.find('\0') == std::string::npos,
                  "{}: tensor '{}' names the file '{}', which is not a file name in the same directory", origin,
                  io::printable(tensor), io::printable(name));
    map[tensor] = name;
  }
  OCTET_REQUIRE(!map.empty(), "{}: \"weight_map\" names no tensors", origin);
  return map;
}

}  // namespace octet::hf
