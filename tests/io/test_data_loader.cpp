// The data loader: targets are inputs shifted by one, an epoch visits every window once, the same seed gives
// the same batches and another seed another order, and a loader resumed from position() continues exactly as
// the uninterrupted one.
#include <algorithm>
#include <set>
#include <utility>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "octet/io/data_loader.h"

namespace octet::io {
namespace {

using octet::testing::invalid_input_message;
using octet::testing::TempDir;

// Shards whose tokens are all distinct (shard s holds s * 10000 + i), so that a batch row tells exactly which
// shard and window it came from. Sizes are odd; the 9-token shard holds no window of T + 1 = 17 tokens.
std::vector<std::filesystem::path> write_numbered_shards(const TempDir& dir,
                                                         TokenWidth width = TokenWidth::uint16) {
  const std::vector<int32_t> sizes = {1000, 777, 9, 2333, 131};
  std::vector<std::filesystem::path> paths;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<int32_t> tokens(static_cast<size_t>(sizes[s]));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(s * 10000 + i);
    paths.push_back(shard_path(dir.path(), DataSplit::train, static_cast<int64_t>(s)));
    write_token_shard(paths.back(), tokens, width);
  }
  return paths;
}

DataLoaderOptions options_for(int64_t B, int64_t T, uint64_t seed, bool shuffle = true) {
  DataLoaderOptions options;
  options.batch_size = B;
  options.sequence_length = T;
  options.seed = seed;
  options.shuffle = shuffle;
  return options;
}

std::vector<Batch> take(DataLoader& loader, int count) {
  std::vector<Batch> batches;
  for (int i = 0; i < count; ++i) batches.push_back(loader.next_batch());
  return batches;
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].inputs, b[i].inputs) << "batch " << i;
    EXPECT_EQ(a[i].targets, b[i].targets) << "batch " << i;
  }
}

TEST(DataLoader, TargetsAreInputsShiftedByOneWithinAlignedWindows) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  DataLoader loader(paths, options_for(3, 16, 7));
  for (const Batch& batch : take(loader, 50)) {
    ASSERT_EQ(batch.inputs.size(), 48u);
    for (int64_t b = 0; b < 3; ++b) {
      const int32_t first = batch.inputs[static_cast<size_t>(b * 16)];
      EXPECT_EQ(first % 10000 % 16, 0) << "a window starts at a multiple of T";
      for (int64_t t = 0; t < 16; ++t) {
        const size_t i = static_cast<size_t>(b * 16 + t);
        EXPECT_EQ(batch.inputs[i], first + t);
        EXPECT_EQ(batch.targets[i], first + t + 1);
      }
    }
  }
}

TEST(DataLoader, UnshuffledLoaderReadsWindowsInFileOrder) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  DataLoader loader(paths, options_for(2, 16, 0, /*shuffle=*/false));
  EXPECT_EQ(loader.windows_per_epoch(), 999 / 16 + 776 / 16 + 0 + 2332 / 16 + 130 / 16);
  EXPECT_EQ(loader.batches_per_epoch(), loader.windows_per_epoch() / 2);
  EXPECT_EQ(loader.total_tokens(), 1000 + 777 + 9 + 2333 + 131);
  Batch batch = loader.next_batch();
  EXPECT_EQ(batch.inputs[0], 0);
  EXPECT_EQ(batch.inputs[16], 16);
  for (int i = 1; i < 32; ++i) batch = loader.next_batch();  // windows 62..63: the first two of shard 1
  EXPECT_EQ(batch.inputs[0], 10000);
  EXPECT_EQ(batch.inputs[16], 10016);
}

TEST(DataLoader, EachEpochVisitsEveryWindowOnce) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  DataLoader loader(paths, options_for(1, 16, 99));
  const int64_t windows = loader.windows_per_epoch();
  std::vector<int32_t> epoch0, epoch1;
  for (int64_t i = 0; i < windows; ++i) epoch0.push_back(loader.next_batch().inputs[0]);
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0, 0}));
  for (int64_t i = 0; i < windows; ++i) epoch1.push_back(loader.next_batch().inputs[0]);
  EXPECT_NE(epoch0, epoch1) << "each epoch draws a new order";
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch0, epoch1);
  EXPECT_EQ(std::set<int32_t>(epoch0.begin(), epoch0.end()).size(), static_cast<size_t>(windows));
}

TEST(DataLoader, SameSeedSameBatchesOtherSeedOtherOrder) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  DataLoader first(paths, options_for(4, 16, 1234));
  DataLoader second(paths, options_for(4, 16, 1234));
  DataLoader other(paths, options_for(4, 16, 1235));
  // 60 batches of 4 windows run past the 263 windows of one epoch.
  const auto a = take(first, 60), b = take(second, 60), c = take(other, 60);
  expect_same_batches(a, b);
  int differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i].inputs != c[i].inputs;
  EXPECT_GT(differing, 50);
  first.reset();
  expect_same_batches(take(first, 60), a);
}

