// Where OCTET_CHECK and OCTET_REQUIRE throw from.
#include "octet/check.h"

#include <cstring>

namespace octet {

void throw_error(ErrorKind kind, const char* file, int line, const std::string& message) {
  if (kind != ErrorKind::internal) throw Error(kind, message);
  const char* base = std::strrchr(file, '/');
  throw Error(kind, fmt::format("{} ({}:{})", message, base ? base + 1 : file, line));
}

}  // namespace octet
