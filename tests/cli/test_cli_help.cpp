// `octet --version` and the help of every command: exit 0, the expected text on standard output, nothing on
// standard error. A missing command is a usage error: help on standard error and exit 2.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/version.h"
#include "process.h"

namespace octet {
namespace {

using testing::ProcessResult;
using testing::run_octet;

::testing::AssertionResult mentions_all(const std::string& text, const std::vector<std::string>& mentions) {
  for (const std::string& m : mentions) {
    if (text.find(m) == std::string::npos)
      return ::testing::AssertionFailure() << "no '" << m << "' in:\n" << text;
  }
  return ::testing::AssertionSuccess();
}

TEST(CliHelp, Version) {
  const ProcessResult r = run_octet({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, std::string("octet ") + kVersion + "\n");
  EXPECT_EQ(r.out, "octet 0.1.0\n");
  EXPECT_EQ(r.err, "");
}

struct HelpCase {
  std::vector<std::string> command;
  std::vector<std::string> mentions;
};

TEST(CliHelp, EveryCommandHasHelp) {
  const std::vector<HelpCase> cases = {
      {{}, {"Usage: octet", "fp8", "--version", "Exit codes", "Examples"}},
      {{"fp8"}, {"Usage: octet fp8", "table", "quantize", "e4m3", "e5m2", "448", "57344", "Examples"}},
      {{"fp8", "table"},
       {"Usage: octet fp8 table", "--format", "e4m3, e5m2", "subnormal, zero, inf, nan", "0x7e 448 normal",
        "Examples"}},
      {{"fp8", "quantize"},
       {"Usage: octet fp8 quantize", "--format", "e4m3, e5m2", "--scale", "--recipe", "current",
        "--no-saturate", "standard input", "scale_inv", "summary:", "saturated", "underflow", "Examples"}},
  };
  for (const HelpCase& c : cases) {
    for (const char* flag : {"--help", "-h"}) {
      std::vector<std::string> args = c.command;
      args.push_back(flag);
      SCOPED_TRACE(::testing::PrintToString(args));
      const ProcessResult r = run_octet(args);
      EXPECT_EQ(r.exit_code, 0);
      EXPECT_EQ(r.err, "");
      EXPECT_TRUE(mentions_all(r.out, c.mentions));
    }
  }
}

TEST(CliHelp, HelpWinsOverOtherArguments) {
  const ProcessResult r = run_octet({"fp8", "quantize", "--format", "e4m3", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(mentions_all(r.out, {"Usage: octet fp8 quantize"}));
}

TEST(CliHelp, AMissingCommandPrintsHelpAndFails) {
  ProcessResult r = run_octet({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(mentions_all(r.err, {"Usage: octet", "fp8"}));
  r = run_octet({"fp8"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(mentions_all(r.err, {"Usage: octet fp8", "table", "quantize"}));
}

}  // namespace
}  // namespace octet
