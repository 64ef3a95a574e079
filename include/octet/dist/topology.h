// How a run's ranks are arranged for data parallelism ([distributed] in the configuration): dp_shard ranks
// share one copy of the optimizer state, each holding a contiguous shard of it, and dp_replicate such groups
// each hold a whole copy. The ranks of a shard group are consecutive: rank = replica * shard + shard_rank.
// A world of one rank is training as it has always been. The ranks sum their gradients in float32, or in BF16
// where the configuration says so (half the traffic, each addition rounded to BF16).
#pragma once

#include <cstdint>

namespace octet::dist {

// The type in which the ranks sum their gradients ([distributed] gradient_reduce_dtype).
enum class GradientReduceType : uint8_t { float32, bf16 };

// [distributed]: -1 stands for "every rank the other key leaves", so the defaults shard over all ranks.
struct DistributedSettings {
  int64_t dp_shard = -1;
  int64_t dp_replicate = 1;
  GradientReduceType gradient_reduce_type = GradientReduceType::float32;
  // The float32 gradients' sums start during the backward in buckets of at least this many MiB; 0: all
  // of them after the backward (no overlap).
  int64_t bucket_mb = 64;
  // With the optimizer state sharded: every rank receives the whole buffer's sums (all-reduce), or only
  // its shard's (reduce-scatter, half the bytes) ([distributed] sharded_gradient_sums).
  bool reduce_scatter = false;
  // With the optimizer state sharded: the weights whose GEMMs all run in FP8 are gathered as FP8 codes
  // ([distributed] fp8_weight_gather; src/train/parameter_gather.h).
  bool fp8_weight_gather = true;
  // With FP8 weight gathers: the copies made from the gathered codes given back after each run's forward
  // and backward and gathered again (fully sharded weights; [distributed] reshard_after_forward).
  bool reshard_after_forward = false;
  // Where every rank receives every sum: an untied token embedding's gradient summed in the rows some
  // rank's tokens read only ([distributed] sparse_embedding_sums).
  bool sparse_embedding_sums = true;
};

struct DataParallelLayout {
  int world = 1;      // ranks in the run
  int shard = 1;      // ranks in a shard group
  int replicate = 1;  // shard groups
  int rank = 0;

  int shard_rank() const { return rank % shard; }
  int replica() const { return rank / shard; }
};

// The layout of `world` ranks that `settings` asks for, as seen by `rank`. Throws invalid_input naming the
// keys when their product is not the world (with -1 resolved first), or both are -1.
DataParallelLayout resolve_layout(const DistributedSettings& settings, int world, int rank);

}  // namespace octet::dist
