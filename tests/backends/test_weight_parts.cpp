// Weights gathered as FP8 codes on the CPU backend: ranks' parts cast with the largest part amax make the
// whole weight's copy, under each per-tensor recipe, with uneven and empty parts, a NaN and an all-zero
// weight (weight_parts_check.h). The CUDA backend runs the same check in tests/cuda/test_weight_parts.cpp.
#include <gtest/gtest.h>

#include <string>

#include "octet/backend/cpu_backend.h"
#include "weight_parts_check.h"

namespace octet {
namespace {

using testing::WeightPartsCase;

class WeightParts : public ::testing::TestWithParam<WeightPartsCase> {};

TEST_P(WeightParts, TheRanksPartsMakeTheWholeWeightsCopy) {
  auto backend = make_cpu_backend();
  testing::expect_parts_make_the_whole_copy(*backend, GetParam());
}

std::vector<WeightPartsCase> every_case() {
  std::vector<WeightPartsCase> out;
  for (const RecipeKind r : {RecipeKind::delayed, RecipeKind::current, RecipeKind::static_scale}) {
    out.push_back({.recipe = r, .cuts = {48 * 32}});                      // one rank
    out.push_back({.recipe = r, .cuts = {700, 48 * 32}});                 // two, mid-row
    out.push_back({.recipe = r, .cuts = {5, 5, 1001, 48 * 32}});          // an empty part
    out.push_back({.recipe = r, .cuts = {700, 48 * 32}, .fault = WeightPartsCase::Fault::nan});
    out.push_back({.recipe = r, .cuts = {700, 48 * 32}, .fault = WeightPartsCase::Fault::zeros});
  }
  return out;
}

std::string name_of(const WeightPartsCase& c) {
  std::string name = std::string(recipe_name(c.recipe)) + "_" + std::to_string(c.cuts.size()) + "ranks";
  if (c.cuts.size() > 1 && c.cuts[0] == c.cuts[1]) name += "_empty_part";
  if (c.fault == WeightPartsCase::Fault::nan) name += "_nan";
  if (c.fault == WeightPartsCase::Fault::zeros) name += "_zeros";
  return name;
}

INSTANTIATE_TEST_SUITE_P(Recipes, WeightParts, ::testing::ValuesIn(every_case()),
                         [](const auto& p) { return name_of(p.param); });

}  // namespace
}  // namespace octet
