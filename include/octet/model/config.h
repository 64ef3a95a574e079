// Shapes of a decoder-only language model, GPT-2 or Llama. Shape letters follow llm.c: B batch, T sequence
// length, C channels, NH heads, L layers, V vocabulary, Vp vocabulary padded for GEMM efficiency; Llama adds
// KV (key and value heads, grouped-query attention) and F (the MLP's hidden width).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace octet {

// The model architectures octet builds (model.arch; make_model in model.h).
enum class ModelArchitecture : uint8_t {
  gpt2,   // learned positions, LayerNorm, GELU MLP with biases, head tied to the token embedding
  llama,  // rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases, untied head
};
const char* architecture_name(ModelArchitecture architecture);

// Llama 3.1's scaling of the rotary frequencies for long contexts (Hugging Face's rope_type "llama3").
struct RopeScaling {
  float factor = 0.0f;  // 0: no scaling
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_seq_len = 8192;
};

// What a linear layer is to the precision policy: one of a block's dense projections (attention's, the
// dense MLP's or a shared expert's), a mixture-of-experts router, one expert's projection, or the head.
enum class LinearKind : uint8_t { dense, router, expert, head };

// A linear layer of the model, as the precision policy decides on it: its name, its shape, its block (-1 for
// the head) and its kind.
struct LinearShape {
  std::string name;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t block = -1;
  LinearKind kind = LinearKind::dense;
};

struct ModelConfig {
  ModelArchitecture arch = ModelArchitecture::gpt2;
  int64_t vocab_size = 50257;     // V: real tokens; the loss covers only these
  int64_t padded_vocab_size = 0;  // Vp: rows of the embedding; 0 means V rounded up to a multiple of 64
  int64_t max_seq_len = 1024;     // the longest sequence (GPT-2: positions of the learned position embedding)
  int64_t layers = 12;            // L
  int64_t heads = 12;             // NH
  int64_t channels = 768;         // C
  // Llama only.
  int64_t kv_heads = 0;          // KV, dividing NH; 0 means NH
  int64_t ffn_hidden = 0;        // F; 0 means Llama's rule: 8C/3 rounded up to a multiple of 256
  float rope_theta = 500000.0f;  // the rotary embedding's base
  RopeScaling rope_scaling;
  bool tie_embeddings = false;  // the head reads the token embedding (GPT-2 always does)
  // Llama's mixture-of-experts variant (Mixtral's MLP): 0 experts is the dense MLP. Each token's MLP is the
  // weighted sum of the SwiGLU MLPs (F wide) of the experts_per_token experts a softmax router chooses for
  // it, plus, with shared_expert, one more SwiGLU MLP that every token runs. The router's load-balancing
  // loss, per layer, is router_aux_loss_coef x E x sum_e f_e P_e (f_e: expert e's share of the
  // assignments, P_e: its mean router probability; 1 when balanced), added to the training loss.
  int64_t experts = 0;
  int64_t experts_per_token = 2;
  bool shared_expert = false;
  float router_aux_loss_coef = 0.01f;

  bool moe() const { return experts > 0; }
  int64_t padded_vocab() const;
  int64_t head_size() const { return channels / heads; }
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  // The MLP's hidden width: 4C for GPT-2, F for Llama.
  int64_t hidden() const;
  // Width of the attention projection's output: q, k and v (3C for GPT-2, C + 2 KV hs for Llama).
  int64_t qkv_width() const { return channels + 2 * kv() * head_size(); }
  // Whether the head is the token embedding's transpose.
  bool tied_head() const { return arch == ModelArchitecture::gpt2 || tie_embeddings; }
  // Whether a block has the dense MLP's layers (mlp.gate_up_proj, mlp.down_proj; a shared expert's).
  bool dense_mlp() const { return !moe() || shared_expert; }
  // The linear layers in the order the model runs them, the head last.
  std::vector<LinearShape> linear_layers() const;
  // Throws octet::Error (invalid input) naming the first inconsistent field.
  void validate() const;
  std::string describe() const;
};

}  // namespace octet
