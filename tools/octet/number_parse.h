// Reading float32 values as the command-line tool accepts them: one token (an option value) or a whole
// whitespace-separated stream (standard input). Parsing never depends on the C locale, rounds decimal text to
// float32 exactly once (correctly), and reports a bad token with its position so that a user can find it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace octet::cli {

// The accepted spellings, for error messages and help text.
inline constexpr const char* kNumberSyntax =
    "a decimal or scientific float32 literal (1.5, -2e-3, +4, .5), inf, -inf, infinity or nan";

// Parses one complete token as float32, or nullopt if the token is not a number.
//
// Accepted: what std::from_chars<float> (general format) accepts, which covers decimal and scientific
// notation, "inf", "infinity" and "nan" (case-insensitive, and "nan(chars)"), plus one optional leading '+'.
// Not accepted: hexadecimal, surrounding whitespace, trailing characters ("1.5x", "1e").
//
// Decimal text is rounded to the nearest float32 (ties to even) directly, never through double. A finite
// token beyond float32's range becomes what strtof gives: +-inf when its magnitude is at least 1 (overflow)
// and +-0 otherwise (underflow), the sign taken from the token. from_chars only says "out of range" there
// without a value, so the direction is read from the token's decimal exponent, which is unambiguous: an
// out-of-range magnitude is either above 3.4e38 or below 1e-45.
std::optional<float> parse_float32(std::string_view token);

// Every value of a whitespace-separated stream (space, tab, newline, carriage return, vertical tab, form
// feed). On the first token that is not a number, throws octet::Error (invalid_input) whose message names
// `source`, the token's 1-based position and line, the token itself (shortened and escaped when needed) and
// the accepted syntax. Nothing is returned partially: the caller prints only once the whole stream parsed.
std::vector<float> parse_float32_stream(std::string_view text, std::string_view source);

// A token as it may be shown in a one-line message (io::printable, which every reader's messages share):
// printable text kept, control characters, backslashes and invalid UTF-8 as \xNN, and long tokens cut to
// their first `max_chars` characters followed by "...".
std::string quote_token(std::string_view token, std::size_t max_chars = 40);

}  // namespace octet::cli
