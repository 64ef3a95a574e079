// The smallest GPT-2 shape the tests train: every dimension a multiple of 16 (B*T = 32), so that FP8 takes
// every block GEMM.
#pragma once

#include "octet/model/config.h"

namespace octet::testing {

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 61;
  c.padded_vocab_size = 64;
  c.max_seq_len = 16;
  c.layers = 2;
  c.heads = 4;
  c.channels = 64;
  return c;
}

// The smallest Llama the tests train: grouped-query attention (4 heads sharing 2 key and value heads), the
// rotary embedding over head size 16, a SwiGLU MLP 96 wide and an untied head; every GEMM dimension a
// multiple of 16.
inline ModelConfig tiny_llama_config() {
  ModelConfig c = tiny_config();
  c.arch = ModelArchitecture::llama;
  c.kv_heads = 2;
  c.ffn_hidden = 96;
  c.rope_theta = 10000.0f;
  return c;
}

// The smallest mixture-of-experts Llama: the tiny Llama's trunk with 4 experts (SwiGLU, 32 wide) of which
// each token takes 2, the balance loss at 0.1 so that its gradient shows, and a shared expert as asked.
inline ModelConfig tiny_moe_config(bool shared_expert = false) {
  ModelConfig c = tiny_llama_config();
  c.ffn_hidden = 32;
  c.experts = 4;
  c.experts_per_token = 2;
  c.shared_expert = shared_expert;
  c.router_aux_loss_coef = 0.1f;
  return c;
}

}  // namespace octet::testing
