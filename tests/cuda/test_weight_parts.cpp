// Weights gathered as FP8 codes on the CUDA backend: the check the CPU backend passes
// (tests/backends/test_weight_parts.cpp, weight_parts_check.h), on the GPU: ranks' parts cast with the largest
// part amax make the very copy and scaling state that the backend's own prepare_weight makes of the whole
// weight. Skips without a GPU.
#include <gtest/gtest.h>

#include "backend_ops_harness.h"
#include "weight_parts_check.h"

namespace octet {
namespace {

using testing::WeightPartsCase;

TEST(GpuWeightParts, TheRanksPartsMakeTheWholeWeightsCopy) {
  SKIP_WITHOUT_TESTED_BACKEND();
  for (const RecipeKind r : {RecipeKind::delayed, RecipeKind::current, RecipeKind::static_scale}) {
    for (const WeightPartsCase& c : {WeightPartsCase{.recipe = r, .cuts = {700, 48 * 32}},
                                     WeightPartsCase{.recipe = r, .cuts = {5, 5, 1001, 48 * 32}},
                                     WeightPartsCase{.recipe = r, .cuts = {700, 48 * 32}, .fault = WeightPartsCase::Fault::nan},
                                     WeightPartsCase{.recipe = r, .cuts = {700, 48 * 32}, .fault = WeightPartsCase::Fault::zeros}}) {
      SCOPED_TRACE(std::string(recipe_name(r)) + ", " + std::to_string(c.cuts.size()) + " ranks, fault " +
                   std::to_string(static_cast<int>(c.fault)));
      auto backend = testing::backend_ops::make_tested_backend();
      testing::expect_parts_make_the_whole_copy(*backend, c);
    }
  }
}

}  // namespace
}  // namespace octet
