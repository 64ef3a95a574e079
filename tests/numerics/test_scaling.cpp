// Scaling recipes: the scale each one chooses, step by step, and the guards for degenerate amaxes.
#include <cfloat>
#include <cmath>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/numerics/quantize.h"
#include "random.h"

namespace octet {
namespace {

TEST(ScaleFromAmax, FollowsTheFormulaAndGuardsDegenerateAmax) {
  bool degenerate = true;
  EXPECT_EQ(scale_from_amax(2.0f, 448.0f, 0, 1.0f, &degenerate), 224.0f);
  EXPECT_FALSE(degenerate);
  EXPECT_EQ(scale_from_amax(2.0f, 448.0f, 1, 1.0f, &degenerate), 112.0f);  // margin halves the scale
  EXPECT_EQ(scale_from_amax(0.5f, 57344.0f, 0, 1.0f, &degenerate), 114688.0f);
  for (const float bad : {0.0f, INFINITY, NAN, -1.0f}) {
    degenerate = false;
    EXPECT_EQ(scale_from_amax(bad, 448.0f, 0, 3.0f, &degenerate), 3.0f) << bad;
    EXPECT_TRUE(degenerate) << bad;
  }
  EXPECT_EQ(scale_from_amax(1e-40f, 448.0f, 0, 1.0f, &degenerate), FLT_MAX);  // clamped, not Inf
}

TEST(ScaleFromAmax, ValidScalesHaveAFiniteInverse) {
  EXPECT_TRUE(is_valid_scale(1.0f));
  EXPECT_TRUE(is_valid_scale(FLT_MAX));
  EXPECT_TRUE(is_valid_scale(3e-39f));  // 1 / FLT_MAX itself is subnormal and inverts to Inf
  for (const float bad : {0.0f, -1.0f, INFINITY, NAN, 1e-39f}) EXPECT_FALSE(is_valid_scale(bad)) << bad;
}

TEST(ScaleFromAmax, PowerOfTwoRoundsDown) {
  EXPECT_EQ(round_scale_down_to_power_of_two(224.0f), 128.0f);
  EXPECT_EQ(round_scale_down_to_power_of_two(256.0f), 256.0f);
  EXPECT_EQ(round_scale_down_to_power_of_two(0.3f), 0.25f);
}

TEST(CurrentScaling, LargestElementLandsOnTheLargestCode) {
  CurrentScaling recipe;
  ScalingState state = recipe.initial_state();
  std::vector<float> x = testing::random_normal(1000, 1);
  x[10] = -7.5f;  // the amax
  const QuantizedTensor q = quantize(x, 10, 100, Dtype::e4m3, TensorRole::activation, recipe, state);
  EXPECT_EQ(q.amax, 7.5f);
  EXPECT_EQ(q.data[10], 0xFE);  // -448
  EXPECT_EQ(q.stats.saturated, 0);
  EXPECT_EQ(q.scale_inv[0], 1.0f / (448.0f / 7.5f));
  EXPECT_EQ(state.scale, 448.0f / 7.5f);
}

TEST(DelayedScaling, ScaleComesFromTheHistoryOfEarlierSteps) {
  DelayedScaling recipe(3, AmaxAlgorithm::max, 0);
  ScalingState state = recipe.initial_state();
  ASSERT_EQ(state.amax_history.size(), 3u);
  const float amaxes[] = {1.0f, 4.0f, 2.0f, 0.5f, 0.25f, 0.125f};
  // Window max after each update: 1, 4, 4, 4, 2, 0.5.
  const float want[] = {448.0f, 112.0f, 112.0f, 112.0f, 224.0f, 896.0f};
  for (int step = 0; step < 6; ++step) {
    const float before = state.scale;
    EXPECT_EQ(recipe.cast_scale(state, amaxes[step], Dtype::e4m3), before) << "the cast uses the old scale";
    recipe.update(state, amaxes[step], Dtype::e4m3);
    EXPECT_EQ(state.scale, want[step]) << "step " << step;
    EXPECT_EQ(state.scale_inv, 1.0f / want[step]);
    EXPECT_EQ(state.amax_history[0], amaxes[step]);
  }
  EXPECT_EQ(state.degenerate_amax, 0);
}

TEST(DelayedScaling, MostRecentAndMargin) {
  DelayedScaling recipe(4, AmaxAlgorithm::most_recent, 2);
  ScalingState state = recipe.initial_state();
  recipe.update(state, 8.0f, Dtype::e5m2);
  EXPECT_EQ(state.scale, 57344.0f / 8.0f / 4.0f);
  recipe.update(state, 1.0f, Dtype::e5m2);
  EXPECT_EQ(state.scale, 57344.0f / 4.0f);
}

TEST(DelayedScaling, DegenerateAmaxKeepsTheScaleAndIsCounted) {
  DelayedScaling recipe(2);
  ScalingState state = recipe.initial_state();
  recipe.update(state, 0.0f, Dtype::e4m3);  // a zero tensor: the window holds only zeros
  EXPECT_EQ(state.scale, 1.0f);
  EXPECT_EQ(state.degenerate_amax, 1);
  recipe.update(state, 2.0f, Dtype::e4m3);
  EXPECT_EQ(state.scale, 224.0f);
  recipe.update(state, NAN, Dtype::e4m3);
  recipe.update(state, INFINITY, Dtype::e4m3);
  EXPECT_EQ(state.scale, 224.0f);
  EXPECT_EQ(state.degenerate_amax, 3);
  EXPECT_EQ(state.amax_history[0], 2.0f) << "non-finite amaxes stay out of the window";
  EXPECT_EQ(state.updates, 4);
}

TEST(DelayedScaling, FirstCastUsesTheInitialScaleThenAdapts) {
  DelayedScaling recipe(16);
  ScalingState state = recipe.initial_state();
  const std::vector<float> x = {1000.0f, -500.0f, 3.0f, 0.0f};
  const QuantizedTensor first = quantize(x, 1, 4, Dtype::e4m3, TensorRole::activation, recipe, state);
  EXPECT_EQ(first.stats.saturated, 2) << "scale 1 clamps 1000 and -500";
  EXPECT_EQ(state.scale, 448.0f / 1000.0f);
  const QuantizedTensor second = quantize(x, 1, 4, Dtype::e4m3, TensorRole::activation, recipe, state);
  EXPECT_EQ(second.stats.saturated, 0);
  EXPECT_EQ(second.data[0], 0x7E);
}

TEST(StaticScaling, FixedScaleAndValidation) {
  StaticScaling recipe(16.0f);
  ScalingState state = recipe.initial_state();
  const std::vector<float> x = {1.0f, 2.0f};
  const QuantizedTensor q = quantize(x, 1, 2, Dtype::e4m3, TensorRole::weight, recipe, state);
  EXPECT_EQ(q.scale_inv[0], 1.0f / 16.0f);
  EXPECT_EQ(e4m3_to_float(q.data[1]), 32.0f);
  EXPECT_EQ(state.last_amax, 2.0f);
  for (const float bad : {0.0f, -1.0f, INFINITY, NAN, 1e-39f}) {
    try {
      StaticScaling s(bad);
      FAIL() << "accepted scale " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
    }
  }
}

TEST(BlockScaling, TilesForActivationsBlocksForWeights) {
  BlockScaling recipe;
  EXPECT_EQ(recipe.granularity(TensorRole::activation), ScaleGranularity::tile_1x128);
  EXPECT_EQ(recipe.granularity(TensorRole::gradient), ScaleGranularity::tile_1x128);
  EXPECT_EQ(recipe.granularity(TensorRole::weight), ScaleGranularity::block_128x128);
  bool degenerate = false;
  EXPECT_EQ(recipe.block_scale(2.0f, Dtype::e4m3, &degenerate), 224.0f);
  EXPECT_EQ(recipe.block_scale(0.0f, Dtype::e4m3, &degenerate), 1.0f);
  EXPECT_TRUE(degenerate);
  BlockScaling pow2(true);
  EXPECT_EQ(pow2.block_scale(2.0f, Dtype::e4m3, &degenerate), 128.0f);
}

TEST(MxScaling, SmallestPowerOfTwoThatAvoidsSaturation) {
  MxScaling recipe;
  for (const float amax : testing::random_log_uniform(2000, 4, -60, 60)) {
    bool degenerate = true;
    const float a = std::fabs(amax);
    const float scale = recipe.block_scale(a, Dtype::e4m3, &degenerate);
    EXPECT_FALSE(degenerate);
    int e = 0;
    EXPECT_EQ(std::frexp(scale, &e), 0.5f) << "a power of two";
    EXPECT_LE(static_cast<double>(a) * scale, 448.0) << a;
    EXPECT_GT(static_cast<double>(a) * scale * 2, 448.0) << "twice the scale would saturate: " << a;
  }
}

TEST(Recipes, DescribeThemselves) {
  EXPECT_EQ(DelayedScaling(16, AmaxAlgorithm::max, 0).describe(), "delayed (history 16, max, margin 0)");
  EXPECT_EQ(CurrentScaling().describe(), "current (margin 0)");
  EXPECT_EQ(recipe_name(RecipeKind::mxfp8), std::string("mxfp8"));
  EXPECT_THROW(DelayedScaling(0), Error);
}

}  // namespace
}  // namespace octet
