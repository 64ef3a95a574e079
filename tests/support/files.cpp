// See files.h.
#include "files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

namespace octet::testing {

namespace fs = std::filesystem;

std::map<std::string, std::string> directory_snapshot(const fs::path& dir) {
  std::map<std::string, std::string> entries;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0) {
      entries[fs::relative(e.path(), dir).string()] = "vanished";
      continue;
    }
    std::string contents;
    if (S_ISREG(st.st_mode)) {
      std::ifstream in(e.path(), std::ios::binary);
      contents.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    std::ostringstream s;
    s << st.st_mode << ' ' << st.st_size << ' ' << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec << ' '
      << std::hash<std::string>()(contents);
    entries[fs::relative(e.path(), dir).string()] = s.str();
  }
  return entries;
}

FifoWithLateWriter::FifoWithLateWriter(fs::path path, std::chrono::seconds delay) : path_(std::move(path)) {
  if (::mkfifo(path_.c_str(), 0600) != 0) throw std::runtime_error("cannot make a FIFO at " + path_.string());
  writer_ = std::thread([fifo = path_, delay] {
    std::this_thread::sleep_for(delay);
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // wakes a reader blocked in open
    if (fd >= 0) ::close(fd);
  });
}

FifoWithLateWriter::~FifoWithLateWriter() {
  writer_.join();
  std::error_code ec;
  fs::remove(path_, ec);
}

}  // namespace octet::testing
