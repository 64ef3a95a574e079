// The ranks' sum of a gradient whose rows are indexed by input tokens (Model::token_row_gradient: an untied
// token embedding), taken over the rows that some rank's tokens touched only (internal to src/train/).
//
// After zero_grad and a step's backwards, a rank's table gradient is +0 in every row whose token none of its
// micro-batches read. The ranks agree on the union U of the rows they read (one all-gather of a bitmap of
// the table's rows, host memory, OR-ed in rank order: every rank holds the same sorted U); the sum then
// gathers rows U into a compact [|U|, C] buffer in backend memory (Backend::gather_rows), all-reduces it
// through the communicator's started sums (float32 or BF16, as the dense sum would), and, once the sums are
// finished, writes the rows back (Backend::scatter_rows). Each summed element is the dense all-reduce's sum
// of the same values in the same order, and every row outside U sums +0s to +0, which it already holds: the
// result is the dense sum's, bit for bit, for |U| / rows of its bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/dist/communicator.h"
#include "octet/dist/topology.h"
#include "octet/model/model.h"

namespace octet {

class TokenRowSums {
 public:
  TokenRowSums(Backend& backend, Model::TokenRowGradient table);

  // A step begins: no rows read yet.
  void clear();
  // This rank's micro-batch reads tokens[0, n) (host memory), each a row of the table.
  void add(const int32_t* tokens, int64_t n);
  // The rows some rank read, agreed on by every rank and uploaded to the backend: a collective, which every
  // rank calls at the same point of the step, after its last add.
  void agree(dist::Communicator& communicator);

  // The table's gradient elements [begin, end) in the gradient buffer.
  int64_t begin() const { return table_.offset; }
  int64_t end() const { return table_.offset + table_.rows * table_.cols; }
  // The rows agreed on (sorted), and whether they are fewer than the table's: only then does start() pay.
  const std::vector<int32_t>& rows() const { return rows_; }
  bool sparse() const { return static_cast<int64_t>(rows_.size()) < table_.rows; }

  // Gathers the agreed rows of the table's gradient (in `grads`, the gradient buffer) on the backend and
  // starts their sum over the ranks (Communicator::start_all_reduce_sum, or its BF16 form), once the work
  // enqueued on `stream` is done.
  void start(dist::Communicator& communicator, float* grads, void* stream, dist::GradientReduceType type);
  // After Communicator::finish_started: the summed rows written back into the table's gradient.
  void finish(float* grads);

 private:
  Backend& backend_;
  Model::TokenRowGradient table_;
  std::vector<uint8_t> read_;        // a bit per row: this rank's tokens
  std::vector<int32_t> rows_;        // agreed on, sorted
  std::unique_ptr<Buffer> index_;    // rows_ in backend memory
  std::unique_ptr<Buffer> compact_;  // [capacity_, C]: the rows gathered, then their sums
  int64_t capacity_ = 0;
  bool started_ = false;
};

}  // namespace octet
