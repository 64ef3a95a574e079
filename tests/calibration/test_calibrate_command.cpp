// `octet calibrate` and `octet train` with its file, run as a user runs them: the file beside the
// configuration, the same bytes from two calibrations, a static run that casts with the file's scales and
// keeps them when resumed, and every bad file refused with exit code 2, a message naming the file and what
// was wrong, and nothing written.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "calibration_fixture.h"
#include "process.h"
#include "train_fixture.h"

namespace octet {
namespace {

using Json = nlohmann::json;

class CalibrateCommand : public TrainFixture {
 protected:
  // Calibrates the fixture's configuration (fp8 mode, static recipe); returns the process result.
  testing::ProcessResult calibrate(const std::vector<std::string>& more = {}) {
    config_ = write_config("fp8", 4);
    std::vector<std::string> args = {"calibrate", config_.string(), "--batches", "3"};
    args.insert(args.end(), more.begin(), more.end());
    return testing::run_octet(args);
  }
  testing::ProcessResult train(const std::filesystem::path& calibration,
                               const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"train", config_.string(),
                                     "--set", "fp8.recipe=static",
                                     "--set", "fp8.calibration=" + calibration.string()};
    args.insert(args.end(), more.begin(), more.end());
    return testing::run_octet(args);
  }
  std::filesystem::path config_;
};

TEST_F(CalibrateCommand, WritesBesideTheConfigurationAndTheStaticRunUsesIt) {
  const testing::ProcessResult r = calibrate();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::filesystem::path file = root_ / "run.calibration.json";
  ASSERT_TRUE(std::filesystem::exists(file)) << r.out;
  EXPECT_NE(r.out.find("calibrating 4 of 5 linear layers over 3 batches of 2 x 16 tokens in bf16"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("wrote " + file.string() + ": 4 of 5 linear layers calibrated (scales from amax)"),
            std::string::npos)
      << r.out;
  const Json c = Json::parse(read(file));
  EXPECT_EQ(c["format"], "octet-fp8-calibration");
  EXPECT_EQ(c["version"], 1);
  EXPECT_EQ(c["batches"], 3);
  EXPECT_EQ(c["data_dir"], (root_ / "shards").string());
  EXPECT_EQ(c["layers"][4]["name"], "lm_head");
  EXPECT_EQ(c["layers"][4]["excluded"], "excluded by config");
  for (int i = 0; i < 4; ++i) {
    const Json& a = c["layers"][i]["operands"]["activation"];
    EXPECT_EQ(a["scale"].get<float>(), 448.0f / a["statistics"]["amax"].get<float>());
  }

  const testing::ProcessResult t = train(file);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("recipe=static (hybrid E4M3/E5M2, per-layer scales calibrated in " + file.string() +
                       "); 4 of 5 linear layers in FP8"),
            std::string::npos)
      << t.out;
  const Json map = Json::parse(read(root_ / "run" / "precision_map.json"));
  EXPECT_EQ(map[0]["scales"]["activation"].get<float>(),
            c["layers"][0]["operands"]["activation"]["scale"].get<float>());
  EXPECT_EQ(map[0]["calibration"], file.string());
  EXPECT_FALSE(map[4].contains("scales"));

  // Evaluating the checkpoint reads the file again and casts with the checkpoint's (the file's) scales.
  const testing::ProcessResult eval =
      testing::run_octet({"eval", (root_ / "run").string(), "--batches", "1"});
  EXPECT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("(step 4, fp8): validation loss"), std::string::npos) << eval.out;

  // Resumed, the run keeps the calibrated scales: they are in every checkpoint's scaling state.
  const testing::ProcessResult more = train(file, {"--resume", "--set", "train.steps=6"});
  ASSERT_EQ(more.exit_code, 0) << more.err;
  const Json state = Json::parse(read(root_ / "run" / "checkpoints" / "step_000006" / "state.json"));
  for (int i = 0; i < 4; ++i) {
    const std::string name = c["layers"][i]["name"];
    for (const char* role : {"activation", "weight", "gradient"}) {
      EXPECT_EQ(state["fp8"]["layers"][name][role]["scale"].get<float>(),
                c["layers"][i]["operands"][role]["scale"].get<float>())
          << name << " " << role;
    }
  }
}

