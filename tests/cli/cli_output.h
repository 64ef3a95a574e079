// Reading back what `octet` prints, strictly: a code must be "0x" and two lowercase hex digits, a value the
// whole text of a float32 with NaN spelled exactly "nan". Anything else fails the test that reads it, so a
// formatting change cannot slip through a lenient parser.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace octet::testing {

// The lines of `text` without their '\n'; text must end with '\n' unless it is empty.
std::vector<std::string_view> split_lines(std::string_view text);

// "0x00" .. "0xff".
std::optional<uint8_t> parse_hex_code(std::string_view text);

// A float32 as octet prints it: "nan", "inf", "-inf", "-0" or a decimal/scientific number, parsed exactly.
std::optional<float> parse_printed_float(std::string_view text);

// Bitwise equal (so 0 and -0 differ), or both NaN.
bool same_float(float a, float b);

// Lines of `octet fp8 quantize` standard output: "0xHH VALUE".
struct QuantizeOutput {
  std::vector<uint8_t> codes;
  std::vector<float> values;
};
::testing::AssertionResult parse_quantize_output(std::string_view text, QuantizeOutput& out);

// The key=value fields of the line of standard error that starts with "summary: ".
::testing::AssertionResult parse_summary(std::string_view err, std::map<std::string, std::string>& fields);

}  // namespace octet::testing
