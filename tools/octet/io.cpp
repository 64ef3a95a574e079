// See io.h.
#include "io.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace octet::cli {

std::string read_all(std::FILE* stream, std::string_view name) {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const size_t n = std::fread(buffer, 1, sizeof buffer, stream);
    text.append(buffer, n);
    if (n < sizeof buffer) break;
  }
  if (std::ferror(stream)) {
    throw IoError(fmt::format("reading {} failed: {}", name, std::strerror(errno)));
  }
  return text;
}

void write_all(std::FILE* stream, std::string_view text, std::string_view name) {
  const size_t written = std::fwrite(text.data(), 1, text.size(), stream);
  if (written != text.size() || std::fflush(stream) != 0) {
    throw IoError(fmt::format("writing {} failed: {}", name, std::strerror(errno)));
  }
}

}  // namespace octet::cli
