// The one comparator of octet's test suite. Every comparison checks NaN and Inf agreement first (a NaN where
// a number is expected never passes), then a tolerance taken from one per-dtype table derived from the
// formats' precision and the reduction length; FP8 outputs are compared byte for byte.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <string>

#include <gtest/gtest.h>

#include "octet/numerics/format.h"

namespace octet::testing {

// |actual - expected| <= atol + rtol * |expected| + accumulation * magnitude
struct Tolerance {
  double rtol;          // one unit in the last place of the output dtype (a rounding boundary may flip)
  double atol;          // the dtype's smallest subnormal (results that round to either side of zero)
  double accumulation;  // worst-case float32 reduction error per unit of sum |a_i * b_i|: K * 2^-24
};

// The table. `reduction_length` is K for a GEMM output (1 for elementwise results); accumulation is float32.
Tolerance tolerance_for(Dtype output, int64_t reduction_length = 1);

struct CompareOptions {
  Dtype dtype = Dtype::f32;
  int64_t reduction_length = 1;
  // Per element sum |a_i * b_i| of a reduction (the scale of its rounding error); empty: |expected|.
  std::span<const float> magnitude = {};
  int max_reported = 8;
};

// Values compared element by element; the message names the first mismatches and the largest error.
::testing::AssertionResult all_close(std::span<const float> actual, std::span<const float> expected,
                                     const CompareOptions& options);

// Byte-for-byte equality of FP8 (or any) codes; the message shows the first differing codes.
::testing::AssertionResult bytes_equal(std::span<const uint8_t> actual, std::span<const uint8_t> expected,
                                       Dtype dtype = Dtype::e4m3, int max_reported = 8);

// At least one element is finite and non-zero (guards against comparing two all-zero results).
::testing::AssertionResult has_nonzero(std::span<const float> values);

}  // namespace octet::testing

namespace octet {
// Lets GoogleTest print a Dtype parameter by name (found by argument-dependent lookup).
inline void PrintTo(Dtype d, std::ostream* os) {
  *os << dtype_name(d);
}
}  // namespace octet
