// Gradient sums started while the backward goes on (see overlapped_sums.h).
#include "overlapped_sums.h"

#include <algorithm>
#include <span>

#include "octet/check.h"

namespace octet {

OverlappedSums::OverlappedSums(dist::Communicator& communicator, float* grads, int64_t count, void* stream,
                               int64_t bucket, dist::GradientReduceType type, int64_t shard_total,
                               TokenRowSums* rows)
    : communicator_(communicator),
      grads_(grads),
      count_(count),
      stream_(stream),
      bucket_(bucket),
      type_(type),
      shard_total_(shard_total),
      rows_(rows) {
  OCTET_CHECK(count >= 0 && bucket >= 1, "{} gradients in buckets of {}", count, bucket);
  OCTET_CHECK(shard_total == 0 || shard_total >= count, "{} gradients in shards of {} elements", count,
              shard_total);
  OCTET_CHECK(rows == nullptr || (shard_total == 0 && rows->end() <= count),
              "the sums of a token-indexed gradient's rows: all-reduced, inside the {} gradients", count);
}

void OverlappedSums::ready(int64_t begin, int64_t end) {
  OCTET_CHECK(0 <= begin && begin <= end && end <= count_, "gradients [{}, {}) of {}", begin, end, count_);
  if (begin == end) return;
  if (pending_begin_ == pending_end_) {
    pending_begin_ = begin;
    pending_end_ = end;
  } else if (end == pending_begin_) {  // the backward runs from the last parameters to the first
    pending_begin_ = begin;
  } else if (begin == pending_end_) {
    pending_end_ = end;
  } else {
    flush();
    pending_begin_ = begin;
    pending_end_ = end;
  }
  if (pending_end_ - pending_begin_ >= bucket_) flush();
}

void OverlappedSums::flush() {
  if (pending_begin_ == pending_end_) return;
  start(pending_begin_, pending_end_);
  pending_begin_ = pending_end_ = 0;
}

void OverlappedSums::start(int64_t begin, int64_t end) {
  started_.emplace_back(begin, end);
  // A bucket that holds the whole token-indexed gradient: its rows through rows_, the rest as ever. (The
  // model reports that gradient in one run; a bucket holding part of it sums that part whole.)
  if (rows_ != nullptr && rows_->sparse() && begin <= rows_->begin() && rows_->end() <= end) {
    start_dense(begin, rows_->begin());
    rows_->start(communicator_, grads_, stream_, type_);
    start_dense(rows_->end(), end);
    return;
  }
  start_dense(begin, end);
}

void OverlappedSums::start_dense(int64_t begin, int64_t end) {
  if (begin == end) return;
  const std::span<float> values(grads_ + begin, static_cast<size_t>(end - begin));
  const bool bf16 = type_ == dist::GradientReduceType::bf16;
  if (shard_total_ > 0 && bf16) {
    communicator_.start_reduce_scatter_sum_bf16(values, begin, shard_total_, stream_);
  } else if (shard_total_ > 0) {
    communicator_.start_reduce_scatter_sum(values, begin, shard_total_, stream_);
  } else if (bf16) {
    communicator_.start_all_reduce_sum_bf16(values, stream_);
  } else {
    communicator_.start_all_reduce_sum(values, stream_);
  }
}

void OverlappedSums::finish() {
  flush();
  // What no report covered, in order: the same on every rank.
  std::vector<std::pair<int64_t, int64_t>> done = started_;
  std::sort(done.begin(), done.end());
  int64_t at = 0;
  for (const auto& [begin, end] : done) {
    OCTET_CHECK(begin >= at, "gradient runs overlap at {}", begin);
    if (begin > at) start(at, begin);
    at = end;
  }
  if (at < count_) start(at, count_);
  communicator_.finish_started();
  if (rows_ != nullptr) rows_->finish(grads_);
  started_.clear();
}

}  // namespace octet
