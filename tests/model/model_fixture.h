// Small models and deterministic token streams shared by the model and trainer tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
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
// Settings of a short run of the tiny models: micro-batches of [2, 16], a warm-up of 2 steps in 20.
inline TrainSettings small_settings() {
  TrainSettings s;
  s.batch_size = 2;
  s.seq_len = 16;
  s.schedule.max_learning_rate = 3e-3f;
  s.schedule.warmup_steps = 2;
  s.schedule.total_steps = 20;
  return s;
}

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
// The loss the gradients are taken of: by default the mean loss forward returns.
using Objective = std::function<double(Model& m, const std::vector<int32_t>& tokens,
                                       const std::vector<int32_t>& targets, int64_t B, int64_t T)>;

// The same against `objective` (which backward must differentiate, such as a mixture of experts' loss with
// its balance term), with central differences of step h and 2h. `checked(p, k, numeric)` is called for every
// element compared.
inline void expect_gradients_match_finite_differences(
    Model& m, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t B, int64_t T,
    const Objective& objective, float h, double absolute_tolerance,
    const std::function<void(const ParameterInfo&, int64_t, double)>& checked = nullptr) {
  objective(m, tokens, targets, B, T);
  m.zero_grad();
  m.backward(1.0f / static_cast<float>(B * T));
  const std::vector<float> grads(m.grads(), m.grads() + m.parameter_count());
  for (const ParameterInfo& p : m.parameters()) {
    for (const int64_t k : {int64_t{0}, p.count / 3, p.count / 2 + 1, p.count - 1}) {
      float* x = m.params() + p.offset + k;
      const float original = *x;
      auto central = [&](float step) {
        *x = original + step;
        m.refresh_weight_copies();
        const double up = objective(m, tokens, targets, B, T);
        *x = original - step;
        m.refresh_weight_copies();
        const double down = objective(m, tokens, targets, B, T);
        *x = original;
        m.refresh_weight_copies();
        return (up - down) / (2.0 * static_cast<double>(step));
      };
      const double numeric = (4.0 * central(h) - central(2.0f * h)) / 3.0;
      const double analytic = grads[static_cast<size_t>(p.grad_offset + k)];
      EXPECT_NEAR(analytic, numeric, absolute_tolerance + 0.01 * std::fabs(numeric)) << p.name << "[" << k << "]";
      if (checked) checked(p, k, numeric);
    }
  }
}

inline void expect_gradients_match_finite_differences(Model& m, const std::vector<int32_t>& tokens,
                                                      const std::vector<int32_t>& targets, int64_t B,
                                                      int64_t T) {
  const Objective mean_loss = [](Model& model, const std::vector<int32_t>& x, const std::vector<int32_t>& y,
                                 int64_t b, int64_t t) { return static_cast<double>(model.forward(x.data(), y.data(), b, t)); };
  expect_gradients_match_finite_differences(m, tokens, targets, B, T, mean_loss, 2e-3f, 1e-3);
}

}  // namespace octet::testing
