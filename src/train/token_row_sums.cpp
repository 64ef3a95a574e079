// The sums of a token-indexed gradient's touched rows (see token_row_sums.h).
#include "token_row_sums.h"

#include <algorithm>
#include <limits>
#include <span>

#include "octet/check.h"

namespace octet {

TokenRowSums::TokenRowSums(Backend& backend, Model::TokenRowGradient table)
    : backend_(backend), table_(table) {
  OCTET_CHECK(table.offset >= 0 && table.rows >= 1 && table.cols >= 1 &&
                  table.rows <= int64_t{std::numeric_limits<int32_t>::max()},
              "a token-indexed gradient of [{}, {}] at {}", table.rows, table.cols, table.offset);
  read_.assign(static_cast<size_t>((table.rows + 7) / 8), 0);
  index_ = backend_.allocate(static_cast<size_t>(table.rows) * sizeof(int32_t));
}

void TokenRowSums::clear() {
  std::fill(read_.begin(), read_.end(), uint8_t{0});
}

void TokenRowSums::add(const int32_t* tokens, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    OCTET_CHECK(t >= 0 && t < table_.rows, "token {} of a table of {} rows", t, table_.rows);
    read_[static_cast<size_t>(t) / 8] |= static_cast<uint8_t>(1u << (t % 8));
  }
}

void TokenRowSums::agree(dist::Communicator& communicator) {
  OCTET_CHECK(!started_, "the rows agreed on again while their sum is under way");
  const size_t bytes = read_.size();
  std::vector<uint8_t> every(bytes * static_cast<size_t>(communicator.size()));
  communicator.all_gather(std::as_bytes(std::span<const uint8_t>(read_)),
                          std::as_writable_bytes(std::span<uint8_t>(every)));
  std::vector<uint8_t> any(bytes, 0);
  for (size_t r = 0; r < every.size(); r += bytes) {
    for (size_t i = 0; i < bytes; ++i) any[i] |= every[r + i];
  }
  rows_.clear();
  for (int64_t row = 0; row < table_.rows; ++row) {
    if ((any[static_cast<size_t>(row) / 8] >> (row % 8)) & 1u) rows_.push_back(static_cast<int32_t>(row));
  }
  if (!sparse() || rows_.empty()) return;
  const auto count = static_cast<int64_t>(rows_.size());
  if (count > capacity_) {
    // Here, before the backward: what may still read the old buffer (the last step's write-back) is done.
    backend_.synchronize();
    compact_.reset();
    capacity_ = std::min(table_.rows, std::max(count, 2 * capacity_));
    compact_ = backend_.allocate(static_cast<size_t>(capacity_ * table_.cols) * sizeof(float));
  }
  backend_.copy_from_host(index_->data(), rows_.data(), rows_.size() * sizeof(int32_t));
}

void TokenRowSums::start(dist::Communicator& communicator, float* grads, void* stream,
                         dist::GradientReduceType type) {
  OCTET_CHECK(sparse() && !started_, "the sum of a token-indexed gradient's rows: {} of {} rows{}",
              rows_.size(), table_.rows, started_ ? ", already started" : "");
  const auto count = static_cast<int64_t>(rows_.size());
  if (count == 0) return;  // nothing read on any rank: every row's sum is +0 already
  const int64_t C = table_.cols;
  backend_.gather_rows(TensorView(compact_->floats(), {count, C}),
                       ConstTensorView(grads + table_.offset, {table_.rows, C}), index_->ints(), 1, nullptr,
                       {}, TensorRole::gradient);
  const std::span<float> values(compact_->floats(), static_cast<size_t>(count * C));
  if (type == dist::GradientReduceType::bf16) {
    communicator.start_all_reduce_sum_bf16(values, stream);
  } else {
    communicator.start_all_reduce_sum(values, stream);
  }
  started_ = true;
}

void TokenRowSums::finish(float* grads) {
  if (!started_) return;
  started_ = false;
  const auto count = static_cast<int64_t>(rows_.size());
  backend_.scatter_rows(TensorView(grads + table_.offset, {table_.rows, table_.cols}),
                        ConstTensorView(compact_->floats(), {count, table_.cols}), index_->ints());
}

}  // namespace octet
