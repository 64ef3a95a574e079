// See number_format.h.
#include "number_format.h"

#include <charconv>
#include <cmath>

namespace octet::cli {

void append_float(std::string& out, float value) {
  if (std::isnan(value)) {
    out += "nan";  // to_chars writes "-nan" for a NaN with the sign bit set
    return;
  }
  char buffer[32];  // the longest shortest form of a float32 is 15 characters ("-1.17549435e-38")
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, r.ptr);
}

std::string format_float(float value) {
  std::string out;
  append_float(out, value);
  return out;
}

}  // namespace octet::cli
