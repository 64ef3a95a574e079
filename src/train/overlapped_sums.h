// The ranks' sum of the float32 gradients, started bucket by bucket while the backward goes on (internal to
// src/train/): what lets data-parallel training on GPUs hide most of its all-reduce behind compute.
//
// The model reports the gradients that its backward has finished (Model::set_gradient_ready) in runs; runs
// that touch are gathered into a bucket, and a bucket of at least `bucket` elements is started
// (Communicator::start_all_reduce_sum, or its BF16 form) as soon as it is complete. finish() starts what is left, the runs
// never reported included, and waits for every sum. Every rank reports the same runs in the same order, so
// every rank starts the same sums. The sums are element-wise: their result is the all-reduce of the whole
// buffer after the backward, bit for bit.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "octet/dist/communicator.h"
#include "octet/dist/topology.h"

namespace octet {

class OverlappedSums {
 public:
  // The gradients are grads[0, count); `stream` the backend's (Backend::native_stream). `type`: the sums in
  // float32, or in BF16 (Communicator::start_all_reduce_sum_bf16).
  OverlappedSums(dist::Communicator& communicator, float* grads, int64_t count, void* stream, int64_t bucket,
                 dist::GradientReduceType type);

  // The backward has finished grads[begin, end).
  void ready(int64_t begin, int64_t end);
  // Starts the sums of the current bucket and of every run not reported, then waits for all.
  void finish();

 private:
  void start(int64_t begin, int64_t end);
  void flush();

  dist::Communicator& communicator_;
  float* grads_;
  int64_t count_;
  void* stream_;
  int64_t bucket_;
  dist::GradientReduceType type_;
  int64_t pending_begin_ = 0, pending_end_ = 0;  // the bucket being gathered; empty when equal
  std::vector<std::pair<int64_t, int64_t>> started_;
};

}  // namespace octet
