// `octet fp8 quantize` on small inputs whose answers are known by hand: the accepted spellings, values
// beyond float32's range (read as strtof reads them), the summary and its note, and empty input.
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "cli_output.h"
#include "process.h"

namespace octet {
namespace {

using testing::run_octet;

TEST(Fp8Quantize, AcceptedSpellingsAndOutOfRangeTokens) {
  // Token:               value read          e4m3 code, value
  // +1.5                 1.5                 0x3c 1.5
  // 1E3                  1000                0x7e 448   (saturated)
  // infinity / +inf      inf                 0x7e 448   (saturated)
  // -Infinity            -inf                0xfe -448  (saturated)
  // NAN                  nan                 0x7f nan
  // 1e39 / -1e39         beyond float32: +-inf, saturated
  // 1e-50 / -1e-50       below float32: +-0 (not an underflow of the cast: the input already is 0)
  // 0.1                  0.1f                0x1d 0.1015625
  // 1e-45                the smallest float32 subnormal: underflows to 0x00
  // 00.50                0.5                 0x30 0.5
  const std::string input =
      "+1.5 1E3\tinfinity\n+inf -Infinity NAN\r\n1e39 -1e39 1e-50 -1e-50 0.1 1e-45 00.50\n";
  const testing::ProcessResult r = run_octet({"fp8", "quantize", "--format", "e4m3"}, input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "0x3c 1.5\n0x7e 448\n0x7e 448\n0x7e 448\n0xfe -448\n0x7f nan\n0x7e 448\n0xfe -448\n0x00 0\n"
            "0x80 -0\n0x1d 0.1015625\n0x00 0\n0x30 0.5\n");
  EXPECT_EQ(r.err,
            "summary: values=13 format=e4m3 recipe=none scale=1 scale_inv=1 amax=nan saturated=6 underflow=1 "
            "nan=1\n");
}

TEST(Fp8Quantize, NonSaturatingE5m2KeepsInfinities) {
  // The top binade's step is 2^13 = 8192, so the midpoint between 57344 and the next value of an unbounded
  // range is 61440: 62000 overflows, 60000 and -58000 round to +-57344.
  const testing::ProcessResult r =
      run_octet({"fp8", "quantize", "--format", "e5m2", "--no-saturate"}, "inf -1e39 62000 60000 -58000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0x7c inf\n0xfc -inf\n0x7c inf\n0x7b 57344\n0xfb -57344\n");
  std::map<std::string, std::string> summary;
  ASSERT_TRUE(testing::parse_summary(r.err, summary));
  EXPECT_EQ(summary["saturated"], "3");
}

TEST(Fp8Quantize, NonSaturatingE4m3OverflowsToNan) {
  const testing::ProcessResult r =
      run_octet({"fp8", "quantize", "--format", "e4m3", "--no-saturate"}, "500 -inf 464 465");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 464 is the tie between 448 (even mantissa) and the first value past the range: it stays 448.
  // An overflow keeps its sign in the NaN pattern (0xff for -inf), as CUDA's __NV_NOSAT and PyTorch write it.
  EXPECT_EQ(r.out, "0x7f nan\n0xff nan\n0x7e 448\n0x7f nan\n");
}

TEST(Fp8Quantize, ScaleMultipliesAndScaleInvDequantizes) {
  // 3 * 4 = 12 exactly; dequantized 12 * 0.25 = 3. 0.3 * 4 = 1.2 rounds to 1.25, which stands for 0.3125.
  const testing::ProcessResult r =
      run_octet({"fp8", "quantize", "--format", "e4m3", "--scale", "4"}, "3 0.3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0x54 3\n0x3a 0.3125\n");
  EXPECT_NE(r.err.find("scale=4 scale_inv=0.25 amax=3 "), std::string::npos) << r.err;
}

TEST(Fp8Quantize, CurrentRecipeMapsAmaxToTheLargestFiniteValue) {
  const testing::ProcessResult r =
      run_octet({"fp8", "quantize", "--format", "e4m3", "--recipe", "current"}, "-7 3.5 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // scale = 448 / 7 = 64: -7 -> -448, 3.5 -> 224; dequantized with 1/64.
  EXPECT_EQ(r.out, "0xfe -7\n0x76 3.5\n0x00 0\n");
  EXPECT_EQ(r.err,
            "summary: values=3 format=e4m3 recipe=current scale=64 scale_inv=0.015625 amax=7 saturated=0 "
            "underflow=0 nan=0\n");
}

TEST(Fp8Quantize, CurrentRecipeSaysWhenAmaxGivesNoScale) {
  for (const char* input : {"0 -0", "1 inf", "nan 2"}) {
    const testing::ProcessResult r =
        run_octet({"fp8", "quantize", "--format", "e5m2", "--recipe", "current"}, input);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto lines = testing::split_lines(r.err);
    ASSERT_EQ(lines.size(), 2u) << r.err;
    EXPECT_TRUE(lines[0].starts_with("octet fp8 quantize: note: amax is ")) << r.err;
    EXPECT_NE(lines[1].find(" scale=1 scale_inv=1 "), std::string::npos) << r.err;
  }
}

TEST(Fp8Quantize, EmptyInputPrintsNothingAndSucceeds) {
  for (const char* input : {"", " \n\t\r\n"}) {
    const testing::ProcessResult r =
        run_octet({"fp8", "quantize", "--format", "e4m3", "--scale", "2"}, input);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(
        r.err,
        "summary: values=0 format=e4m3 recipe=none scale=2 scale_inv=0.5 amax=0 saturated=0 underflow=0 "
        "nan=0\n");
  }
}

TEST(Fp8Quantize, ScaleAcceptsTheSameSpellingsAsInput) {
  for (const char* scale : {"+2", "2.0", "2e0", "0.2e1"}) {
    const testing::ProcessResult r =
        run_octet({"fp8", "quantize", "--format", "e4m3", "--scale", scale}, "1");
    EXPECT_EQ(r.exit_code, 0) << scale << ": " << r.err;
    EXPECT_EQ(r.out, "0x40 1\n") << scale;
  }
}

}  // namespace
}  // namespace octet
