// Weights gathered as FP8 codes (Backend::weight_part_amaxes, cast_weight_parts, weight_copies_from_codes),
// checked on any backend against its own prepare_weight: ranks simulated on one backend, each with its own
// layer state and copy, cast their parts of a weight with the largest part amax, write their codes into one
// buffer (the gather), and make their copies from it. Every rank's copy must then be the whole weight's: the
// FP8 forward and the input gradient (which reads the transposed codes) give the same bits, and the weight's
// scaling state and copy scale are the same, step after step (a delayed recipe's history filling).
#pragma once

#include <cstdint>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/numerics/scaling.h"

namespace octet::testing {

struct WeightPartsCase {
  RecipeKind recipe = RecipeKind::delayed;
  // Where the ranks' parts of the weight end, in order (the last is rows * cols); a part may be empty.
  std::vector<int64_t> cuts;
  // What goes wrong in the weight: nothing, a NaN in the second part's first element, or all zeros (a
  // degenerate amax).
  enum class Fault { none, nan, zeros } fault = Fault::none;
};

// Runs the case on `backend` (its memory for the tensors) and records failures with gtest's EXPECT.
void expect_parts_make_the_whole_copy(Backend& backend, const WeightPartsCase& c);

}  // namespace octet::testing
