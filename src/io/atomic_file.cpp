// See atomic_file.h.
#include "octet/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::io {

void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : ".";
  std::string temporary = (directory / fmt::format(".{}.XXXXXX", path.filename().string())).string();
  const int fd = ::mkstemp(temporary.data());
  OCTET_REQUIRE(fd >= 0, "cannot create a temporary file next to {}: {}", path.string(),
                std::strerror(errno));
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const bool ok = written == contents.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!ok || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = ok ? errno : saved_errno;
    ::unlink(temporary.c_str());
    OCTET_REQUIRE(false, "cannot write {}: {}", path.string(), std::strerror(error));
  }
  // Flush the directory entry too, so that the rename survives a crash; a failure here loses no data.
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (directory_fd >= 0) {
    ::fsync(directory_fd);
    ::close(directory_fd);
  }
}

}  // namespace octet::io