// The resume property: batches 4..7 of an uninterrupted loader equal those of a fresh loader sought to the
// position after batch 3. The small data makes the seven batches cross shard and epoch boundaries.
TEST(DataLoader, SeekResumesExactly) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  for (auto [B, T] : {std::pair<int64_t, int64_t>{3, 200}, {7, 128}, {5, 331}}) {
    DataLoader uninterrupted(paths, options_for(B, T, 42));
    std::vector<Batch> all = take(uninterrupted, 3);
    const LoaderPosition after_three = uninterrupted.position();
    for (Batch& batch : take(uninterrupted, 4)) all.push_back(std::move(batch));
    ASSERT_GT(uninterrupted.position().epoch, 0)
        << "B=" << B << " T=" << T << ": the test should cross an epoch";

    DataLoader resumed(paths, options_for(B, T, 42));
    resumed.seek(after_three);
    EXPECT_EQ(resumed.position(), after_three);
    expect_same_batches(take(resumed, 4), std::vector<Batch>(all.begin() + 3, all.end()));
    EXPECT_EQ(resumed.position(), uninterrupted.position());
  }
}

TEST(DataLoader, FillsCallerBuffersLikeNextBatch) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir, TokenWidth::uint32);
  DataLoader owning(paths, options_for(5, 11, 3));
  DataLoader filling(paths, options_for(5, 11, 3));
  std::vector<int32_t> inputs(55), targets(55);
  for (int i = 0; i < 20; ++i) {
    const Batch batch = owning.next_batch();
    filling.next_batch(inputs, targets);
    EXPECT_EQ(batch.inputs, inputs);
    EXPECT_EQ(batch.targets, targets);
  }
}

TEST(DataLoader, SplitSmallerThanOneBatchIsAClearError) {
  TempDir dir;
  write_token_shard(dir / "val_000000.bin", std::vector<int32_t>(64, 1), TokenWidth::uint16);
  DataLoaderOptions options = options_for(4, 16, 0);  // needs 4 windows of 17 tokens; 64 tokens give 3
  const std::string message =
      invalid_input_message([&] { DataLoader(dir.path(), DataSplit::validation, options); });
  EXPECT_NE(message.find("the val split in " + dir.path().string()), std::string::npos) << message;
  EXPECT_NE(
      message.find("64 tokens in 1 shard(s) give 3 window(s) of T+1=17 tokens, fewer than one batch of B=4"),
      std::string::npos)
      << message;
  options.batch_size = 3;
  EXPECT_EQ(DataLoader(dir.path(), DataSplit::validation, options).batches_per_epoch(), 1);
  options.batch_size = 0;
  invalid_input_message([&] { DataLoader(dir.path(), DataSplit::validation, options); });
}

TEST(DataLoader, SeekRejectsPositionsOutsideTheData) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  DataLoader loader(paths, options_for(2, 16, 5));
  invalid_input_message([&] { loader.seek({0, 5, 0}); });
  invalid_input_message([&] { loader.seek({-1, 0, 0}); });
  const std::string message = invalid_input_message([&] { loader.seek({0, 0, 100000}); });
  EXPECT_NE(message.find("window 100000"), std::string::npos) << message;
}

TEST(DataLoader, ChecksTokensAgainstTheVocabulary) {
  TempDir dir;
  std::vector<int32_t> tokens(40, 65);
  tokens[21] = 300;
  write_token_shard(dir / "train_000000.bin", tokens, TokenWidth::uint16);
  DataLoaderOptions options = options_for(2, 19, 0, /*shuffle=*/false);
  options.vocab_size = 256;
  // Checked when the shard is opened, before a run directory exists, not when a batch reaches the token.
  const std::string message =
      invalid_input_message([&] { DataLoader loader(dir.path(), DataSplit::train, options); });
  EXPECT_NE(message.find("train_000000.bin: token 300 at index 21 is outside the vocabulary of size 256"),
            std::string::npos)
      << message;
  options.vocab_size = 301;
  DataLoader loader(dir.path(), DataSplit::train, options);
  EXPECT_EQ(loader.next_batch().targets[20], 300);
}

// The orders are part of the checkpoint format: a checkpoint stores only a position, so a change to the
// generator or the shuffle would resume old runs onto other data. These are the first windows of seed 2024
// (shard order 3, 0, 4, 2, 1), as an independent re-implementation of SplitMix64 + Fisher-Yates computes
// them.
TEST(DataLoader, ShuffleOrderIsPinned) {
  TempDir dir;
  const auto paths = write_numbered_shards(dir);
  DataLoader loader(paths, options_for(8, 16, 2024));
  const Batch batch = loader.next_batch();
  std::vector<int32_t> starts;
  for (size_t b = 0; b < 8; ++b) starts.push_back(batch.inputs[b * 16]);
  EXPECT_EQ(starts, (std::vector<int32_t>{30656, 30528, 31968, 30448, 31120, 30576, 30752, 30112}));
}

}  // namespace
}  // namespace octet::io
