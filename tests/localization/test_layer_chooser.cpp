// The chooser on made-up measurements: the chosen set's predicted loss change stays within the budget, the
// time it saves is the most a greedy choice by saving per unit of change finds, and layers without gain or
// with a non-finite loss never run in FP8.
#include <cmath>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "octet/train/layer_chooser.h"

namespace octet {
namespace {

TEST(LayerChooser, KeepsTheSensitiveLayerAndFillsTheBudgetWithTheRest) {
  // Changes and savings that are exact in binary, so the sums compare exactly.
  const std::vector<ChooserCandidate> c = {{"a", 0.001953125, 1.0},  // 2^-9
                                           {"sensitive", 0.0625, 4.0},
                                           {"b", 0.0009765625, 0.5},  // 2^-10
                                           {"free", -0.0001, 0.25},   // counted as 0
                                           {"slow", 0.0, -0.125}};    // no gain
  const LayerChoice choice = choose_fp8_layers(c, 0.005);
  ASSERT_EQ(choice.decisions.size(), c.size());
  EXPECT_TRUE(choice.decisions[0].fp8);
  EXPECT_FALSE(choice.decisions[1].fp8);
  EXPECT_EQ(choice.decisions[1].reason, "bf16: loss +6.250% alone in FP8, over the budget of 0.500%");
  EXPECT_TRUE(choice.decisions[2].fp8);
  EXPECT_TRUE(choice.decisions[3].fp8);
  EXPECT_FALSE(choice.decisions[4].fp8);
  EXPECT_EQ(choice.decisions[4].reason.rfind("bf16: no gain", 0), 0u) << choice.decisions[4].reason;
  EXPECT_EQ(choice.predicted_loss_change, 0.001953125 + 0.0009765625);
  EXPECT_EQ(choice.saving_ms, 1.0 + 0.5 + 0.25);
  EXPECT_EQ(choice.decisions[0].reason, "fp8: saves 1 ms, loss +0.195% alone in FP8");
}

TEST(LayerChooser, TakesTheBestRatioFirstAndSaysWhenTheSumWouldOverrun) {
  // Each alone fits a budget of 0.75%; any two do not. The one with most saving per unit of change wins.
  const std::vector<ChooserCandidate> c = {{"x", 0.005, 1.0}, {"y", 0.005, 2.0}, {"z", 0.0050, 1.5}};
  const LayerChoice choice = choose_fp8_layers(c, 0.0075);
  EXPECT_FALSE(choice.decisions[0].fp8);
  EXPECT_TRUE(choice.decisions[1].fp8);
  EXPECT_FALSE(choice.decisions[2].fp8);
  EXPECT_NE(choice.decisions[2].reason.find("would take the predicted change to +1.000%, over the budget"),
            std::string::npos)
      << choice.decisions[2].reason;
}

TEST(LayerChooser, NonFiniteLossNeverFitsAndAZeroBudgetTakesOnlyHarmlessLayers) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<ChooserCandidate> c = {{"nan", nan, 1.0},
                                           {"inf", std::numeric_limits<double>::infinity(), 1.0},
                                           {"zero", 0.0, 1.0},
                                           {"tiny", 1e-12, 1.0}};
  const LayerChoice choice = choose_fp8_layers(c, 0.0);
  EXPECT_FALSE(choice.decisions[0].fp8);
  EXPECT_FALSE(choice.decisions[1].fp8);
  EXPECT_TRUE(choice.decisions[2].fp8);
  EXPECT_FALSE(choice.decisions[3].fp8);
  EXPECT_EQ(choice.predicted_loss_change, 0.0);
}

TEST(LayerChooser, RandomMeasurementsAlwaysRespectTheBudgetAndAreDeterministic) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> change(-0.002, 0.01), saving(-0.1, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ChooserCandidate> c(1 + rng() % 40);
    for (ChooserCandidate& x : c) x = {"l", change(rng), saving(rng)};
    const double budget = 0.0001 * static_cast<double>(rng() % 100);
    const LayerChoice a = choose_fp8_layers(c, budget), b = choose_fp8_layers(c, budget);
    double predicted = 0.0, saved = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
      EXPECT_EQ(a.decisions[i].fp8, b.decisions[i].fp8);
      EXPECT_EQ(a.decisions[i].reason, b.decisions[i].reason);
      if (!a.decisions[i].fp8) continue;
      EXPECT_GT(c[i].saving_ms, 0.0);
      predicted += std::max(c[i].loss_change, 0.0);
      saved += c[i].saving_ms;
    }
    EXPECT_LE(a.predicted_loss_change, budget);
    EXPECT_NEAR(a.predicted_loss_change, predicted, 1e-15);
    EXPECT_NEAR(a.saving_ms, saved, 1e-12);
    // Nothing left out would still fit.
    for (size_t i = 0; i < c.size(); ++i) {
      if (a.decisions[i].fp8 || !(c[i].saving_ms > 0.0)) continue;
      EXPECT_GT(a.predicted_loss_change + std::max(c[i].loss_change, 0.0), budget);
    }
  }
}

}  // namespace
}  // namespace octet
