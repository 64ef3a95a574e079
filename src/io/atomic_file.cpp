// See atomic_file.h.
#include "octet/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::io {

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  OCTET_REQUIRE(fd >= 0, "cannot open directory {}: {}", dir.string(), std::strerror(errno));
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  OCTET_REQUIRE(synced, "cannot flush directory {} to disk: {}", dir.string(), std::strerror(errno));
}

void write_file_atomically(const std::filesystem::path& path, std::string_view contents) {
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : ".";
  // Not mkstemp, which makes the file 0600: created with 0666, the file gets the mode any other new file
  // would (0666 minus the umask). O_EXCL and a name no other writer picks keep the temporary this writer's.
  static std::atomic<uint64_t> counter{0};
  std::string temporary;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    temporary = (directory / fmt::format(".{}.{}.{}.{}", path.filename().string(), ::getpid(),
                                         counter.fetch_add(1), std::random_device()() % 1000000))
                    .string();
    fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
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
