// FP8 alert thresholds: a reading above a threshold raises an alert once per (layer, tensor, kind), a scale
// jump is a lasting move of a tensor's median amax between readings (a spike is not), or of its scale where
// the casts' amaxes are not known, an alert raised before a resume is not raised again, and the thresholds'
// "never" settings never fire.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "octet/telemetry/alerts.h"

namespace octet {
namespace {

TensorReading reading(int64_t step, std::optional<double> saturated, std::optional<double> underflow,
                      std::optional<double> scale, std::string tensor = "activation") {
  return {step, "h.0.mlp.c_fc", std::move(tensor), saturated, underflow, scale, {}};
}

TEST(AlertMonitor, EachKindFiresOncePerTensorAboveItsThreshold) {
  TelemetrySettings s;  // saturation 1%, underflow 10%, scale jump 8
  AlertMonitor m(s);
  EXPECT_TRUE(m.observe(reading(10, 0.01, 0.10, 100.0)).empty()) << "at the thresholds: no alert";
  std::vector<Alert> a = m.observe(reading(20, 0.02, 0.0, 100.0));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "saturation");
  EXPECT_EQ(a[0].step, 20);
  EXPECT_EQ(a[0].layer, "h.0.mlp.c_fc");
  EXPECT_EQ(a[0].tensor, "activation");
  EXPECT_DOUBLE_EQ(a[0].value, 0.02);
  EXPECT_DOUBLE_EQ(a[0].threshold, 0.01);
  EXPECT_EQ(a[0].what, "2% of its values saturated (threshold 1%)");
  EXPECT_TRUE(m.observe(reading(30, 0.5, 0.0, 100.0)).empty()) << "not repeated";
  EXPECT_EQ(m.observe(reading(30, 0.5, 0.0, 100.0, "gradient")).size(), 1u)
      << "another tensor is another alert";
  a = m.observe(reading(40, 0.0, 0.25, 100.0));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "underflow");
  EXPECT_EQ(a[0].what, "25% of its non-zero values underflowed to zero (threshold 10%)");
}

TEST(AlertMonitor, WithoutTheCastsAmaxesScaleJumpComparesWithThePreviousReadingInBothDirections) {
  TelemetrySettings s;
  AlertMonitor m(s);
  EXPECT_TRUE(m.observe(reading(10, 0.0, 0.0, 1.0)).empty()) << "no previous reading to compare with";
  EXPECT_TRUE(m.observe(reading(20, 0.0, 0.0, 8.0)).empty()) << "a factor of exactly 8";
  std::vector<Alert> a = m.observe(reading(30, 0.0, 0.0, 0.5));  // 8 -> 0.5: a factor of 16, downwards
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "scale_jump");
  EXPECT_DOUBLE_EQ(a[0].value, 16.0);
  EXPECT_EQ(a[0].what, "its scale moved by a factor of 16 (8 at step 20 -> 0.5; threshold 8)");
  EXPECT_TRUE(m.observe(reading(40, 0.0, 0.0, 100.0)).empty()) << "raised once";
}

TensorReading with_amaxes(int64_t step, std::vector<double> amaxes, std::string tensor = "weight") {
  TensorReading r =
      reading(step, 0.0, 0.0, 57344.0 / *std::max_element(amaxes.begin(), amaxes.end()), tensor);
  r.recent_amax = std::move(amaxes);
  return r;
}

TEST(AlertMonitor, WithTheCastsAmaxesASpikeIsNoScaleJumpButALastingMoveIs) {
  AlertMonitor m{TelemetrySettings{}};
  EXPECT_TRUE(m.observe(with_amaxes(10, {2e-5, 2.4e-5, 2.1e-5, 2.6e-5, 2.3e-5})).empty());
  // A spike of 130 times at one step: delayed scaling's scale drops 130 times, the median hardly moves.
  EXPECT_TRUE(m.observe(with_amaxes(20, {2.5e-5, 3.3e-3, 2.4e-5, 0.0, 2.2e-5, 2.6e-5})).empty())
      << "a zero amax (an all-zero tensor) is passed over too";
  // Steady growth over the next interval: 1.3 times a step, 3.7 times from one median to the next.
  EXPECT_TRUE(m.observe(with_amaxes(30, {3e-5, 4e-5, 5e-5, 6.5e-5, 8.5e-5})).empty());
  // The tensor's magnitude 64 times larger from one step on, and staying so.
  const std::vector<Alert> a = m.observe(with_amaxes(40, {8e-5, 5.4e-3, 5.6e-3, 5.2e-3, 5.5e-3}));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "scale_jump");
  EXPECT_NEAR(a[0].value, 5.4e-3 / 5e-5, 1e-9);
  EXPECT_DOUBLE_EQ(a[0].threshold, 8.0);
  EXPECT_EQ(a[0].what,
            "its median amax moved by a factor of 108 (5e-05 over the casts up to step 30 -> 0.0054 over "
            "the 5 since; threshold 8)");
  // Downwards too, for another tensor; an even count's median is the geometric mean of the middle two.
  EXPECT_TRUE(m.observe(with_amaxes(10, {4.0, 4.0}, "activation")).empty());
  const std::vector<Alert> down = m.observe(with_amaxes(20, {0.5, 0.1, 0.9, 0.2}, "activation"));
  ASSERT_EQ(down.size(), 1u);
  EXPECT_NEAR(down[0].value, 4.0 / std::sqrt(0.2 * 0.5), 1e-9);
}