TEST_F(CalibrateCommand, TwoCalibrationsWriteTheSameBytes) {
  ASSERT_EQ(calibrate({"--out", (root_ / "a.json").string()}).exit_code, 0);
  ASSERT_EQ(calibrate({"--out", (root_ / "b.json").string(), "--statistic", "p99.9"}).exit_code, 0);
  ASSERT_EQ(calibrate({"--out", (root_ / "c.json").string()}).exit_code, 0);
  EXPECT_EQ(read(root_ / "a.json"), read(root_ / "c.json"));
  const Json b = Json::parse(read(root_ / "b.json"));
  EXPECT_EQ(b["statistic"], "p99.9");
  const Json& a = b["layers"][0]["operands"]["activation"];
  EXPECT_EQ(a["scale"].get<float>(), 448.0f / a["statistics"]["p99.9"].get<float>());
}

TEST_F(CalibrateCommand, BadOptionsAreRefusedAndNothingIsWritten) {
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--batches", "0"},
                                              {"--batches", "x"},
                                              {"--statistic", "p50"},
                                              {"--init-from", (root_ / "nowhere").string()}}) {
    const testing::ProcessResult r = calibrate(bad);
    EXPECT_EQ(r.exit_code, 2) << bad[0] << ": " << r.err;
    EXPECT_NE(r.err.find(bad[0]), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(root_ / "run.calibration.json"));
  }
}

TEST_F(CalibrateCommand, EveryBadFileIsRefusedNamingItWithNothingWritten) {
  ASSERT_EQ(calibrate().exit_code, 0);
  const std::filesystem::path good = root_ / "run.calibration.json";
  const Json c = Json::parse(read(good));
  struct Case {
    const char* what;
    std::string text;  // empty: no file at all
    std::string words;
    std::vector<std::string> more = {};
  };
  auto edited = [&](auto edit) {
    Json j = c;
    edit(j);
    return j.dump(1);
  };
  const std::vector<Case> cases = {
      {"missing", "", "cannot open: No such file or directory"},
      {"not json", "{\"format\": ", "not valid JSON"},
      {"version", edited([](Json& j) { j["version"] = 7; }), "version 7 is not one this octet reads"},
      {"missing layer", edited([](Json& j) { j["layers"].erase(1); }), "layer h.0.attn.c_proj is missing"},
      {"extra layer", edited([](Json& j) {
         Json l = j["layers"][0];
         l["name"] = "h.3.mlp.c_fc";
         j["layers"].push_back(l);
       }),
       "a layer h.3.mlp.c_fc that this model"},
      {"zero scale", edited([](Json& j) { j["layers"][2]["operands"]["weight"]["scale"] = 0.0; }),
       "layers[2] (h.0.mlp.c_fc).operands.weight.scale = 0.0 is not a usable scale"},
      {"negative scale", edited([](Json& j) { j["layers"][0]["operands"]["gradient"]["scale"] = -2.0; }),
       "is not a usable scale"},
      {"infinite scale", edited([](Json& j) { j["layers"][0]["operands"]["gradient"]["scale"] = 1e300; }),
       "is not a usable scale"},
      {"another model",
       read(good),
       "made for another model: model.channels is 32 there, 64",
       {"--set", "model.channels=64"}},
      {"another recipe",
       read(good),
       "fp8.calibration gives the static recipe its scales",
       {"--set", "fp8.recipe=delayed"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    const std::filesystem::path file = root_ / (std::string(k.what) + ".json");
    if (!k.text.empty()) testing::write_text(file, k.text);
    std::filesystem::remove_all(root_ / "run");
    const testing::ProcessResult r = train(file, k.more);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(k.words), std::string::npos) << r.err;
    if (std::string(k.what) != "another recipe") {
      EXPECT_NE(r.err.find(file.string()), std::string::npos) << r.err;
    }
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_FALSE(std::filesystem::exists(root_ / "run")) << "a refused run writes nothing";
  }
}

}  // namespace
}  // namespace octet
