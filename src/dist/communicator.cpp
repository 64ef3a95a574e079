// How a count of elements is split into the ranks' contiguous shards (see communicator.h).
#include "octet/dist/communicator.h"

#include <algorithm>
#include <vector>

#include "octet/check.h"
#include "octet/numerics/minifloat.h"

namespace octet::dist {

void Communicator::all_gather_shards(std::span<float> values) {
  const auto count = static_cast<int64_t>(values.size());
  const ShardRange mine = shard_range(count, rank(), size());
  std::vector<float> all(static_cast<size_t>(mine.chunk * size()), 0.0f);
  float* chunk = all.data() + mine.chunk * rank();
  std::copy(values.begin() + mine.begin, values.begin() + mine.end, chunk);
  all_gather(std::span<const float>(chunk, static_cast<size_t>(mine.chunk)), std::span<float>(all));
  std::copy_n(all.begin(), values.size(), values.begin());
}

void Communicator::start_all_reduce_sum_bf16(std::span<float> values, void* stream) {
  (void)stream;
  std::vector<uint16_t> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i) codes[i] = float_to_bf16(values[i]);
  all_reduce_sum_bf16(codes);
  for (size_t i = 0; i < values.size(); ++i) values[i] = bf16_to_float(codes[i]);
}

ShardRange shard_range(int64_t count, int rank, int ranks) {
  OCTET_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && count >= 0, "rank {} of {} ranks, {} elements", rank,
              ranks, count);
  ShardRange r;
  r.chunk = (count + ranks - 1) / ranks;
  r.begin = std::min(count, r.chunk * rank);
  r.end = std::min(count, r.begin + r.chunk);
  return r;
}

}  // namespace octet::dist
