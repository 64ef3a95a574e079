// Text generation from a trained GPT: sampling with temperature and top-k, reproducible from a seed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "octet/model/model.h"

namespace octet {

struct SamplingSettings {
  int64_t max_new_tokens = 64;
  float temperature = 1.0f;  // 0: always the most likely token (greedy)
  int64_t top_k = 40;        // sample among the k most likely tokens; 0: all
  uint64_t seed = 1;
};

// Continues `prompt` (at least one token); returns the new tokens only. The model must have been built for a
// batch of 1; the context is the last max_seq_len tokens. Stops early at `stop_token` when it is >= 0.
std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const SamplingSettings& settings,
                              int32_t stop_token = -1);

}  // namespace octet
