// Writing float32 values as the command-line tool prints them: the shortest decimal text that reads back as
// exactly the same float32 (std::to_chars), so printed tables and quantized values can be parsed and compared
// bit for bit. Infinities print as inf and -inf, every NaN as nan (its sign and payload carry no meaning in
// octet's output), negative zero as -0.
#pragma once

#include <string>

namespace octet::cli {

// Appends the text of `value` to `out`.
void append_float(std::string& out, float value);

// The text of `value`.
std::string format_float(float value);

}  // namespace octet::cli
