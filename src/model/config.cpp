// Validation, derived sizes and linear layers of a model's shape.
#include "octet/model/config.h"

#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

const char* architecture_name(ModelArchitecture architecture) {
  switch (architecture) {
    case ModelArchitecture::gpt2:
      return "gpt2";
    case ModelArchitecture::llama:
      return "llama";
  }
  return "unknown";
}

int64_t ModelConfig::padded_vocab() const {
  if (padded_vocab_size > 0) return padded_vocab_size;
  return (vocab_size + 63) / 64 * 64;
}

int64_t ModelConfig::hidden() const {
  if (arch == ModelArchitecture::gpt2) return 4 * channels;
  if (ffn_hidden > 0) return ffn_hidden;
  return (8 * channels / 3 + 255) / 256 * 256;
}

std::vector<LinearShape> ModelConfig::linear_layers() const {
  const int64_t C = channels, H = hidden();
  std::vector<LinearShape> out;
  for (int64_t l = 0; l < layers; ++l) {
    if (arch == ModelArchitecture::gpt2) {
      out.push_back({fmt::format("h.{}.attn.c_attn", l), C, 3 * C, l});
      out.push_back({fmt::format("h.{}.attn.c_proj", l), C, C, l});
      out.push_back({fmt::format("h.{}.mlp.c_fc", l), C, H, l});
      out.push_back({fmt::format("h.{}.mlp.c_proj", l), H, C, l});
    } else {
      // q, k and v run as one GEMM, and so do gate and up (their weights stacked), as Megatron and
      // Transformer Engine fuse them.
      out.push_back({fmt::format("layers.{}.self_attn.qkv_proj", l), C, qkv_width(), l});
      out.push_back({fmt::format("layers.{}.self_attn.o_proj", l), C, C, l});
      if (!moe()) {
        out.push_back({fmt::format("layers.{}.mlp.gate_up_proj", l), C, 2 * H, l});
        out.push_back({fmt::format("layers.{}.mlp.down_proj", l), H, C, l});
        continue;
      }
      // The router, each expert's gate/up and down, then the shared expert's.
      out.push_back({fmt::format("layers.{}.mlp.gate", l), C, experts, l, LinearKind::router});
      for (int64_t e = 0; e < experts; ++e) {
        out.push_back({fmt::format("layers.{}.mlp.experts.{}.gate_up_proj", l, e), C, 2 * H, l, LinearKind::expert});
        out.push_back({fmt::format("layers.{}.mlp.experts.{}.down_proj", l, e), H, C, l, LinearKind::expert});
      }
      if (shared_expert) {
        out.push_back({fmt::format("layers.{}.mlp.shared_expert.gate_up_proj", l), C, 2 * H, l});
        out.push_back({fmt::format("layers.{}.mlp.shared_expert.down_proj", l), H, C, l});
      }
    }
  }
  out.push_back({"lm_head", C, padded_vocab(), -1, LinearKind::head});
  return out;
}

void ModelConfig::validate() const {
  OCTET_REQUIRE(vocab_size >= 2, "model.vocab_size must be at least 2, got {}", vocab_size);
  OCTET_REQUIRE(padded_vocab_size == 0 || padded_vocab_size >= vocab_size,
                "model.padded_vocab_size ({}) must be 0 (automatic) or at least vocab_size ({})",
                padded_vocab_size, vocab_size);
  OCTET_REQUIRE(max_seq_len >= 1, "model.max_seq_len must be at least 1, got {}", max_seq_len);
  OCTET_REQUIRE(layers >= 1, "model.layers must be at least 1, got {}", layers);
  OCTET_REQUIRE(heads >= 1, "model.heads must be at least 1, got {}", heads);
  OCTET_REQUIRE(channels >= 1 && channels % heads == 0,
                "model.channels ({}) must be a positive multiple of model.heads ({})", channels, heads);
  if (arch == ModelArchitecture::gpt2) {
    OCTET_REQUIRE(kv_heads == 0 || kv_heads == heads,
                  "model.kv_heads ({}) is for Llama; GPT-2 has as many key and value heads as heads ({})",
                  kv_heads, heads);
    OCTET_REQUIRE(ffn_hidden == 0 || ffn_hidden == 4 * channels,
                  "model.ffn_hidden ({}) is for Llama; GPT-2's MLP is 4 x model.channels ({}) wide",
                  ffn_hidden, 4 * channels);
    OCTET_REQUIRE(experts == 0, "model.experts ({}) is for Llama; GPT-2's MLP is dense (0)", experts);
    return;
  }
  OCTET_REQUIRE(kv_heads >= 0 && heads % kv() == 0,
                "model.kv_heads ({}) must divide model.heads ({}) (0: as many as heads)", kv_heads, heads);
  OCTET_REQUIRE(head_size() % 2 == 0,
                "the head size model.channels / model.heads ({}) must be even for the "
                "rotary embedding",
                head_size());
  OCTET_REQUIRE(ffn_hidden >= 0, "model.ffn_hidden must be 0 (Llama's rule) or positive, got {}", ffn_hidden);
  OCTET_REQUIRE(rope_theta > 1.0, "model.rope_theta must be more than 1, got {}", rope_theta);
  OCTET_REQUIRE(
      rope_scaling.factor == 0.0 ||
          (rope_scaling.factor >= 1.0 && rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
           rope_scaling.low_freq_factor > 0.0 && rope_scaling.original_max_seq_len >= 1),
      "model.rope_scaling_factor ({}) must be 0 (off) or at least 1, with rope_high_freq_factor ({}) "
      "above rope_low_freq_factor ({}) above 0",
      rope_scaling.factor, rope_scaling.high_freq_factor, rope_scaling.low_freq_factor);
  OCTET_REQUIRE(experts == 0 || experts >= 2,
                "model.experts must be 0 (a dense MLP) or at least 2, got {}", experts);
  if (moe()) {
    OCTET_REQUIRE(experts_per_token >= 1 && experts_per_token <= experts,
                  "model.experts_per_token ({}) must be between 1 and model.experts ({})", experts_per_token,
                  experts);
    OCTET_REQUIRE(router_aux_loss_coef >= 0.0f && std::isfinite(router_aux_loss_coef),
                  "model.router_aux_loss_coef must be 0 or more, got {}", router_aux_loss_coef);
  }
}

std::string ModelConfig::describe() const {
  if (arch == ModelArchitecture::gpt2) {
    return fmt::format("GPT-2: {} layers, {} channels, {} heads, context {}, vocabulary {} (padded {})",
                       layers, channels, heads, max_seq_len, vocab_size, padded_vocab());
  }
  return fmt::format(
      "Llama: {} layers, {} channels, {} heads ({} key/value), MLP {}, context {}, rope theta {}, vocabulary "
      "{} "
      "(padded {}), head {}{}",
      layers, channels, heads, kv(), hidden(), max_seq_len, rope_theta, vocab_size, padded_vocab(),
      tied_head() ? "tied to the embedding" : "untied",
      moe() ? fmt::format("; {} experts, {} per token{}, router balance loss x {}", experts, experts_per_token,
                          shared_expert ? ", a shared expert" : "", router_aux_loss_coef)
            : std::string());
}

}  // namespace octet
