// The bookkeeping of a releasable buffer's pages (see released_pages.h).
#include "released_pages.h"

#include <algorithm>

#include "octet/check.h"

namespace octet {

namespace {

// Page p onto the last run where it follows it, else as a run of its own.
void extend(std::vector<ReleasedPages::Run>& runs, size_t p) {
  if (!runs.empty() && runs.back().first + runs.back().count == p) {
    ++runs.back().count;
  } else {
    runs.push_back({p, 1});
  }
}

}  // namespace

ReleasedPages::ReleasedPages(size_t bytes, size_t page)
    : bytes_(bytes), page_(page), released_(page == 0 ? 0 : (bytes + page - 1) / page, false) {
  OCTET_CHECK(page > 0, "pages of at least one byte");
}

size_t ReleasedPages::bytes_of(Run run) const {
  const size_t begin = run.first * page_;
  return std::min(bytes_, (run.first + run.count) * page_) - begin;
}

std::vector<ReleasedPages::Run> ReleasedPages::release(size_t offset, size_t bytes) {
  OCTET_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "a range [{}, +{}) within the buffer's {} bytes",
              offset, bytes, bytes_);
  // The first page that begins at or after offset, and the pages that end at or before offset + bytes (the
  // buffer's last page ends at its end).
  const size_t end = offset + bytes;
  const size_t first = (offset + page_ - 1) / page_;
  const size_t last = end == bytes_ ? released_.size() : end / page_;
  std::vector<Run> runs;
  for (size_t p = first; p < last; ++p) {
    if (released_[p]) continue;
    released_[p] = true;
    extend(runs, p);
  }
  for (const Run& run : runs) released_bytes_ += bytes_of(run);
  return runs;
}

std::vector<ReleasedPages::Run> ReleasedPages::restore_all() {
  std::vector<Run> runs;
  for (size_t p = 0; p < released_.size(); ++p) {
    if (!released_[p]) continue;
    released_[p] = false;
    extend(runs, p);
  }
  released_bytes_ = 0;
  return runs;
}

}  // namespace octet
