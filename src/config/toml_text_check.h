// One pass over TOML text before toml++ parses it. Deeply nested TOML (a.a.a... keys or [[[... arrays hundreds
// of thousands deep) would exhaust the stack of the recursive parser and of the tables' destructors; octet's
// keys are section.key and its values are flat, so anything nested deeper than a valid configuration could be
// is refused first. toml++ 3.3 also assumes (TOML_ASSUME, undefined behaviour when false) that a table
// header's brackets are followed by a key, and reaches __builtin_unreachable when it tests some non-ASCII
// characters for whitespace: such text must not reach it either. The scan tracks just enough of TOML's syntax
// (strings, comments, key or value position) to count the parts of each key and the depth of arrays and
// inline tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace octet {

// Throws octet::Error (invalid_input), "ORIGIN:LINE: what", for a key of more than 8 parts, arrays or inline
// tables nested more than 16 deep, or a table header that names no table. Returns the line of the first byte
// outside strings and comments that is not ASCII (TOML's grammar allows none there), or 0.
int64_t check_toml_text(std::string_view text, const std::string& origin);

}  // namespace octet
