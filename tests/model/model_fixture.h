// Small models and deterministic token streams shared by the model and trainer tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>

#include "octet/backend/cpu_backend.h"
#include "octet/check.h"
#include "octet/model/decoder.h"
#include "octet/train/trainer.h"
#include "tiny_model.h"

namespace octet::testing {

inline PrecisionSettings mode(MixedPrecision m) {
  PrecisionSettings s;
  s.mode = m;
  return s;
}

// A stream of random tokens (targets are the next tokens) that repeats a fixed pattern, so a model can learn
// it.
inline BatchSource pattern_stream(uint64_t seed, int64_t B, int64_t T, int64_t V) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return [rng, B, T, V](int32_t* tokens, int32_t* targets) {
    for (int64_t b = 0; b < B; ++b) {
      int32_t x = static_cast<int32_t>((*rng)() % static_cast<uint64_t>(V));
      for (int64_t t = 0; t < T; ++t) {
        tokens[b * T + t] = x;
        x = static_cast<int32_t>((x * 7 + 3) % V);  // a deterministic successor: learnable
        targets[b * T + t] = x;
      }
    }
  };
}

}  // namespace octet::testing
