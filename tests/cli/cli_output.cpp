// See cli_output.h. Written for speed as well as strictness: the agreement tests read a million lines.
#include "cli_output.h"

#include <charconv>
#include <cmath>
#include <cstring>

namespace octet::testing {

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string_view::npos) {
      lines.push_back(text.substr(start));  // unterminated last line: kept, callers check the terminator
      break;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::optional<uint8_t> parse_hex_code(std::string_view text) {
  if (text.size() != 4 || text[0] != '0' || text[1] != 'x') return std::nullopt;
  unsigned value = 0;
  for (const char c : text.substr(2)) {
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<unsigned>(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

std::optional<float> parse_printed_float(std::string_view text) {
  if (text == "nan") return std::nanf("");
  if (text.empty()) return std::nullopt;
  float value = 0.0f;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, value);
  if (r.ec != std::errc{} || r.ptr != end || std::isnan(value)) return std::nullopt;
  return value;
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  return ua == ub;
}

::testing::AssertionResult parse_quantize_output(std::string_view text, QuantizeOutput& out) {
  out.codes.clear();
  out.values.clear();
  if (!text.empty() && text.back() != '\n') {
    return ::testing::AssertionFailure() << "standard output does not end with a newline";
  }
  size_t line_number = 0;
  size_t start = 0;
  while (start < text.size()) {
    ++line_number;
    const size_t end = text.find('\n', start);
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    const size_t space = line.find(' ');
    const std::optional<uint8_t> code =
        space == std::string_view::npos ? std::nullopt : parse_hex_code(line.substr(0, space));
    const std::optional<float> value =
        space == std::string_view::npos ? std::nullopt : parse_printed_float(line.substr(space + 1));
    if (!code || !value) {
      return ::testing::AssertionFailure()
             << "line " << line_number << " is not '0xHH VALUE': '" << line << "'";
    }
    out.codes.push_back(*code);
    out.values.push_back(*value);
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult parse_summary(std::string_view err, std::map<std::string, std::string>& fields) {
  fields.clear();
  for (const std::string_view line : split_lines(err)) {
    if (line.substr(0, 9) != "summary: ") continue;
    size_t start = 9;
    while (start < line.size()) {
      size_t end = line.find(' ', start);
      if (end == std::string_view::npos) end = line.size();
      const std::string_view field = line.substr(start, end - start);
      const size_t eq = field.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        return ::testing::AssertionFailure() << "summary field '" << field << "' is not key=value";
      }
      fields[std::string(field.substr(0, eq))] = std::string(field.substr(eq + 1));
      start = end + 1;
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no 'summary: ' line on standard error: " << err;
}

}  // namespace octet::testing
