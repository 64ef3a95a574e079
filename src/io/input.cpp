// See input.h.
#include "octet/io/input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::io {
namespace {

// The length of the well-formed UTF-8 sequence at text[pos], or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(text[i])); };
  const uint32_t lead = byte(pos);
  uint32_t code_point = 0, minimum = 0;
  size_t length = 0;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    code_point = lead & 0x1F, length = 2, minimum = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    code_point = lead & 0x0F, length = 3, minimum = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    code_point = lead & 0x07, length = 4, minimum = 0x10000;
  } else {
    return 0;
  }
  if (pos + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    const uint32_t continuation = byte(pos + i);
    if ((continuation & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (continuation & 0x3F);
  }
  const bool valid =
      code_point >= minimum && code_point <= 0x10FFFF && !(code_point >= 0xD800 && code_point <= 0xDFFF);
  return valid ? length : 0;
}

}  // namespace

int open_regular_file(const std::filesystem::path& path, std::string_view what, int64_t& size) {
  const std::string name = path.string();
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  OCTET_REQUIRE(fd >= 0, "{} {}: cannot open: {}", what, printable(name, 200), std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    OCTET_REQUIRE(false, "{} {}: cannot stat: {}", what, printable(name, 200), std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    OCTET_REQUIRE(false, "{} {}: {}, not a regular file", what, printable(name, 200),
                  S_ISDIR(info.st_mode)    ? "is a directory"
                  : S_ISFIFO(info.st_mode) ? "is a FIFO"
                                           : "is a device or socket");
  }
  // Back to blocking reads: a regular file never blocks, and some file systems dislike O_NONBLOCK.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  size = info.st_size;
  return fd;
}

std::string read_regular_file(const std::filesystem::path& path, std::string_view what, int64_t max_bytes) {
  int64_t size = 0;
  const int fd = open_regular_file(path, what, size);
  if (size > max_bytes) {
    ::close(fd);
    OCTET_REQUIRE(false, "{} {} is {} bytes, more than the {} a valid one can have", what,
                  printable(path.string(), 200), size, max_bytes);
  }
  std::string text(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the file shrank while being read: what was read is all there is
    done += static_cast<size_t>(n);
  }
  const int error = errno;
  ::close(fd);
  OCTET_REQUIRE(done == text.size(), "{} {}: cannot read: {}", what, printable(path.string(), 200),
                done < text.size() ? std::strerror(error) : "");
  return text;
}

int64_t json_nesting_depth(std::string_view text, int64_t limit) {
  int64_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

size_t first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence_length(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::string_view::npos;
}

std::string printable(std::string_view text, size_t max_chars) {
  std::string out;
  size_t shown = 0, i = 0;
  for (; i < text.size() && shown < max_chars; ++shown) {
    const auto u = static_cast<unsigned char>(text[i]);
    const size_t length = utf8_sequence_length(text, i);
    if (u >= 0x20 && u < 0x7F && u != '\\') {
      out.push_back(static_cast<char>(u));
      ++i;
    } else if (length > 1) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += fmt::format("\\x{:02x}", u);
      ++i;
    }
  }
  if (i < text.size()) out += "...";
  return out;
}

}  // namespace octet::io
