// `octet fp8 table` against the specification reference (SpecFormat, written from the formula and
// independent of octet's codec): every one of the 256 lines of each format, read back exactly, plus the
// well-known rows a reader would check by hand.
#include <charconv>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "cli_output.h"
#include "octet/numerics/format.h"
#include "process.h"
#include "spec_reference.h"

namespace octet {
namespace {

using testing::SpecClass;
using testing::SpecFormat;

const char* spec_class_name(SpecClass c) {
  switch (c) {
    case SpecClass::zero:
      return "zero";
    case SpecClass::subnormal:
      return "subnormal";
    case SpecClass::normal:
      return "normal";
    case SpecClass::infinity:
      return "inf";
    case SpecClass::nan:
      return "nan";
  }
  return "?";
}

// The table's lines, each split into its three fields.
std::vector<std::vector<std::string>> table_rows(const std::string& format) {
  const testing::ProcessResult r = testing::run_octet({"fp8", "table", "--format", format});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.back(), '\n');
  std::vector<std::vector<std::string>> rows;
  for (const std::string_view line : testing::split_lines(r.out)) {
    std::vector<std::string> fields;
    size_t start = 0;
    while (start <= line.size()) {
      size_t end = line.find(' ', start);
      if (end == std::string_view::npos) end = line.size();
      fields.emplace_back(line.substr(start, end - start));
      start = end + 1;
    }
    rows.push_back(fields);
  }
  return rows;
}

// The parameter is the format's name, so that test names read "e4m3" rather than a byte.
class Fp8Table : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8Table, EveryLineAgreesWithTheSpecReference) {
  const std::optional<Dtype> format = parse_dtype(GetParam());
  ASSERT_TRUE(format.has_value());
  const SpecFormat ref(*format);
  const auto rows = table_rows(GetParam());
  ASSERT_EQ(rows.size(), 256u);
  int nonzero_finite = 0;
  for (uint32_t code = 0; code < 256; ++code) {
    const auto& row = rows[code];
    ASSERT_EQ(row.size(), 3u) << "line " << code + 1;
    EXPECT_EQ(testing::parse_hex_code(row[0]), static_cast<uint8_t>(code)) << row[0];
    const std::optional<float> value = testing::parse_printed_float(row[1]);
    ASSERT_TRUE(value.has_value()) << "code " << row[0] << ": value '" << row[1] << "'";
    const double want = ref.value(code);
    if (std::isnan(want)) {
      EXPECT_EQ(row[1], "nan");
    } else {
      // Exact, sign of zero included; every FP8 value is a float32, so the double comparison is exact too.
      EXPECT_EQ(static_cast<double>(*value), want) << "code " << row[0];
      EXPECT_EQ(std::signbit(*value), std::signbit(want)) << "code " << row[0];
      // Shortest: the text is what std::to_chars gives for the value, and it is not longer than needed.
      char buffer[32];
      const auto r = std::to_chars(buffer, buffer + sizeof buffer, *value);
      EXPECT_EQ(row[1], std::string(buffer, r.ptr)) << "code " << row[0];
      if (std::isfinite(want) && want != 0.0) ++nonzero_finite;
    }
    EXPECT_EQ(row[2], spec_class_name(ref.classify(code))) << "code " << row[0];
  }
  EXPECT_GT(nonzero_finite, 200);  // the table is not all zeros or specials
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Table, ::testing::Values("e4m3", "e5m2"),
                         [](const auto& p) { return std::string(p.param); });

std::string line_of(const std::vector<std::vector<std::string>>& rows, uint32_t code) {
  const auto& r = rows.at(code);
  return r.at(0) + " " + r.at(1) + " " + r.at(2);
}

TEST(Fp8TableRows, WellKnownE4m3Rows) {
  const auto rows = table_rows("e4m3");
  ASSERT_EQ(rows.size(), 256u);
  EXPECT_EQ(line_of(rows, 0x00), "0x00 0 zero");
  EXPECT_EQ(line_of(rows, 0x01), "0x01 0.001953125 subnormal");  // 2^-9, the smallest subnormal
  EXPECT_EQ(line_of(rows, 0x08), "0x08 0.015625 normal");        // 2^-6, the smallest normal
  EXPECT_EQ(line_of(rows, 0x38), "0x38 1 normal");
  EXPECT_EQ(line_of(rows, 0x7e), "0x7e 448 normal");  // the largest finite
  EXPECT_EQ(line_of(rows, 0x7f), "0x7f nan nan");     // S.1111.111 is the only NaN: no infinities
  EXPECT_EQ(line_of(rows, 0x78), "0x78 256 normal");  // exponent all ones is still finite in E4M3FN
  EXPECT_EQ(line_of(rows, 0x80), "0x80 -0 zero");
  EXPECT_EQ(line_of(rows, 0xfe), "0xfe -448 normal");
  EXPECT_EQ(line_of(rows, 0xff), "0xff nan nan");
}

TEST(Fp8TableRows, WellKnownE5m2Rows) {
  const auto rows = table_rows("e5m2");
  ASSERT_EQ(rows.size(), 256u);
  EXPECT_EQ(line_of(rows, 0x01), "0x01 1.5258789e-05 subnormal");  // 2^-16
  EXPECT_EQ(line_of(rows, 0x04), "0x04 6.1035156e-05 normal");     // 2^-14
  EXPECT_EQ(line_of(rows, 0x3c), "0x3c 1 normal");
  EXPECT_EQ(line_of(rows, 0x7b), "0x7b 57344 normal");
  EXPECT_EQ(line_of(rows, 0x7c), "0x7c inf inf");
  EXPECT_EQ(line_of(rows, 0x7d), "0x7d nan nan");
  EXPECT_EQ(line_of(rows, 0x80), "0x80 -0 zero");
  EXPECT_EQ(line_of(rows, 0xfc), "0xfc -inf inf");
}

}  // namespace
}  // namespace octet