TEST(AlertMonitor, GradientsRaiseNoScaleJump) {
  // The quickstart's gradients just after its warm-up: spikes of a hundred times that clipping absorbs, and a
  // first layer's gradient growing 70 times over 20 steps. Before, each raised a scale_jump alert.
  AlertMonitor m{TelemetrySettings{}};
  EXPECT_TRUE(m.observe(with_amaxes(20, {2.5e-5, 2.7e-5, 2.6e-5}, "gradient")).empty());
  EXPECT_TRUE(m.observe(with_amaxes(30, {2.5e-5, 3.3e-3, 4.6e-3, 4.1e-3}, "gradient")).empty());
  EXPECT_TRUE(m.observe(reading(10, 0.0, 0.0, 2e8, "gradient")).empty());
  EXPECT_TRUE(m.observe(reading(20, 0.0, 0.0, 1e6, "gradient")).empty());
  // What such moves cost is still an alert of its own.
  const std::vector<Alert> a = m.observe(with_amaxes(40, {1.0}, "gradient"));
  EXPECT_TRUE(a.empty());
  TensorReading clipped = with_amaxes(50, {1.0}, "gradient");
  clipped.saturated_fraction = 0.05;
  ASSERT_EQ(m.observe(clipped).size(), 1u);
}

TEST(AlertMonitor, ARecalibratedScaleIsTheNewReferenceAndALaterJumpStillFires) {
  AlertMonitor m{TelemetrySettings{}};
  EXPECT_TRUE(m.observe(reading(10, 0.0, 0.0, 0.001)).empty());
  EXPECT_TRUE(m.observe(reading(10, 0.0, 0.0, 0.001, "weight")).empty());
  // A recalibration after step 10 installs scales 4096 and 2048 times larger; only the activation's is
  // rebased, as if the weight's operand had been left out.
  m.rebase_scale("h.0.mlp.c_fc", "activation", 10, 4.096);
  EXPECT_TRUE(m.observe(reading(20, 0.0, 0.0, 4.096)).empty()) << "the recalibration's own move";
  std::vector<Alert> a = m.observe(reading(20, 0.0, 0.0, 2.048, "weight"));
  ASSERT_EQ(a.size(), 1u) << "a tensor not rebased still compares with its last reading";
  EXPECT_DOUBLE_EQ(a[0].value, 2048.0);
  // A real jump after the recalibration: 4.096 -> 0.25, a factor of 16.384.
  a = m.observe(reading(30, 0.0, 0.0, 0.25));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "scale_jump");
  EXPECT_DOUBLE_EQ(a[0].value, 16.384);
  EXPECT_EQ(a[0].what, "its scale moved by a factor of 16.4 (4.096 at step 20 -> 0.25; threshold 8)");
  // An unusable scale is no reference: the previous one stays.
  AlertMonitor n{TelemetrySettings{}};
  EXPECT_TRUE(n.observe(reading(10, 0.0, 0.0, 1.0)).empty());
  n.rebase_scale("h.0.mlp.c_fc", "activation", 10, NAN);
  n.rebase_scale("h.0.mlp.c_fc", "activation", 10, 0.0);
  EXPECT_EQ(n.observe(reading(20, 0.0, 0.0, 100.0)).size(), 1u);
}

TEST(AlertMonitor, RaisedBeforeAResumeIsNotRaisedAgain) {
  AlertMonitor m{TelemetrySettings{}};
  m.mark_raised("h.0.mlp.c_fc", "activation", "saturation");
  EXPECT_TRUE(m.observe(reading(10, 0.9, 0.0, {})).empty());
  EXPECT_EQ(m.observe(reading(10, 0.0, 0.9, {})).size(), 1u);
}

TEST(AlertMonitor, NeverSettingsNeverFireAndMissingReadingsAreNotAlerts) {
  TelemetrySettings s;
  s.alert_saturation = 1.0f;
  s.alert_underflow = 1.0f;
  s.alert_scale_jump = 0.0f;
  AlertMonitor m(s);
  EXPECT_TRUE(m.observe(reading(10, 1.0, 1.0, 1.0)).empty());
  EXPECT_TRUE(m.observe(reading(20, 1.0, 1.0, 1e30)).empty());
  AlertMonitor d{TelemetrySettings{}};
  EXPECT_TRUE(d.observe(reading(10, std::nullopt, std::nullopt, std::nullopt)).empty());
}

}  // namespace
}  // namespace octet
