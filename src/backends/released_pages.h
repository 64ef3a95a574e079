// Which pages of a releasable buffer are given back (Buffer::release): the bookkeeping the CPU's and the
// CUDA backend's releasable buffers share. A buffer of `bytes` is cut into pages of `page` bytes (the last
// one possibly shorter); release marks the held pages that lie wholly inside a byte range as given back and
// says which runs of pages those are, for the buffer to unmap; restore_all marks every page held again and
// says which runs to map back.
#pragma once

#include <cstddef>
#include <vector>

namespace octet {

class ReleasedPages {
 public:
  // Pages [first, first + count).
  struct Run {
    size_t first = 0;
    size_t count = 0;
  };

  ReleasedPages(size_t bytes, size_t page);

  size_t page() const { return page_; }
  size_t pages() const { return released_.size(); }
  // The bytes of pages [first, first + count): the last page may be shorter than the others.
  size_t bytes_of(Run run) const;
  // The held pages wholly inside [offset, offset + bytes), now marked given back, in runs.
  std::vector<Run> release(size_t offset, size_t bytes);
  // Every page given back, now marked held, in runs.
  std::vector<Run> restore_all();
  size_t released_bytes() const { return released_bytes_; }
  bool released(size_t page) const { return released_[page]; }

 private:
  size_t bytes_;
  size_t page_;
  std::vector<bool> released_;
  size_t released_bytes_ = 0;
};

}  // namespace octet
