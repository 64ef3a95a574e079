// fp8.auto_filter and `octet localize` on the GPU, run as a user runs them (label gpu): every block layer of
// a small model either runs in FP8 or says, with both measured times, that FP8 was slower at its shape; and
// a localization says its gains were measured. Skips where octet was built without CUDA or sees no GPU.
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "process.h"
#include "train_fixture.h"

namespace octet {
namespace {

using Json = nlohmann::json;

class AutoFilterGpu : public TrainFixture {};

TEST_F(AutoFilterGpu, SlowerFp8LayersStayInBf16WithBothTimes) {
  const std::filesystem::path config = write_config("fp8", 4);
  const testing::ProcessResult r = testing::run_octet(
      {"train", config.string(), "--set", "train.device=cuda", "--set", "fp8.auto_filter=true"});
  if (r.exit_code == 2 && (r.err.find("built without CUDA") != std::string::npos ||
                           r.err.find("no CUDA GPU is visible") != std::string::npos)) {
    GTEST_SKIP() << "no CUDA GPU: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json map = Json::parse(read(root_ / "run" / "precision_map.json"));
  const std::regex slower(
      "bf16: fp8 ([0-9.]+) ms > bf16 ([0-9.]+) ms at M=32, N=[0-9]+, K=[0-9]+ \\(fp8.auto_filter\\)");
  for (const Json& layer : map) {
    if (layer["layer"] == "lm_head") continue;
    const std::string reason = layer["reason"];
    std::smatch m;
    if (layer["forward"] == "fp8") {
      EXPECT_EQ(reason, "FP8 by policy");
    } else {
      ASSERT_TRUE(std::regex_match(reason, m, slower)) << reason;
      EXPECT_GT(std::stod(m[1]), std::stod(m[2])) << reason;
    }
  }

  const testing::ProcessResult l =
      testing::run_octet({"localize", config.string(), "--set", "train.device=cuda", "--batches", "1"});
  ASSERT_EQ(l.exit_code, 0) << l.err;
  EXPECT_NE(l.out.find("gain: measured on the GPU"), std::string::npos) << l.out;
}

}  // namespace
}  // namespace octet
