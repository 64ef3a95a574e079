// BF16 shadow checks in `octet train`, run as a user runs it: a healthy run records its losses and cosines
// and raises nothing; a run with shadow checks trains bit for bit as one without; a layer planted to flush
// its activations (a calibration file whose scale for that layer's input is far too small) fires the
// shadow_cosine alert naming it, and with fp8.on_alert = "bf16_layer" moves to BF16; bad values and
// combinations are refused with exit code 2 and nothing written.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "shadow_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kPlanted = "h.0.mlp.c_proj";

class ShadowRun : public ShadowFixture {
 protected:
  // A calibration of the fixture's model whose activation scale for kPlanted is 1e-4: its inputs (GELU
  // outputs, |x| < 10) times 1e-4 are below E4M3's smallest subnormal (2^-9) and all flush to zero.
  fs::path planted_calibration() {
    const fs::path config = write_config("fp8", 2);
    const fs::path file = root_ / "planted.calibration.json";
    const testing::ProcessResult r =
        testing::run_octet({"calibrate", config.string(), "--batches", "2", "--out", file.string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    Json c = Json::parse(read(file));
    bool planted = false;
    for (Json& layer : c["layers"]) {
      if (layer["name"] == kPlanted) {
        layer["operands"]["activation"]["scale"] = 1e-4;
        planted = true;
      }
    }
    EXPECT_TRUE(planted);
    std::ofstream(file) << c.dump(1);
    return file;
  }
};

TEST_F(ShadowRun, HealthyRunRecordsLossesAndCosinesAndRaisesNothing) {
  const testing::ProcessResult r = train(8, {"fp8.shadow_every=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto losses =
      query("SELECT step, fp8_loss, bf16_loss, relative_difference FROM shadow_loss ORDER BY step");
  ASSERT_EQ(losses.size(), 4u);
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i][0], std::to_string(2 * (i + 1)));
    const double fp8 = std::stod(losses[i][1]), bf16 = std::stod(losses[i][2]), d = std::stod(losses[i][3]);
    EXPECT_GT(fp8, 1.0);
    EXPECT_GT(bf16, 1.0);
    EXPECT_NE(fp8, bf16);  // FP8 is not BF16: the check measures something
    EXPECT_LT(d, 0.02) << "step " << losses[i][0];
  }
  // The step's loss is its only micro-batch's: the FP8 loss the shadow compares is the one trained on.
  const auto steps = query("SELECT s.loss, l.fp8_loss FROM steps s JOIN shadow_loss l ON s.step = l.step");
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& row : steps) EXPECT_EQ(std::stod(row[0]), std::stod(row[1]));
  const auto cosines = query("SELECT step, layer, cosine FROM shadow ORDER BY step, layer");
  ASSERT_EQ(cosines.size(), 16u);  // 4 FP8 layers x 4 checks
  for (const auto& row : cosines) {
    ASSERT_NE(row[2], "NULL") << row[1];
    EXPECT_GT(std::stod(row[2]), 0.9) << row[0] << " " << row[1];
    EXPECT_LT(std::stod(row[2]), 1.0) << row[0] << " " << row[1];
  }
  EXPECT_EQ(number("SELECT COUNT(*) FROM events WHERE kind LIKE 'shadow%'"), 0.0);
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
}

