// Small models and deterministic token streams shared by the model and trainer tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

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

// n tokens drawn uniformly from 0 .. V - 1, deterministic from the seed.
inline std::vector<int32_t> random_tokens(size_t n, uint64_t seed, int64_t V) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
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

// The model's gradients of the mean loss over tokens and targets [B, T] against central differences of that
// loss, at four elements of every parameter (the first, a third in, past the middle, the last). Richardson
// extrapolation of two central differences cancels the h^2 term (sharp attention makes it large); what
// remains is float32 rounding of the loss, about 1e-6 / h. Scale the weights up first, so that gradients
// stand well above that noise.
inline void expect_gradients_match_finite_differences(Model& m, const std::vector<int32_t>& tokens,
                                                      const std::vector<int32_t>& targets, int64_t B,
                                                      int64_t T) {
  m.forward(tokens.data(), targets.data(), B, T);
  m.zero_grad();
  m.backward(1.0f / static_cast<float>(B * T));
  const std::vector<float> grads(m.grads(), m.grads() + m.parameter_count());
  for (const ParameterInfo& p : m.parameters()) {
    for (const int64_t k : {int64_t{0}, p.count / 3, p.count / 2 + 1, p.count - 1}) {
      float* x = m.params() + p.offset + k;
      const float original = *x;
      auto central = [&](float h) {
        *x = original + h;
        m.refresh_weight_copies();
        const double up = m.forward(tokens.data(), targets.data(), B, T);
        *x = original - h;
        m.refresh_weight_copies();
        const double down = m.forward(tokens.data(), targets.data(), B, T);
        *x = original;
        m.refresh_weight_copies();
        return (up - down) / (2.0 * static_cast<double>(h));
      };
      const double numeric = (4.0 * central(2e-3f) - central(4e-3f)) / 3.0;
      const double analytic = grads[static_cast<size_t>(p.grad_offset + k)];
      EXPECT_NEAR(analytic, numeric, 1e-3 + 0.01 * std::fabs(numeric)) << p.name << "[" << k << "]";
    }
  }
}

}  // namespace octet::testing
