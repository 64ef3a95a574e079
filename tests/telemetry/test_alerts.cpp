// FP8 alert thresholds: a reading above a threshold raises an alert once per (layer, tensor, kind), a scale
// jump compares with the previous reading, an alert raised before a resume is not raised again, and the
// thresholds' "never" settings never fire.
#include <gtest/gtest.h>

#include "octet/telemetry/alerts.h"

namespace octet {
namespace {

TensorReading reading(int64_t step, std::optional<double> saturated, std::optional<double> underflow,
                      std::optional<double> scale, std::string tensor = "activation") {
  return {step, "h.0.mlp.c_fc", std::move(tensor), saturated, underflow, scale};
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

TEST(AlertMonitor, ScaleJumpComparesWithThePreviousReadingInBothDirections) {
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
