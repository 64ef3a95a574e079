// Validation and derived sizes of a GPT model's shape.
#include "octet/model/config.h"

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

int64_t Gpt2Config::padded_vocab() const {
  if (padded_vocab_size > 0) return padded_vocab_size;
  return (vocab_size + 63) / 64 * 64;
}

void Gpt2Config::validate() const {
  OCTET_REQUIRE(vocab_size >= 2, "model.vocab_size must be at least 2, got {}", vocab_size);
  OCTET_REQUIRE(padded_vocab_size == 0 || padded_vocab_size >= vocab_size,
                "model.padded_vocab_size ({}) must be 0 (automatic) or at least vocab_size ({})",
                padded_vocab_size, vocab_size);
  OCTET_REQUIRE(max_seq_len >= 1, "model.max_seq_len must be at least 1, got {}", max_seq_len);
  OCTET_REQUIRE(layers >= 1, "model.layers must be at least 1, got {}", layers);
  OCTET_REQUIRE(heads >= 1, "model.heads must be at least 1, got {}", heads);
  OCTET_REQUIRE(channels >= 1 && channels % heads == 0,
                "model.channels ({}) must be a positive multiple of model.heads ({})", channels, heads);
}

std::string Gpt2Config::describe() const {
  return fmt::format("GPT-2: {} layers, {} channels, {} heads, context {}, vocabulary {} (padded {})", layers,
                     channels, heads, max_seq_len, vocab_size, padded_vocab());
}

}  // namespace octet
