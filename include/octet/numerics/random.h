// A counter-based random source for stochastic rounding: the bits for element i depend only on the seed and
// i, so a CPU loop and a GPU kernel (any thread order) draw the same bits and round the same way.
#pragma once

#include <cstdint>

#include "octet/numerics/minifloat.h"

namespace octet {

class CounterRng {
 public:
  OCTET_HOST_DEVICE explicit CounterRng(uint64_t seed) : seed_(seed) {}

  // 32 random bits for position `index` of stream `stream` (splitmix64 finaliser over a unique key).
  OCTET_HOST_DEVICE uint32_t bits(uint64_t index, uint64_t stream = 0) const {
    uint64_t z = seed_ + 0x9E3779B97F4A7C15ull * (index + 1) + 0xD1B54A32D192ED03ull * stream;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<uint32_t>(z >> 32);
  }

  OCTET_HOST_DEVICE uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
};

}  // namespace octet
