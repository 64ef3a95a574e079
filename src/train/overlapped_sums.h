// The ranks' sum of one gradient buffer, started bucket by bucket while the backward goes on (internal to
// src/train/): what lets data-parallel training on GPUs hide most of its sums behind compute.
//
// A buffer is the float32 gradients (Model::grads()) or the bf16 ones (Model::grads_bf16(), weight gradients
// kept as BF16 codes). Its layout (GradientRun) says where each run of it lies in the parameters, whose
// shards a sharded optimizer's ranks own, and how the run is summed: in float32, or in BF16 (a float32 run
// rounded to BF16, summed as Communicator::all_reduce_sum_bf16 sums and widened back; a run of codes summed
// as codes). The model reports the gradients that its backward has finished (Model::set_gradient_ready) in
// runs of the buffer; runs that touch are gathered into a bucket, and a bucket of at least `bucket` elements
// is started as soon as it is complete. finish() starts what is left, the runs never reported included, and
// waits for every sum. Every rank reports the same runs in the same order, so every rank starts the same
// sums. A bucket is all-reduced, or, for a sharded optimizer, reduce-scattered piece by piece, each piece
// one run of the parameters (Communicator::start_reduce_scatter_sum and its BF16 forms): each rank receives
// the sums of the piece's part in its own shard only, and the rest of the buffer is left unsummed, for
// nothing to read. The sums are element-wise: their result is that of one sum of the whole buffer after the
// backward, bit for bit (on a rank's shard, for a reduce-scatter).
//
// Given a TokenRowSums (token_row_sums.h: all-reduces of float32 buffers only), a bucket that holds the
// whole token-indexed gradient sums that gradient's agreed rows alone, through TokenRowSums, and the rest of
// the bucket as above; finish() writes the summed rows back once every sum is done. The result is the same
// bits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "octet/dist/communicator.h"
#include "octet/dist/topology.h"
#include "octet/model/model.h"
#include "token_row_sums.h"

namespace octet {

// Elements [begin, end) of a gradient buffer: the gradients of the parameters from `parameter` on (offsets
// into params(), one after another), summed in BF16 or in float32.
struct GradientRun {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t parameter = 0;
  bool bf16 = false;
};

// The runs of the gradient buffer of `storage` (f32: grads(), bf16: grads_bf16()), in order, parameters that
// lie one after another in both the buffer and params() and are summed alike merged into one run. Float32
// gradients are summed in `reduce`, BF16 ones (grad_precision bf16, whatever their storage) in BF16.
std::vector<GradientRun> gradient_runs(const std::vector<ParameterInfo>& parameters, Dtype storage,
                                       dist::GradientReduceType reduce);

// The layout of a float32 buffer of `count` gradients whose element i is parameter i's, all summed in
// `reduce`: one run (none for count 0).
std::vector<GradientRun> uniform_runs(int64_t count, dist::GradientReduceType reduce);

class OverlappedSums {
 public:
  // `grads` is the buffer of `storage`, laid out as `runs` (gradient_runs; elements outside them are not
  // summed); `stream` the backend's (Backend::native_stream). `shard_total`: 0, every rank receives every
  // sum; otherwise the parameters the ranks' shards divide (dist::shard_range of it), and each rank receives
  // the sums of its shard alone. `rows`: null, or the token-indexed gradient's sums, its rows agreed on
  // (TokenRowSums::agree), for a float32 buffer that is all-reduced (shard_total 0).
  OverlappedSums(dist::Communicator& communicator, void* grads, Dtype storage, std::vector<GradientRun> runs,
                 void* stream, int64_t bucket, int64_t shard_total = 0, TokenRowSums* rows = nullptr);

  // The backward has finished grads[begin, end).
  void ready(int64_t begin, int64_t end);
  // Starts the sums of the current bucket and of every run not reported, then waits for all.
  void finish();

 private:
  void start(int64_t begin, int64_t end);
  void start_piece(int64_t begin, int64_t end, int64_t parameter, bool bf16);
  void start_dense(int64_t begin, int64_t end, int64_t parameter, bool bf16);
  void flush();

  dist::Communicator& communicator_;
  void* grads_;
  Dtype storage_;
  std::vector<GradientRun> runs_;
  int64_t count_;  // the end of the last run
  void* stream_;
  int64_t bucket_;
  int64_t shard_total_;
  TokenRowSums* rows_;
  int64_t pending_begin_ = 0, pending_end_ = 0;  // the bucket being gathered; empty when equal
  std::vector<std::pair<int64_t, int64_t>> started_;
};

}  // namespace octet
