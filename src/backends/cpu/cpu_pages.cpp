// The CPU backend's releasable buffers (Backend::allocate_releasable): host pages mapped for the buffer
// alone, so that pages given back (Buffer::release) return to the system and any touch of them before
// restore() is a fault rather than a silent read of stale values.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "../released_pages.h"
#include "cpu_backend.h"
#include "octet/check.h"

namespace octet::cpu {

namespace {

size_t host_page() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
}

class HostPagesBuffer final : public Buffer {
 public:
  explicit HostPagesBuffer(size_t bytes) : bytes_(bytes), pages_(bytes, host_page()) {
    // At least one page, so that the pointer is unique; anonymous pages read as zero.
    mapped_ = std::max<size_t>(pages_.pages(), 1) * pages_.page();
    data_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data_ == MAP_FAILED) throw std::bad_alloc();
  }
  ~HostPagesBuffer() override { munmap(data_, mapped_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

  size_t release(size_t offset, size_t bytes) override {
    size_t freed = 0;
    for (const ReleasedPages::Run& run : pages_.release(offset, bytes)) {
      void* at = static_cast<std::byte*>(data_) + run.first * pages_.page();
      const size_t n = run.count * pages_.page();
      OCTET_CHECK(madvise(at, n, MADV_DONTNEED) == 0 && mprotect(at, n, PROT_NONE) == 0,
                  "giving back {} host pages: {}", run.count, std::strerror(errno));
      freed += pages_.bytes_of(run);
    }
    return freed;
  }
  void restore() override {
    for (const ReleasedPages::Run& run : pages_.restore_all()) {
      void* at = static_cast<std::byte*>(data_) + run.first * pages_.page();
      OCTET_CHECK(mprotect(at, run.count * pages_.page(), PROT_READ | PROT_WRITE) == 0,
                  "mapping back {} host pages: {}", run.count, std::strerror(errno));
    }
  }
  size_t released_bytes() const override { return pages_.released_bytes(); }
  bool releasable() const override { return true; }

 private:
  size_t bytes_;
  ReleasedPages pages_;
  size_t mapped_ = 0;
  void* data_ = nullptr;
};

}  // namespace

std::unique_ptr<Buffer> CpuBackend::allocate_releasable(size_t bytes) {
  return std::make_unique<HostPagesBuffer>(bytes);
}

}  // namespace octet::cpu
