// The shadow check's pure parts: the weight-gradient cosine (exact on exactly representable inputs, NaN
// for a non-finite value, none for two zero gradients) and the alerts a reading raises (thresholds compared
// as the other alerts compare them, a NaN never passing, each raised once per layer and kind, a resumed run
// not raising again, a loss alert naming the layer of the lowest cosine); and the refusal on several ranks.
#include <cmath>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/telemetry/alerts.h"
#include "octet/train/training_run.h"
#include "shadow_check.h"

namespace octet {
namespace {

TEST(GradientCosine, IsExactOnRepresentableInputs) {
  EXPECT_EQ(gradient_cosine({1.0f, 2.0f}, {2.0f, 4.0f}), 1.0);  // 10 / sqrt(5 * 20)
  EXPECT_EQ(gradient_cosine({1.0f, 2.0f}, {-2.0f, -4.0f}), -1.0);
  EXPECT_EQ(gradient_cosine({1.0f, 0.0f}, {0.0f, 3.0f}), 0.0);
  EXPECT_EQ(gradient_cosine({3.0f, 4.0f}, {4.0f, 3.0f}), 24.0 / 25.0);
  // One gradient flushed to zero: no agreement at all; both zero: nothing to compare.
  EXPECT_EQ(gradient_cosine({0.0f, 0.0f}, {1.0f, 2.0f}), 0.0);
  EXPECT_EQ(gradient_cosine({0.0f, 0.0f}, {0.0f, 0.0f}), std::nullopt);
  const std::optional<double> nan = gradient_cosine({NAN, 1.0f}, {1.0f, 1.0f});
  ASSERT_TRUE(nan.has_value());
  EXPECT_TRUE(std::isnan(*nan));
  const std::optional<double> inf = gradient_cosine({INFINITY, 1.0f}, {1.0f, 1.0f});
  ASSERT_TRUE(inf.has_value());
  EXPECT_TRUE(std::isnan(*inf));
}

ShadowReading reading(int64_t step, double fp8_loss, double bf16_loss,
                      std::vector<std::pair<std::string, std::optional<double>>> cosines) {
  ShadowReading r;
  r.step = step;
  r.fp8_loss = fp8_loss;
  r.bf16_loss = bf16_loss;
  r.cosines = std::move(cosines);
  return r;
}

TEST(ShadowAlerts, HealthyReadingRaisesNothingAndThresholdsAreStrict) {
  TelemetrySettings settings;
  settings.shadow_loss_threshold = 0.25f;
  settings.shadow_cosine_threshold = 0.5f;
  AlertMonitor monitor(settings);
  // A loss difference of exactly 0.25 and a cosine of exactly 0.5 are at the thresholds, not across them.
  EXPECT_TRUE(
      monitor.observe_shadow(reading(2, 5.0, 4.0, {{"a", 0.5}, {"b", 1.0}, {"c", std::nullopt}})).empty());
  EXPECT_EQ(reading(2, 5.0, 4.0, {}).relative_loss_difference(), 0.25);
}

TEST(ShadowAlerts, LowCosineAndLossDifferenceRaiseOnceNamingTheLowestLayer) {
  TelemetrySettings settings;
  AlertMonitor monitor(settings);
  std::vector<Alert> a = monitor.observe_shadow(reading(4, 3.0, 2.0, {{"a", 0.99}, {"b", 0.25}, {"c", 0.5}}));
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].kind, "shadow_cosine");
  EXPECT_EQ(a[0].layer, "b");
  EXPECT_EQ(a[0].tensor, "weight_gradient");
  EXPECT_EQ(a[0].value, 0.25);
  EXPECT_EQ(a[0].step, 4);
  EXPECT_EQ(a[1].kind, "shadow_cosine");
  EXPECT_EQ(a[1].layer, "c");
  EXPECT_EQ(a[2].kind, "shadow_loss");
  EXPECT_EQ(a[2].layer, "b");  // the lowest cosine
  EXPECT_EQ(a[2].tensor, "loss");
  EXPECT_EQ(a[2].value, 0.5);
  EXPECT_NE(a[2].what.find("relative difference of 50%"), std::string::npos) << a[2].what;
  // Raised once per layer and kind.
  EXPECT_TRUE(monitor.observe_shadow(reading(6, 3.0, 2.0, {{"a", 0.99}, {"b", 0.25}, {"c", 0.5}})).empty());
  a = monitor.observe_shadow(reading(8, 3.0, 2.0, {{"a", 0.1}}));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].layer, "a");
  EXPECT_EQ(a[1].kind, "shadow_loss");
  EXPECT_EQ(a[1].layer, "a");
}

TEST(ShadowAlerts, NaNNeverPasses) {
  TelemetrySettings settings;
  AlertMonitor monitor(settings);
  const std::vector<Alert> a = monitor.observe_shadow(reading(2, NAN, 2.0, {{"a", NAN}}));
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, "shadow_cosine");
  EXPECT_EQ(a[1].kind, "shadow_loss");
  EXPECT_TRUE(std::isnan(a[1].value));
}

TEST(ShadowAlerts, AResumedRunDoesNotRaiseAgain) {
  TelemetrySettings settings;
  AlertMonitor monitor(settings);
  monitor.mark_raised("b", "weight_gradient", "shadow_cosine");
  monitor.mark_raised("b", "loss", "shadow_loss");
  EXPECT_TRUE(monitor.observe_shadow(reading(10, 3.0, 2.0, {{"a", 0.99}, {"b", 0.25}})).empty());
}

TEST(ShadowRanks, SeveralRanksAreRefused) {
  RunConfig config;
  config.telemetry.shadow_every = 4;
  check_ranks(config, 1);
  EXPECT_THROW(check_ranks(config, 2), Error);
  config.telemetry.shadow_every = 0;
  config.telemetry.recalibrate_every = 4;
  EXPECT_THROW(check_ranks(config, 2), Error);
  config.telemetry.recalibrate_every = 0;
  config.telemetry.on_alert = AlertAction::recalibrate;
  EXPECT_THROW(check_ranks(config, 2), Error);
  try {
    config.telemetry.on_alert = AlertAction::warn;
    config.telemetry.shadow_every = 1;
    check_ranks(config, 2);
    FAIL() << "fp8.shadow_every on 2 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
    EXPECT_NE(std::string(e.what()).find("fp8.shadow_every"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace octet
