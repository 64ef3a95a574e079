// Gradient sums started while the backward goes on (see overlapped_sums.h).
#include "overlapped_sums.h"

#include <algorithm>
#include <span>

#include "octet/check.h"

namespace octet {

std::vector<GradientRun> gradient_runs(const std::vector<ParameterInfo>& parameters, Dtype storage,
                                       dist::GradientReduceType reduce) {
  std::vector<const ParameterInfo*> held;
  for (const ParameterInfo& p : parameters) {
    if (p.grad_type == storage && p.count > 0) held.push_back(&p);
  }
  std::sort(held.begin(), held.end(),
            [](const ParameterInfo* a, const ParameterInfo* b) { return a->grad_offset < b->grad_offset; });
  std::vector<GradientRun> runs;
  for (const ParameterInfo* p : held) {
    const bool bf16 = storage == Dtype::bf16 || p->grad_precision == Dtype::bf16 ||
                      reduce == dist::GradientReduceType::bf16;
    if (!runs.empty()) {
      GradientRun& last = runs.back();
      OCTET_CHECK(p->grad_offset >= last.end, "the gradient of {} overlaps another", p->name);
      if (last.end == p->grad_offset && last.parameter + (last.end - last.begin) == p->offset &&
          last.bf16 == bf16) {
        last.end += p->count;
        continue;
      }
    }
    runs.push_back(
        {.begin = p->grad_offset, .end = p->grad_offset + p->count, .parameter = p->offset, .bf16 = bf16});
  }
  return runs;
}

std::vector<GradientRun> uniform_runs(int64_t count, dist::GradientReduceType reduce) {
  if (count == 0) return {};
  return {{.begin = 0, .end = count, .parameter = 0, .bf16 = reduce == dist::GradientReduceType::bf16}};
}

OverlappedSums::OverlappedSums(dist::Communicator& communicator, void* grads, Dtype storage,
                               std::vector<GradientRun> runs, void* stream, int64_t bucket,
                               int64_t shard_total, TokenRowSums* rows)
    : communicator_(communicator),
      grads_(grads),
      storage_(storage),
      runs_(std::move(runs)),
      count_(runs_.empty() ? 0 : runs_.back().end),
      stream_(stream),
      bucket_(bucket),
      shard_total_(shard_total),
      rows_(rows) {
  OCTET_CHECK(storage == Dtype::f32 || storage == Dtype::bf16, "gradients stored in f32 or bf16, got {}",
              dtype_name(storage));
  OCTET_CHECK(bucket >= 1, "gradients in buckets of {}", bucket);
  for (size_t i = 0; i < runs_.size(); ++i) {
    const GradientRun& r = runs_[i];
    OCTET_CHECK(0 <= r.begin && r.begin <= r.end && (i == 0 || runs_[i - 1].end <= r.begin) &&
                    (storage == Dtype::f32 || r.bf16),
                "gradient runs in order, codes summed in BF16: [{}, {})", r.begin, r.end);
    OCTET_CHECK(shard_total == 0 || (r.parameter >= 0 && r.parameter + (r.end - r.begin) <= shard_total),
                "the gradients [{}, {}) of parameters past the {} that the shards divide", r.begin, r.end,
                shard_total);
  }
  OCTET_CHECK(rows == nullptr || (shard_total == 0 && storage == Dtype::f32 && rows->end() <= count_),
              "the sums of a token-indexed gradient's rows: all-reduced, inside the {} float32 gradients",
              count_);
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
  // The runs' parts within [begin, end), neighbours in the buffer summed alike (and, for shards, neighbours
  // in the parameters) in one piece.
  int64_t piece_begin = 0, piece_end = 0, piece_parameter = 0;
  bool piece_bf16 = false;
  for (const GradientRun& r : runs_) {
    const int64_t b = std::max(begin, r.begin), e = std::min(end, r.end);
    if (b >= e) continue;
    const int64_t parameter = r.parameter + (b - r.begin);
    const bool joins = piece_begin < piece_end && piece_end == b && piece_bf16 == r.bf16 &&
                       (shard_total_ == 0 || piece_parameter + (piece_end - piece_begin) == parameter);
    if (joins) {
      piece_end = e;
      continue;
    }
    if (piece_begin < piece_end) start_piece(piece_begin, piece_end, piece_parameter, piece_bf16);
    piece_begin = b, piece_end = e, piece_parameter = parameter, piece_bf16 = r.bf16;
  }
  if (piece_begin < piece_end) start_piece(piece_begin, piece_end, piece_parameter, piece_bf16);
}

void OverlappedSums::start_piece(int64_t begin, int64_t end, int64_t parameter, bool bf16) {
  // A piece that holds the whole token-indexed gradient: its rows through rows_, the rest as ever. (The
  // model reports that gradient in one run; a piece holding part of it sums that part whole.)
  if (rows_ != nullptr && rows_->sparse() && begin <= rows_->begin() && rows_->end() <= end) {
    start_dense(begin, rows_->begin(), parameter, bf16);
    rows_->start(communicator_, static_cast<float*>(grads_), stream_,
                 bf16 ? dist::GradientReduceType::bf16 : dist::GradientReduceType::float32);
    start_dense(rows_->end(), end, parameter + (rows_->end() - begin), bf16);
    return;
  }
  start_dense(begin, end, parameter, bf16);
}

void OverlappedSums::start_dense(int64_t begin, int64_t end, int64_t parameter, bool bf16) {
  if (begin == end) return;
  const auto n = static_cast<size_t>(end - begin);
  if (storage_ == Dtype::bf16) {
    const std::span<uint16_t> codes(static_cast<uint16_t*>(grads_) + begin, n);
    if (shard_total_ > 0) {
      communicator_.start_reduce_scatter_sum_bf16_codes(codes, parameter, shard_total_, stream_);
    } else {
      communicator_.start_all_reduce_sum_bf16_codes(codes, stream_);
    }
    return;
  }
  const std::span<float> values(static_cast<float*>(grads_) + begin, n);
  if (shard_total_ > 0 && bf16) {
    communicator_.start_reduce_scatter_sum_bf16(values, parameter, shard_total_, stream_);
  } else if (shard_total_ > 0) {
    communicator_.start_reduce_scatter_sum(values, parameter, shard_total_, stream_);
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
  if (rows_ != nullptr) rows_->finish(static_cast<float*>(grads_));
  started_.clear();
}

}  // namespace octet
