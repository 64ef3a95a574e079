// Invalid runs of `octet`: each must exit with 2, leave standard output empty (even when the bad token
// follows thousands of good ones) and write exactly one non-empty line on standard error that says what was
// wrong, where, and what is valid.
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "cli_output.h"
#include "process.h"

namespace octet {
namespace {

using testing::ProcessResult;
using testing::run_octet;

// The contract of every invalid run; `mentions` are texts the one error line must contain.
::testing::AssertionResult is_usage_error(const ProcessResult& r, const std::vector<std::string>& mentions) {
  if (r.exit_code != 2)
    return ::testing::AssertionFailure() << "exit code " << r.exit_code << ", stderr: " << r.err;
  if (!r.out.empty())
    return ::testing::AssertionFailure() << "standard output not empty: " << r.out.substr(0, 200);
  const std::vector<std::string_view> lines = testing::split_lines(r.err);
  if (lines.size() != 1 || r.err.back() != '\n' || lines[0].empty()) {
    return ::testing::AssertionFailure() << "standard error is not one line: '" << r.err << "'";
  }
  for (const std::string& m : mentions) {
    if (r.err.find(m) == std::string::npos) {
      return ::testing::AssertionFailure() << "the error line does not mention '" << m << "': " << r.err;
    }
  }
  return ::testing::AssertionSuccess() << r.err;
}

// Ten thousand good values, so that the bad token arrives long after output could have started.
std::string good_values() {
  std::string text;
  for (int i = 0; i < 10000; ++i) text += std::to_string(i % 300) + ".25\n";
  return text;
}

const char* const kBadTokens[] = {"1.5x",  "abc", "1e", "--1", "+-1", "++1",     "0x10",  "1,5",  "nan(",
                                  "1.2.3", "-",   "+",  ".",   "e5",  "infinit", "1e5e5", "inf1", "1_000"};

TEST(CliErrors, ANonNumberTokenIsReportedWithItsPositionAndNothingIsPrinted) {
  const std::string good = good_values();
  for (const char* token : kBadTokens) {
    SCOPED_TRACE(token);
    // Last of many.
    ProcessResult r = run_octet({"fp8", "quantize", "--format", "e4m3"}, good + token + "\n");
    EXPECT_TRUE(is_usage_error(r, {"octet fp8 quantize: error:", "token 10001 ", "line 10001",
                                   std::string("'") + token + "'", "not a number", "inf", "nan"}));
    // First, and in the middle of a line.
    r = run_octet({"fp8", "quantize", "--format", "e5m2", "--scale", "2"}, std::string(token) + " 1 2");
    EXPECT_TRUE(is_usage_error(r, {"token 1 ", "line 1)", std::string("'") + token + "'"}));
  }
}

TEST(CliErrors, UnprintableAndLongTokensStayOnOneReadableLine) {
  ProcessResult r = run_octet({"fp8", "quantize", "--format", "e4m3"}, std::string("1 2 \x01\x1b[0m\\ 3"));
  EXPECT_TRUE(is_usage_error(r, {"token 3 ", "'\\x01\\x1b[0m\\x5c'"}));
  r = run_octet({"fp8", "quantize", "--format", "e4m3"}, "1\n\n" + std::string(5000, '7') + "x");
  EXPECT_TRUE(is_usage_error(r, {"token 2 (line 3)", "'" + std::string(40, '7') + "...'"}));
}

TEST(CliErrors, UnknownFormat) {
  for (const char* format : {"e3m4", "E4M3", "e8m0", "bf16", "fp8", ""}) {
    SCOPED_TRACE(format);
    ProcessResult r = run_octet({"fp8", "table", "--format", format});
    EXPECT_TRUE(is_usage_error(
        r, {"octet fp8 table: error:", "--format", std::string("'") + format + "'", "e4m3, e5m2"}));
    r = run_octet({"fp8", "quantize", "--format", format}, "1 2 3");
    EXPECT_TRUE(is_usage_error(r, {"octet fp8 quantize: error:", "--format", "e4m3, e5m2"}));
  }
}

TEST(CliErrors, UnknownRecipe) {
  for (const char* recipe : {"delayed", "Current", "static", ""}) {
    SCOPED_TRACE(recipe);
    const ProcessResult r = run_octet({"fp8", "quantize", "--format", "e4m3", "--recipe", recipe}, "1 2 3");
    EXPECT_TRUE(is_usage_error(r, {"--recipe", std::string("'") + recipe + "'", "valid recipes: current"}));
  }
}

TEST(CliErrors, ScaleMustBeAPositiveFiniteNumber) {
  for (const char* scale :
       {"0", "-0", "-1", "inf", "nan", "abc", "1e-50", "1e-39", "1e39", "", "2x", "0x2"}) {
    SCOPED_TRACE(scale);
    const ProcessResult r = run_octet({"fp8", "quantize", "--format", "e5m2", "--scale", scale}, "1 2 3");
    EXPECT_TRUE(is_usage_error(r, {"--scale", std::string("'") + scale + "'", "positive finite"}));
  }
}

TEST(CliErrors, ScaleAndRecipeExcludeEachOther) {
  const ProcessResult r =
      run_octet({"fp8", "quantize", "--format", "e4m3", "--scale", "2", "--recipe", "current"}, "1 2 3");
  EXPECT_TRUE(is_usage_error(r, {"--scale and --recipe cannot be used together"}));
}

TEST(CliErrors, CommandLineParseErrorsExitWithTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"fp8", "table"}, "--format is required"},
      {{"fp8", "quantize"}, "--format is required"},
      {{"fp8", "quantize", "--format"}, "--format"},
      {{"fp8", "quantize", "--format", "e4m3", "--scale"}, "--scale"},
      {{"fp8", "quantize", "--format", "e4m3", "--bogus"}, "--bogus"},
      {{"fp8", "table", "--format", "e4m3", "extra"}, "extra"},
      {{"fp8", "table", "--format", "e4m3", "--no-saturate"}, "--no-saturate"},
      {{"fp8", "table", "--format", "e4m3", "--format", "e5m2"}, "--format"},
      {{"fp9"}, "fp9"},
      {{"--bogus"}, "--bogus"},
      {{"fp8", "--version"}, "--version"},
  };
  for (const auto& [args, mention] : cases) {
    std::string joined;
    for (const std::string& a : args) joined += a + " ";
    SCOPED_TRACE(joined);
    const ProcessResult r = run_octet(args, "1 2 3");
    EXPECT_TRUE(is_usage_error(r, {mention, "error:", "--help"}));
  }
}

}  // namespace
}  // namespace octet

