// Sampling (see sampling.h). The draw for the i-th new token uses CounterRng(seed).bits(i), so a seed gives
// the same text on every run.
#include "octet/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "octet/check.h"
#include "octet/numerics/random.h"

namespace octet {

std::vector<int32_t> generate(Model& model, std::span<const int32_t> prompt, const SamplingSettings& s,
                              int32_t stop_token) {
  OCTET_REQUIRE(!prompt.empty(), "generation needs a prompt of at least one token");
  OCTET_REQUIRE(s.temperature >= 0.0f && std::isfinite(s.temperature),
                "the temperature must be 0 (greedy) or positive, got {}", s.temperature);
  OCTET_REQUIRE(s.top_k >= 0, "top_k must be 0 (all tokens) or positive, got {}", s.top_k);
  OCTET_REQUIRE(s.max_new_tokens >= 0, "the number of new tokens must not be negative, got {}",
                s.max_new_tokens);
  const int64_t V = model.vocab_size(), Vp = model.padded_vocab_size();
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  std::vector<float> row(static_cast<size_t>(Vp));
  std::vector<int32_t> order(static_cast<size_t>(V));
  const CounterRng rng(s.seed);
  model.set_scaling_updates(false);  // generating must not move an FP8 model's scaling state
  for (int64_t i = 0; i < s.max_new_tokens; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(context.size()), model.max_seq_len());
    const int32_t* window = context.data() + context.size() - static_cast<size_t>(T);
    model.forward_logits(window, 1, T);
    model.backend().copy_to_host(row.data(), model.logits() + (T - 1) * Vp,
                                 static_cast<size_t>(Vp) * sizeof(float));
    int32_t next;
    if (s.temperature == 0.0f) {
      next = static_cast<int32_t>(std::max_element(row.begin(), row.begin() + V) - row.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = s.top_k == 0 ? V : std::min(s.top_k, V);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)];
      });
      const double top = row[static_cast<size_t>(order[0])];
      std::vector<double> weights(static_cast<size_t>(k));
      double total = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        weights[static_cast<size_t>(j)] =
            std::exp((row[static_cast<size_t>(order[static_cast<size_t>(j)])] - top) / s.temperature);
        total += weights[static_cast<size_t>(j)];
      }
      double u = static_cast<double>(rng.bits(static_cast<uint64_t>(i))) / 4294967296.0 * total;
      int64_t j = 0;
      while (j + 1 < k && u >= weights[static_cast<size_t>(j)]) u -= weights[static_cast<size_t>(j++)];
      next = order[static_cast<size_t>(j)];
    }
    out.push_back(next);
    context.push_back(next);
    if (next == stop_token) break;
  }
  model.set_scaling_updates(true);
  return out;
}

}  // namespace octet
