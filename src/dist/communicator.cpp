// How a count of elements is split into the ranks' contiguous shards (see communicator.h).
#include "octet/dist/communicator.h"

#include <algorithm>

#include "octet/check.h"

namespace octet::dist {

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
