// The ranks' sum of the float32 gradients, started bucket by bucket while the backward goes on (internal to
// src/train/): what lets data-parallel training on GPUs hide most of its sums behind compute.
//
// The model reports the gradients that its backward has finished (Model::set_gradient_ready) in runs; runs
// that touch are gathered into a bucket, and a bucket of at least `bucket` elements is started as soon as it
// is complete. finish() starts what is left, the runs never reported included, and waits for every sum.
// Every rank reports the same runs in the same order, so every rank starts the same sums. A bucket is
// all-reduced (Communicator::start_all_reduce_sum, or its BF16 form), or, for a sharded optimizer, reduce-
// scattered (Communicator::start_reduce_scatter_sum): each rank receives the sums of the bucket's part in its
// own shard only, and the rest of the buffer is left unsummed, for nothing to read. The sums are
// element-wise: their result is that of one all-reduce of the whole buffer after the backward, bit for bit
// (on a rank's shard, for a reduce-scatter).
//
// Given a TokenRowSums (token_row_sums.h: all-reduces only), a bucket that holds the whole token-indexed
// gradient sums that gradient's agreed rows alone, through TokenRowSums, and the rest of the bucket as above;
// finish() writes the summed rows back once every sum is done. The result is the same bits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "octet/dist/communicator.h"
#include "octet/dist/topology.h"
#include "token_row_sums.h"

namespace octet {

class OverlappedSums {
 public:
  // The gradients are grads[0, count); `stream` the backend's (Backend::native_stream). `type`: the sums in
  // float32, or in BF16 (Communicator::start_all_reduce_sum_bf16). `shard_total`: 0, every rank receives
  // every sum; otherwise the elements the ranks' shards divide (dist::shard_range of it, count at most it),
  // and each rank receives the sums of its shard alone. `rows`: null, or the token-indexed gradient's sums,
  // its rows agreed on (TokenRowSums::agree), for a buffer that is all-reduced (shard_total 0).
  OverlappedSums(dist::Communicator& communicator, float* grads, int64_t count, void* stream, int64_t bucket,
                 dist::GradientReduceType type, int64_t shard_total = 0, TokenRowSums* rows = nullptr);

  // The backward has finished grads[begin, end).
  void ready(int64_t begin, int64_t end);
  // Starts the sums of the current bucket and of every run not reported, then waits for all.
  void finish();

 private:
  void start(int64_t begin, int64_t end);
  void start_dense(int64_t begin, int64_t end);
  void flush();

  dist::Communicator& communicator_;
  float* grads_;
  int64_t count_;
  void* stream_;
  int64_t bucket_;
  dist::GradientReduceType type_;
  int64_t shard_total_;
  TokenRowSums* rows_;
  int64_t pending_begin_ = 0, pending_end_ = 0;  // the bucket being gathered; empty when equal
  std::vector<std::pair<int64_t, int64_t>> started_;
};

}  // namespace octet
