// Checkpoints of data-parallel runs: two ranks with a sharded optimizer state write the very files one rank
// accumulating the same global batch writes, and four ranks (or one) resume from them exactly: the same bits
// as one rank that resumes from its own checkpoint, the data loader continuing where it stood.
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "dist_fixture.h"
#include "octet/train/checkpoint.h"

namespace octet {
namespace {

using namespace dist_testing;

constexpr int kBefore = 2, kAfter = 3;  // steps before the checkpoint, and after it

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A run directory of its own, removed at the end.
struct RunDirectory {
  explicit RunDirectory(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("octet_resharding_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::remove_all(path);
  }
  ~RunDirectory() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

// Trains one shape for `steps` steps on s.ranks ranks (one rank emulating them when `emulate`), starting from
// `checkpoint` when given, and saves a checkpoint into `save_to` when given. Returns each rank's outcome.
std::vector<Outcome> run(const RunShape& s, bool emulate, const TokenShardFile& shard, int steps,
                         const std::filesystem::path& checkpoint, const std::filesystem::path& save_to) {
  const io::DataLoaderOptions options{B, T, true, 9, testing::tiny_config().vocab_size};
  auto one = [&](DataParallel parallel) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s), parallel);
    io::DataLoader loader({shard.path()}, options);
    if (!checkpoint.empty()) {
      const CheckpointLoad loaded = load_checkpoint(checkpoint, *m, trainer);
      EXPECT_TRUE(loaded.progress.train_position.has_value());
      loader.seek(*loaded.progress.train_position);
    }
    BatchSource data = [&loader](int32_t* tokens, int32_t* targets) {
      loader.next_batch(std::span<int32_t>(tokens, B * T), std::span<int32_t>(targets, B * T));
    };
    if (parallel.communicator != nullptr) {
      data = rank_batches(data, parallel.rank(), static_cast<int>(parallel.ranks()), s.micro, B, T);
    }
    Outcome o = train(s, *m, trainer, data, &loader, steps);
    if (!save_to.empty()) {
      TrainingProgress progress;
      progress.train_position = loader.position();
      save_checkpoint(save_to, *m, trainer, progress);
    }
    return o;
  };
  if (emulate) return {one(DataParallel{.shard_optimizer_state = s.shard, .emulated_ranks = s.ranks})};
  std::vector<Outcome> outcomes(static_cast<size_t>(s.ranks));
  dist::run_ranks(s.ranks, [&](dist::Communicator& c) {
    outcomes[static_cast<size_t>(c.rank())] =
        one(DataParallel{.communicator = &c, .shard_optimizer_state = s.shard});
  });
  return outcomes;
}

TEST(Resharding, TwoShardedRanksCheckpointAsOneRankAndResumeOnFour) {
  const TokenShardFile shard;
  // The same global batch of 4 micro-batches a step, split 2 x 2 before the checkpoint and 4 x 1 after it.
  const RunShape before{.precision = MixedPrecision::fp8, .ranks = 2, .micro = 2, .shard = true};
  const RunShape after{.precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true};
  const RunDirectory one_dir("one"), ranks_dir("ranks");

  run(before, true, shard, kBefore, {}, one_dir.path);
  run(before, false, shard, kBefore, {}, ranks_dir.path);
  const std::filesystem::path one_checkpoint = checkpoint_directory(one_dir.path, kBefore);
  const std::filesystem::path ranks_checkpoint = checkpoint_directory(ranks_dir.path, kBefore);
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    const std::string expected = file_bytes(one_checkpoint / file);
    EXPECT_FALSE(expected.empty()) << file;
    EXPECT_TRUE(file_bytes(ranks_checkpoint / file) == expected) << file << " differs from one rank's";
  }

  const std::vector<Outcome> reference = run(after, true, shard, kAfter, one_checkpoint, {});
  const std::vector<Outcome> four = run(after, false, shard, kAfter, ranks_checkpoint, {});
  for (int r = 0; r < after.ranks; ++r) {
    expect_same(reference[0], four[static_cast<size_t>(r)], "rank " + std::to_string(r));
  }
  // Four ranks that keep whole moments resume from the sharded ranks' checkpoint too (their gradient norm is
  // summed otherwise: against one rank that sums it alike).
  RunShape replicated = after;
  replicated.shard = false;
  const std::vector<Outcome> whole_reference = run(replicated, true, shard, kAfter, one_checkpoint, {});
  const std::vector<Outcome> whole = run(replicated, false, shard, kAfter, ranks_checkpoint, {});
  for (int r = 0; r < after.ranks; ++r) {
    expect_same(whole_reference[0], whole[static_cast<size_t>(r)], "rank " + std::to_string(r));
  }
}

}  // namespace
}  // namespace octet
