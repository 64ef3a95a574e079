// `octet localize` and `octet train` with its map, run as a user runs them: the map beside the
// configuration, the same bytes from two localizations, the table and the wall time on stdout, a training
// run that reads the map (startup line, precision_map.json), and bad options and maps refused with exit code
// 2, one message, and nothing written. fp8.auto_filter is refused on the CPU.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process.h"
#include "train_fixture.h"

namespace octet {
namespace {

using Json = nlohmann::json;

class LocalizeCommand : public TrainFixture {
 protected:
  testing::ProcessResult localize(const std::vector<std::string>& more = {}) {
    config_ = write_config("fp8", 4);
    std::vector<std::string> args = {"localize", config_.string(), "--batches", "2"};
    args.insert(args.end(), more.begin(), more.end());
    return testing::run_octet(args);
  }
  std::filesystem::path config_;
};

TEST_F(LocalizeCommand, WritesTheSameBytesTwiceBesideTheConfigurationAndTrainingReadsIt) {
  const testing::ProcessResult r = localize({"--free-casts"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::filesystem::path file = root_ / "run.precision_map.json";
  ASSERT_TRUE(std::filesystem::exists(file)) << r.out;
  EXPECT_NE(r.out.find("localizing 4 of 5 linear layers over 2 batches of 2 x 16 tokens"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("gain: modelled, not measured (no GPU)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer"), std::string::npos);
  EXPECT_NE(r.out.find("; took "), std::string::npos) << r.out;
  const std::string first = read(file);
  const Json m = Json::parse(first);
  EXPECT_EQ(m["format"], "octet-precision-map");
  EXPECT_EQ(m["batches"], 2);
  EXPECT_EQ(m["budget"], 0.005);
  EXPECT_EQ(m["layers"][4]["choice"], "excluded");
  for (int i = 0; i < 4; ++i) {
    const Json& l = m["layers"][i];
    EXPECT_TRUE(l["choice"] == "fp8" || l["choice"] == "bf16") << l.dump();
    EXPECT_TRUE(l["numerics"]["activation"]["sqnr_db"].is_number()) << l.dump();
    EXPECT_GT(l["gain"]["bf16_ms"].get<double>(), 0.0);
  }

  const testing::ProcessResult again = localize({"--free-casts"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(read(file), first) << "two localizations write the same bytes";

  // Training with the map: every layer the map keeps in BF16 says so, with the map's reason.
  Json edited = Json::parse(first);
  edited["layers"][1]["choice"] = "bf16";
  edited["layers"][1]["reason"] = "bf16: planted";
  const std::filesystem::path planted = root_ / "planted.precision_map.json";
  std::ofstream(planted) << edited.dump(2);
  const testing::ProcessResult t =
      testing::run_octet({"train", config_.string(), "--set", "fp8.precision_map=" + planted.string()});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("kept in BF16 by precision map " + planted.string()), std::string::npos) << t.out;
  const Json map = Json::parse(read(root_ / "run" / "precision_map.json"));
  EXPECT_EQ(map[1]["forward"], "bf16");
  EXPECT_EQ(map[1]["reason"], "bf16: planted (precision map " + planted.string() + ")");
}

TEST_F(LocalizeCommand, BadOptionsAndMapsAreRefusedWithNothingWritten) {
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--batches", "0"},
                                              {"--budget", "-1"},
                                              {"--budget", "x"},
                                              {"--init-from", "/nonexistent"}}) {
    const testing::ProcessResult r = localize(bad);
    EXPECT_EQ(r.exit_code, 2) << bad[0] << " " << bad[1] << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(root_ / "run.precision_map.json"));
  }
  config_ = write_config("fp8", 2);
  const std::filesystem::path garbled = root_ / "garbled.json";
  std::ofstream(garbled) << "{\"format\": \"octet-precision-map\", \"version\": 1";
  for (const std::string& map : {std::string("/nonexistent/map.json"), garbled.string()}) {
    const testing::ProcessResult t =
        testing::run_octet({"train", config_.string(), "--set", "fp8.precision_map=" + map});
    EXPECT_EQ(t.exit_code, 2) << t.err;
    EXPECT_NE(t.err.find(map), std::string::npos) << t.err;
    EXPECT_FALSE(std::filesystem::exists(root_ / "run")) << "nothing written";
  }
  const testing::ProcessResult a =
      testing::run_octet({"train", config_.string(), "--set", "fp8.auto_filter=true"});
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find("fp8.auto_filter = true times each FP8 layer's GEMMs on the GPU"), std::string::npos)
      << a.err;
  EXPECT_FALSE(std::filesystem::exists(root_ / "run"));
}

}  // namespace
}  // namespace octet
