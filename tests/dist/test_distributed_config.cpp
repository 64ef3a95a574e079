// The [distributed] keys: their defaults (a world of one, sharded over every rank), one clear message naming
// the key for every value that is not valid, and a run of one rank refusing a layout of several.
#include <string>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/dist/topology.h"
#include "octet/train/training_run.h"

namespace octet {
namespace {

std::string refusal(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_run_config(toml, "run.toml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "accepted";
}

TEST(DistributedConfig, DefaultsShardOverEveryRankAndRoundTrip) {
  const RunConfig defaults = parse_run_config("", "empty.toml");
  EXPECT_EQ(defaults.distributed.dp_shard, -1);
  EXPECT_EQ(defaults.distributed.dp_replicate, 1);
  const std::string toml = to_toml(defaults);
  EXPECT_EQ(defaults.distributed.gradient_reduce_type, dist::GradientReduceType::float32);
  EXPECT_NE(
      toml.find("[distributed]\ndp_shard = -1\ndp_replicate = 1\ngradient_reduce_dtype = \"float32\"\n"),
      std::string::npos)
      << toml;
  const RunConfig set = parse_run_config(
      "[distributed]\ndp_shard = 2\ndp_replicate = -1\ngradient_reduce_dtype = \"bf16\"\n", "run.toml");
  EXPECT_EQ(set.distributed.gradient_reduce_type, dist::GradientReduceType::bf16);
  EXPECT_EQ(set.distributed.dp_shard, 2);
  EXPECT_EQ(set.distributed.dp_replicate, -1);
  const RunConfig back = parse_run_config(to_toml(set), "back.toml");
  EXPECT_EQ(back.distributed.dp_shard, 2);
  EXPECT_EQ(back.distributed.dp_replicate, -1);
  EXPECT_EQ(back.distributed.gradient_reduce_type, dist::GradientReduceType::bf16);
}

TEST(DistributedConfig, EveryInvalidValueGetsOneMessageNamingTheKey) {
  const std::string valid = "-1 (the ranks the other key leaves) or 1 to 65536";
  EXPECT_EQ(refusal("[distributed]\ndp_shard = 0\n"),
            "run.toml:2: distributed.dp_shard must be " + valid + ", got integer 0");
  EXPECT_EQ(refusal("[distributed]\ndp_replicate = -2\n"),
            "run.toml:2: distributed.dp_replicate must be " + valid + ", got integer -2");
  EXPECT_EQ(refusal("[distributed]\ndp_shard = 100000\n"),
            "run.toml:2: distributed.dp_shard must be " + valid + ", got integer 100000");
  EXPECT_EQ(refusal("[distributed]\ndp_shard = \"all\"\n"),
            "run.toml:2: distributed.dp_shard must be " + valid + ", got string \"all\"");
  EXPECT_EQ(
      refusal("", {"distributed.dp_replicate=1.5"}),
      "--set distributed.dp_replicate=1.5: distributed.dp_replicate must be " + valid + ", got number 1.5");
  EXPECT_EQ(
      refusal("[distributed]\ndp_replicate = -1\n"),
      "run.toml: distributed.dp_shard and distributed.dp_replicate cannot both be -1: at most one of them "
      "takes the ranks the other leaves");
  EXPECT_EQ(
      refusal("[distributed]\ngradient_reduce_dtype = \"fp8\"\n"),
      "run.toml:2: distributed.gradient_reduce_dtype = \"fp8\" is not valid; expected one of \"float32\", "
      "\"bf16\"");
  EXPECT_NE(refusal("[distributed]\ndp_shards = 2\n").find("did you mean distributed.dp_shard?"),
            std::string::npos);
}

TEST(DistributedConfig, ARunOfOneRankRefusesALayoutOfSeveral) {
  // Refused before the data or the run directory are looked at.
  for (const std::string& toml : {std::string("[distributed]\ndp_shard = 4\n"),
                                  std::string("[distributed]\ndp_shard = 1\ndp_replicate = 2\n")}) {
    const RunConfig config = parse_run_config(toml, "run.toml");
    TrainingRunOptions options;
    options.handle_signals = false;
    try {
      run_training(config, options);
      ADD_FAILURE() << "expected a refusal";
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      EXPECT_NE(std::string(e.what()).find("but this run has 1 rank"), std::string::npos) << e.what();
    }
  }
}

TEST(DistributedConfig, HybridLayoutsAreAcceptedAndTheirReduceScatterRefusedNamingBothKeys) {
  // dp_shard = 2 with dp_replicate = 2 on 4 ranks, spelled three ways; with the gradients all-reduced.
  for (const std::string& toml : {std::string("[distributed]\ndp_shard = 2\ndp_replicate = 2\n"),
                                  std::string("[distributed]\ndp_shard = 2\ndp_replicate = -1\n"),
                                  std::string("[distributed]\ndp_shard = -1\ndp_replicate = 2\n")}) {
    const RunConfig config = parse_run_config(toml, "run.toml");
    EXPECT_NO_THROW(check_ranks(config, 4)) << toml;
    const dist::DataParallelLayout layout = dist::resolve_layout(config.distributed, 4, 3);
    EXPECT_EQ(layout.shard, 2);
    EXPECT_EQ(layout.replicate, 2);
    EXPECT_EQ(layout.replica(), 1);
    EXPECT_EQ(layout.shard_rank(), 1);
  }
  const RunConfig scattered = parse_run_config(
      "[distributed]\ndp_shard = 2\ndp_replicate = 2\nsharded_gradient_sums = \"reduce_scatter\"\n",
      "run.toml");
  try {
    check_ranks(scattered, 4);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(std::string(e.what()),
              "distributed.sharded_gradient_sums = \"reduce_scatter\" is not supported with a hybrid layout "
              "(distributed.dp_shard = 2 with distributed.dp_replicate = 2): every rank receives every "
              "gradient's sum there; set distributed.sharded_gradient_sums = \"all_reduce\", or shard the "
              "optimizer state over every rank (distributed.dp_replicate = 1)");
  }
  // The reduce-scatter stays available where the state is sharded over every rank, and is moot where it is
  // not sharded at all.
  for (const std::string& layout :
       {std::string("dp_shard = 4\ndp_replicate = 1\n"), std::string("dp_shard = 1\ndp_replicate = 4\n")}) {
    const RunConfig config = parse_run_config(
        "[distributed]\n" + layout + "sharded_gradient_sums = \"reduce_scatter\"\n", "run.toml");
    EXPECT_NO_THROW(check_ranks(config, 4)) << layout;
  }
  // A layout whose product is not the ranks is refused naming both keys.
  try {
    check_ranks(parse_run_config("[distributed]\ndp_shard = 2\ndp_replicate = 3\n", "run.toml"), 4);
    ADD_FAILURE() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(std::string(e.what()),
              "distributed.dp_shard x distributed.dp_replicate = 2 x 3 = 6, but this run has 4 ranks");
  }
}

}  // namespace
}  // namespace octet
