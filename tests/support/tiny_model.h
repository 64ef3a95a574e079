// The smallest GPT-2 shape the tests train: every dimension a multiple of 16 (B*T = 32), so that FP8 takes
// every block GEMM.
#pragma once

#include "octet/model/config.h"

namespace octet::testing {

inline Gpt2Config tiny_config() {
  Gpt2Config c;
  c.vocab_size = 61;
  c.padded_vocab_size = 64;
  c.max_seq_len = 16;
  c.layers = 2;
  c.heads = 4;
  c.channels = 64;
  return c;
}

}  // namespace octet::testing
