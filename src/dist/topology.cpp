// Resolving [distributed] against the ranks a run was launched with (see topology.h).
#include "octet/dist/topology.h"

#include "octet/check.h"

namespace octet::dist {

DataParallelLayout resolve_layout(const DistributedSettings& settings, int world, int rank) {
  OCTET_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} of a world of {}", rank, world);
  int64_t shard = settings.dp_shard, replicate = settings.dp_replicate;
  OCTET_REQUIRE(shard == -1 || shard >= 1,
                "distributed.dp_shard must be -1 (every rank) or at least 1, got {}", shard);
  OCTET_REQUIRE(replicate == -1 || replicate >= 1,
                "distributed.dp_replicate must be -1 (every rank) or at least 1, got {}", replicate);
  OCTET_REQUIRE(
      shard != -1 || replicate != -1,
      "distributed.dp_shard and distributed.dp_replicate cannot both be -1: at most one of them takes "
      "the ranks the other leaves");
  if (shard == -1) {
    OCTET_REQUIRE(world % replicate == 0,
                  "distributed.dp_replicate = {} does not divide the {} rank{} of this run", replicate, world,
                  world == 1 ? "" : "s");
    shard = world / replicate;
  } else if (replicate == -1) {
    OCTET_REQUIRE(world % shard == 0, "distributed.dp_shard = {} does not divide the {} rank{} of this run",
                  shard, world, world == 1 ? "" : "s");
    replicate = world / shard;
  }
  OCTET_REQUIRE(shard * replicate == world,
                "distributed.dp_shard x distributed.dp_replicate = {} x {} = {}, but this run has {} rank{}",
                shard, replicate, shard * replicate, world, world == 1 ? "" : "s");
  return {.world = world,
          .shard = static_cast<int>(shard),
          .replicate = static_cast<int>(replicate),
          .rank = rank};
}

}  // namespace octet::dist
