// See number_parse.h.
#include "number_parse.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <system_error>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/io/input.h"

namespace octet::cli {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// For a finite decimal token that from_chars found out of float32's range: whether its magnitude is at least
// 1 (so it overflowed) rather than below 1 (so it underflowed). `digits` is the token without its sign and
// is known to be well formed: digits, an optional '.', digits, then optionally e/E, a sign and digits.
bool magnitude_at_least_one(std::string_view digits) {
  // Decimal exponent of the leading non-zero digit, from its place relative to the decimal point.
  int64_t leading_exponent = 0;
  bool found = false;
  int64_t integer_digits_after = -1;  // integer digits after the leading non-zero one
  int64_t fraction_index = 0;
  bool in_fraction = false;
  size_t i = 0;
  for (; i < digits.size() && (is_digit(digits[i]) || digits[i] == '.'); ++i) {
    const char c = digits[i];
    if (c == '.') {
      in_fraction = true;
      continue;
    }
    if (in_fraction) {
      ++fraction_index;
      if (!found && c != '0') {
        found = true;
        leading_exponent = -fraction_index;
      }
    } else if (found) {
      ++integer_digits_after;
    } else if (c != '0') {
      found = true;
      integer_digits_after = 0;
    }
  }
  if (!found) return false;  // all zeros cannot be out of range; treat as underflow to be safe
  if (integer_digits_after >= 0) leading_exponent = integer_digits_after;

  // The explicit exponent, saturated: anything beyond a few thousand decides the direction already.
  int64_t exponent = 0;
  if (i < digits.size() && (digits[i] == 'e' || digits[i] == 'E')) {
    ++i;
    bool negative = false;
    if (i < digits.size() && (digits[i] == '+' || digits[i] == '-')) negative = digits[i++] == '-';
    constexpr int64_t kSaturated = int64_t{1} << 40;
    for (; i < digits.size() && is_digit(digits[i]); ++i) {
      if (exponent < kSaturated) exponent = exponent * 10 + (digits[i] - '0');
    }
    if (negative) exponent = -exponent;
  }
  // Saturating the integer places too keeps the sum from overflowing for absurdly long tokens.
  constexpr int64_t kPlacesCap = int64_t{1} << 41;
  if (leading_exponent > kPlacesCap) leading_exponent = kPlacesCap;
  if (leading_exponent < -kPlacesCap) leading_exponent = -kPlacesCap;
  return leading_exponent + exponent >= 0;
}

}  // namespace

std::optional<float> parse_float32(std::string_view token) {
  // from_chars takes '-' but not '+'; a '+' may lead, but not lead another sign ("+-1", "++1").
  if (!token.empty() && token.front() == '+') {
    token.remove_prefix(1);
    if (token.empty() || token.front() == '+' || token.front() == '-') return std::nullopt;
  }
  if (token.empty()) return std::nullopt;
  float value = 0.0f;
  const char* const end = token.data() + token.size();
  const std::from_chars_result r = std::from_chars(token.data(), end, value, std::chars_format::general);
  if (r.ptr != end) return std::nullopt;  // trailing characters, or nothing a number could start with
  if (r.ec == std::errc{}) return value;
  if (r.ec != std::errc::result_out_of_range) return std::nullopt;
  const bool negative = token.front() == '-';
  const std::string_view unsigned_part = negative ? token.substr(1) : token;
  const float magnitude =
      magnitude_at_least_one(unsigned_part) ? std::numeric_limits<float>::infinity() : 0.0f;
  return negative ? -magnitude : magnitude;
}

std::vector<float> parse_float32_stream(std::string_view text, std::string_view source) {
  std::vector<float> values;
  // A rough guess of the count (shortest tokens are one character and a separator) avoids most regrowth
  // without overcommitting for long ones.
  values.reserve(text.size() / 8);
  size_t i = 0;
  int64_t line = 1;
  while (i < text.size()) {
    if (is_space(text[i])) {
      if (text[i] == '\n') ++line;
      ++i;
      continue;
    }
    const size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    const std::string_view token = text.substr(start, i - start);
    const std::optional<float> value = parse_float32(token);
    if (!value) {
      throw Error(ErrorKind::invalid_input,
                  fmt::format("{} token {} (line {}) '{}' is not a number; expected {}", source,
                              values.size() + 1, line, quote_token(token), kNumberSyntax));
    }
    values.push_back(*value);
  }
  return values;
}

std::string quote_token(std::string_view token, std::size_t max_chars) {
  return io::printable(token, max_chars);
}

}  // namespace octet::cli