TEST_F(ShadowRun, TrainingIsBitIdenticalWithAndWithoutShadowChecks) {
  // Two micro-batches a step: the shadow runs between the first and the second.
  auto run = [&](const std::string& every) {
    const testing::ProcessResult r =
        train(6, {"fp8.shadow_every=" + every, "train.grad_accum_steps=2"}, {"--overwrite"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const fs::path checkpoint = root_ / "run" / "checkpoints" / "step_000006";
    Json state = Json::parse(read(checkpoint / "state.json"));
    state.erase("config");
    return std::vector<std::string>{read(checkpoint / "model.safetensors"),
                                    read(checkpoint / "optimizer.safetensors"), state.dump(),
                                    Json(step_losses(read(root_ / "run" / "metrics.jsonl"))).dump()};
  };
  const std::vector<std::string> without = run("0");
  const std::vector<std::string> with = run("1");
  EXPECT_EQ(number("SELECT COUNT(*) FROM shadow_loss"), 5.0);  // steps 2..6: the first step has no check
  ASSERT_EQ(without.size(), with.size());
  const char* what[] = {"weights", "optimizer state", "state.json (FP8 scaling, loss scale, data position)",
                        "step losses"};
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_FALSE(with[i].empty()) << what[i];
    EXPECT_TRUE(with[i] == without[i]) << what[i] << " differ";
  }
}

TEST_F(ShadowRun, PlantedLayerFiresTheAlertAndMovesToBf16) {
  const fs::path calibration = planted_calibration();
  // Underflow alerts off: the shadow alert alone must find the layer.
  const testing::ProcessResult r =
      train(6, {"fp8.recipe=static", "fp8.calibration=" + calibration.string(), "fp8.shadow_every=2",
                "fp8.on_alert=bf16_layer", "fp8.alert_underflow=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto events = query("SELECT step, kind, layer, tensor, value FROM events WHERE kind LIKE 'shadow%'");
  ASSERT_EQ(events.size(), 1u) << r.out;
  EXPECT_EQ(events[0], (std::vector<std::string>{"2", "shadow_cosine", kPlanted, "weight_gradient", "0.0"}));
  EXPECT_NE(r.out.find(std::string("warning: FP8 shadow_cosine alert at step 2: ") + kPlanted +
                       " weight_gradient: its weight gradient in FP8 has a cosine of 0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(std::string(kPlanted) + " runs in BF16 from step 3"), std::string::npos) << r.out;
  // Every other layer agrees with its shadow.
  EXPECT_EQ(
      number(std::string("SELECT COUNT(*) FROM shadow WHERE layer != '") + kPlanted + "' AND cosine > 0.9"),
      9.0);
  // Moved: its GEMMs in BF16 from step 3, three FP8 GEMMs fewer per step, no more shadow rows for it.
  const auto gemms =
      query(std::string("SELECT gemm, mode, since_step FROM gemms WHERE since_step > 0 AND layer = '") +
            kPlanted + "' ORDER BY gemm");
  ASSERT_EQ(gemms.size(), 3u);
  for (const auto& g : gemms) {
    EXPECT_EQ(g[1], "bf16");
    EXPECT_EQ(g[2], "3");
  }
  EXPECT_EQ(number("SELECT fp8_gemms FROM steps WHERE step = 2") -
                number("SELECT fp8_gemms FROM steps WHERE step = 3"),
            3.0);
  EXPECT_EQ(number(std::string("SELECT COUNT(*) FROM shadow WHERE layer = '") + kPlanted + "'"), 1.0);
  const Json map = Json::parse(read(root_ / "run" / "precision_map.json"));
  bool found = false;
  for (const Json& layer : map) {
    if (layer["layer"] != kPlanted) continue;
    found = true;
    EXPECT_EQ(layer["forward"], "bf16") << layer.dump();
  }
  EXPECT_TRUE(found) << map.dump();

  // Resumed for two more steps, the run remembers the alert and the move: no second alert, the layer in BF16.
  const testing::ProcessResult resumed =
      train(8,
            {"fp8.recipe=static", "fp8.calibration=" + calibration.string(), "fp8.shadow_every=2",
             "fp8.on_alert=bf16_layer", "fp8.alert_underflow=1"},
            {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(resumed.out.find("warning"), std::string::npos) << resumed.out;
  EXPECT_EQ(number("SELECT COUNT(*) FROM events WHERE kind LIKE 'shadow%'"), 1.0);
  EXPECT_EQ(number(std::string("SELECT COUNT(*) FROM shadow WHERE layer = '") + kPlanted + "'"), 1.0);
  EXPECT_EQ(number("SELECT COUNT(*) FROM shadow_loss"), 4.0);  // steps 2, 4, 6, 8
}

TEST_F(ShadowRun, BadValuesAndCombinationsAreRefusedWithNothingWritten) {
  struct Case {
    std::vector<std::string> sets;
    std::string words;
  };
  const std::vector<Case> cases = {
      {{"fp8.shadow_every=-1"}, "fp8.shadow_every"},
      {{"fp8.shadow_every=x"}, "fp8.shadow_every"},
      {{"fp8.shadow_loss_threshold=0"}, "fp8.shadow_loss_threshold"},
      {{"fp8.shadow_loss_threshold=nan"}, "fp8.shadow_loss_threshold"},
      {{"fp8.shadow_cosine_threshold=1.5"}, "fp8.shadow_cosine_threshold"},
      {{"fp8.recalibrate_every=-2"}, "fp8.recalibrate_every"},
      {{"fp8.on_alert=recalibrat"}, "fp8.on_alert"},
      {{"train.mixed_precision=bf16", "fp8.shadow_every=2"},
       "fp8.shadow_every = 2 acts on fp8 steps, and this run trains in bf16 throughout"},
      {{"telemetry.enabled=false", "fp8.shadow_every=2"}, "telemetry.enabled = false"},
      {{"fp8.recalibrate_every=5"},
       "fp8.recalibrate_every = 5 installs the static recipe's scales, and "
       "fp8.recipe is \"delayed\""},
      {{"fp8.on_alert=recalibrate", "fp8.recipe=current"}, "fp8.on_alert = \"recalibrate\" installs"},
  };
  for (const Case& c : cases) {
    const testing::ProcessResult r = train(4, c.sets);
    EXPECT_EQ(r.exit_code, 2) << c.sets.back() << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(c.words), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(root_ / "run")) << c.sets.back();
  }
  // A bf16 warm-up before fp8 steps is no refusal: the checks act on the fp8 steps.
  const testing::ProcessResult warm = train(6, {"fp8.bf16_warmup_steps=3", "fp8.shadow_every=1"});
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  const auto steps = query("SELECT step FROM shadow_loss ORDER BY step");
  EXPECT_EQ(steps, (std::vector<std::vector<std::string>>{{"5"}, {"6"}}));  // step 4 is the fp8 model's first
}

}  // namespace
}  // namespace octet