namespace octet {
namespace {

// A fatal signal is an internal error: octet names the signal and the command on standard error, prints the
// call stack with the binary's offsets, and dies of the same signal (exit status 128 + 11 in a shell).
// octet waits on its standard input here (a FIFO held open by the shell), so that the signal finds it
// running.
TEST(CliErrors, AFatalSignalPrintsACrashReportAndDiesOfThatSignal) {
  const testing::TempFile err;
  const std::string fifo = err.path() + ".fifo";
  const std::string script = std::string("mkfifo \"$1\" && { '") + OCTET_BINARY +
                             "' fp8 quantize --format e4m3 < \"$1\" 2> \"$0\" & pid=$!; exec 3> \"$1\"; sleep 1; "
                             "kill -SEGV $pid; wait $pid; echo $?; rm -f \"$1\"; }";
  const ProcessResult r = testing::run_process({"/bin/sh", "-c", script, err.path(), fifo}, "/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "139\n");
  const std::string report = testing::read_file(err.path());
  EXPECT_NE(report.find("octet: internal error: SIGSEGV (segmentation fault) in `"), std::string::npos) << report;
  EXPECT_NE(report.find("fp8 quantize --format e4m3`"), std::string::npos) << report;
  EXPECT_NE(report.find("octet(+0x"), std::string::npos) << report;  // frames as module and offset
}

}  // namespace
}  // namespace octet
