// Shapes of a GPT model. Shape letters follow llm.c: B batch, T sequence length, C channels, NH heads,
// L layers, V vocabulary, Vp vocabulary padded for GEMM efficiency.
#pragma once

#include <cstdint>
#include <string>

namespace octet {

// The model architectures octet builds (model.arch; make_model in model.h).
enum class ModelArchitecture : uint8_t { gpt2 };

struct Gpt2Config {
  int64_t vocab_size = 50257;     // V: real tokens; the loss covers only these
  int64_t padded_vocab_size = 0;  // Vp: rows of the embedding; 0 means V rounded up to a multiple of 64
  int64_t max_seq_len = 1024;     // positions of the learned position embedding
  int64_t layers = 12;            // L
  int64_t heads = 12;             // NH
  int64_t channels = 768;         // C

  int64_t padded_vocab() const;
  int64_t head_size() const { return channels / heads; }
  // Throws octet::Error (invalid input) naming the first inconsistent field.
  void validate() const;
  std::string describe() const;
};

}  // namespace octet
