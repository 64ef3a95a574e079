// Recalibration in `octet train`, run as a user runs it: fp8.recalibrate_every replaces a badly chosen
// fp8.static_scale with the calibrated scales (fp8_max / amax of the operand measured), records every
// operand's scale before and after, and the next steps cast with the new scales; a run resumed from a
// checkpoint saved after a recalibration trains exactly as the uninterrupted run; and a shadow alert with
// fp8.on_alert = "recalibrate" recalibrates at once, after which the planted layer agrees with BF16 again. A
// recalibration's own move of the scales raises no scale_jump alert (tests/telemetry/test_alerts.cpp has a
// real jump after a recalibration still raising one).
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "shadow_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

class Recalibration : public ShadowFixture {};

// A float32 scale as SQLite holds it (a double, exactly), read back exactly.
float as_float(const std::string& text) {
  return static_cast<float>(std::stod(text));
}

TEST_F(Recalibration, ReplacesABadStaticScaleWithTheCalibratedOne) {
  const testing::ProcessResult r =
      train(4, {"fp8.recipe=static", "fp8.static_scale=0.001", "fp8.recalibrate_every=3",
                "telemetry.interval=1", "fp8.alert_underflow=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step 3: FP8 scales recalibrated (every 3 steps): 12 of 12 operand scales changed"),
            std::string::npos)
      << r.out;
  const auto rows = query(
      "SELECT step, layer, tensor, printf('%.17g', scale_before), printf('%.17g', scale_after), "
      "printf('%.17g', amax), reason FROM recalibrations ORDER BY layer, tensor");
  ASSERT_EQ(rows.size(), 12u);  // 4 FP8 layers x 3 operands, at step 3 only
  for (const auto& row : rows) {
    EXPECT_EQ(row[0], "3");
    EXPECT_EQ(as_float(row[3]), 0.001f) << row[1] << " " << row[2];
    const float amax = as_float(row[5]);
    ASSERT_GT(amax, 0.0f) << row[1] << " " << row[2];
    // E4M3 for activations and weights, E5M2 for gradients (hybrid formats), margin 0.
    const float fp8_max = row[2] == "gradient" ? 57344.0f : 448.0f;
    EXPECT_EQ(as_float(row[4]), fp8_max / amax) << row[1] << " " << row[2];
    EXPECT_EQ(row[6], "every 3 steps");
    // The next step casts with the new scale (telemetry records each operand's scale every step here).
    EXPECT_EQ(as_float(query("SELECT printf('%.17g', scale) FROM tensor_stats WHERE step = 4 AND layer = '" +
                             row[1] + "' AND tensor = '" + row[2] + "'")[0][0]),
              as_float(row[4]))
        << row[1] << " " << row[2];
    EXPECT_EQ(as_float(query("SELECT printf('%.17g', scale) FROM tensor_stats WHERE step = 3 AND layer = '" +
                             row[1] + "' AND tensor = '" + row[2] + "'")[0][0]),
              0.001f);
  }
  const auto events = query("SELECT step, value, message FROM events WHERE kind = 'recalibration'");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0][0], "3");
  // Every scale moved by far more than fp8.alert_scale_jump = 8 between steps 3 and 4, on purpose: the
  // alert monitor compares step 4's scales with the recalibrated ones, not with step 3's.
  EXPECT_EQ(number("SELECT COUNT(*) FROM events WHERE kind = 'scale_jump'"), 0.0);
  EXPECT_EQ(r.out.find("scale_jump"), std::string::npos) << r.out;
  EXPECT_EQ(events[0][1], "12.0");
  // The final checkpoint holds the new scales.
  const Json state = Json::parse(read(root_ / "run" / "checkpoints" / "step_000004" / "state.json"));
  for (const auto& row : rows)
    EXPECT_EQ(state["fp8"]["layers"][row[1]][row[2]]["scale"].get<float>(), as_float(row[4])) << row[1];
}

