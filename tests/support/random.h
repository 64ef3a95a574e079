// Seeded inputs for tests: every generator takes an explicit seed, so a failure reproduces exactly, and the
// shapes include odd and prime sizes that catch tiling and edge mistakes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace octet::testing {

struct Shape2D {
  int64_t rows;
  int64_t cols;
};

// {1,1}, {5,7}, {13,131}, {127,257}, {1,3221}, {2333,1}, ... : odd and prime shapes plus a few round ones.
const std::vector<Shape2D>& odd_shapes();

// Normal(0, stddev) values.
std::vector<float> random_normal(size_t n, uint64_t seed, float stddev = 1.0f);
// Uniform values in [lo, hi).
std::vector<float> random_uniform(size_t n, uint64_t seed, float lo, float hi);
// Random signs and magnitudes log-uniform over [2^min_exponent, 2^max_exponent): many orders of magnitude.
std::vector<float> random_log_uniform(size_t n, uint64_t seed, int min_exponent, int max_exponent);
// Small integers in [-range, range]: products and short sums are exact in float32.
std::vector<float> random_small_integers(size_t n, uint64_t seed, int range);

// Every special value a cast must handle: +-0, +-Inf, NaN, float32 extremes, subnormals.
std::vector<float> special_values();

}  // namespace octet::testing
