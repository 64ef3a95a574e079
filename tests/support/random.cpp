// See random.h.
#include "random.h"

#include <cmath>
#include <limits>
#include <random>

namespace octet::testing {

const std::vector<Shape2D>& odd_shapes() {
  static const std::vector<Shape2D> shapes = {
      {1, 1},     {1, 2},     {5, 7},    {7, 5},    {13, 131}, {127, 257},
      {128, 128}, {129, 127}, {1, 3221}, {2333, 1}, {3, 1000}, {64, 384},
  };
  return shapes;
}

std::vector<float> random_normal(size_t n, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> random_uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> random_log_uniform(size_t n, uint64_t seed, int min_exponent, int max_exponent) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(min_exponent, max_exponent);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> v(n);
  for (float& x : v) {
    const float magnitude = static_cast<float>(std::exp2(exponent(rng)));
    x = negative(rng) ? -magnitude : magnitude;
  }
  return v;
}

std::vector<float> random_small_integers(size_t n, uint64_t seed, int range) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

std::vector<float> special_values() {
  using L = std::numeric_limits<float>;
  return {0.0f,         -0.0f,     L::infinity(), -L::infinity(), L::quiet_NaN(),  -L::quiet_NaN(),
          L::max(),     -L::max(), L::min(),      -L::min(),      L::denorm_min(), -L::denorm_min(),
          L::epsilon(), 1.0f,      -1.0f};
}

}  // namespace octet::testing