TEST_F(Recalibration, AResumedRunContinuesExactly) {
  const std::vector<std::string> sets = {"fp8.recipe=static", "fp8.static_scale=0.001",
                                         "fp8.recalibrate_every=3", "fp8.alert_underflow=1",
                                         "checkpoint.every=4"};
  ASSERT_EQ(train(8, sets).exit_code, 0);
  const fs::path last = root_ / "run" / "checkpoints" / "step_000008";
  const std::string weights = read(last / "model.safetensors"),
                    moments = read(last / "optimizer.safetensors");
  Json state = Json::parse(read(last / "state.json"));
  const auto recalibrated = query("SELECT * FROM recalibrations ORDER BY step, layer, tensor");
  ASSERT_EQ(recalibrated.size(), 24u);  // steps 3 and 6

  // From step 4, saved after the recalibration of step 3: steps 5-8 again, with the recalibration of step 6,
  // into the same run directory (overwritten: its telemetry starts afresh).
  const fs::path saved = root_ / "step_000004";
  fs::copy(root_ / "run" / "checkpoints" / "step_000004", saved);
  const testing::ProcessResult r = train(8, sets, {"--resume-from", saved.string(), "--overwrite"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step 6: FP8 scales recalibrated"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 3: FP8 scales recalibrated"), std::string::npos) << r.out;
  EXPECT_TRUE(read(last / "model.safetensors") == weights) << "weights differ after the resume";
  EXPECT_TRUE(read(last / "optimizer.safetensors") == moments) << "optimizer state differs after the resume";
  Json resumed = Json::parse(read(last / "state.json"));
  EXPECT_EQ(resumed["fp8"], state["fp8"]);
  resumed.erase("config");
  state.erase("config");
  EXPECT_EQ(resumed, state);
  EXPECT_EQ(query("SELECT * FROM recalibrations ORDER BY step, layer, tensor"),
            std::vector<std::vector<std::string>>(recalibrated.begin() + 12, recalibrated.end()));
}

TEST_F(Recalibration, AShadowAlertRecalibratesAndTheLayerAgreesAgain) {
  // fp8.static_scale suits every operand but the planted one: h.0.mlp.c_proj's input (GELU outputs) at a
  // scale of 1e-4 flushes to zero; a calibration file plants it.
  const fs::path config = write_config("fp8", 2);
  const fs::path file = root_ / "planted.calibration.json";
  ASSERT_EQ(
      testing::run_octet({"calibrate", config.string(), "--batches", "2", "--out", file.string()}).exit_code,
      0);
  Json c = Json::parse(read(file));
  for (Json& layer : c["layers"]) {
    if (layer["name"] == "h.0.mlp.c_proj") layer["operands"]["activation"]["scale"] = 1e-4;
  }
  std::ofstream(file) << c.dump(1);
  const testing::ProcessResult r =
      train(6, {"fp8.recipe=static", "fp8.calibration=" + file.string(), "fp8.shadow_every=2",
                "fp8.on_alert=recalibrate", "fp8.alert_underflow=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("the FP8 scales are measured again on this step's batch (fp8.on_alert = \"recalibrate\")"),
      std::string::npos)
      << r.out;
  const auto rows = query(
      "SELECT step, printf('%.17g', scale_before), printf('%.17g', scale_after), reason FROM recalibrations "
      "WHERE layer = 'h.0.mlp.c_proj' AND tensor = 'activation'");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][0], "2");
  EXPECT_EQ(as_float(rows[0][1]), 1e-4f);
  EXPECT_GT(as_float(rows[0][2]), 1.0f);
  EXPECT_EQ(rows[0][3], "FP8 shadow_cosine alert at step 2 (h.0.mlp.c_proj weight_gradient)");
  EXPECT_EQ(number("SELECT cosine FROM shadow WHERE step = 2 AND layer = 'h.0.mlp.c_proj'"), 0.0);
  EXPECT_GT(number("SELECT cosine FROM shadow WHERE step = 4 AND layer = 'h.0.mlp.c_proj'"), 0.9);
  EXPECT_EQ(number("SELECT COUNT(*) FROM events WHERE kind = 'recalibration'"), 1.0);
}

}  // namespace
}  // namespace octet
