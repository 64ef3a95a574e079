// Batches of training sequences from token shards: deterministic shuffling from a seed, epochs, and an exact
// position that a checkpoint stores so that a resumed run sees the very batches an uninterrupted run would.
//
// A shard of N tokens holds (N - 1) / T windows of T + 1 tokens, window k starting at token k * T: its first
// T tokens are inputs and its last T the targets (the inputs shifted by one), so every token but the first
// of a shard is a target once per epoch. An epoch visits the shards in an order drawn from (seed, epoch) and,
// within each shard, its windows in an order drawn from (seed, epoch, shard). A batch is the next B windows;
// it may span shards and epochs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "octet/io/corpus.h"
#include "octet/io/token_shard.h"

namespace octet::io {

struct DataLoaderOptions {
  int64_t batch_size = 0;       // B: windows per batch
  int64_t sequence_length = 0;  // T: input tokens per window
  bool shuffle = true;          // false: shards in the given order, windows in file order (evaluation)
  uint64_t seed = 0;
  // When set, every token of every shard is checked against it when the loader opens the shards
  // (invalid_input naming the shard, the token and its index), and again as batches are assembled.
  std::optional<int64_t> vocab_size;
};

// Where the next batch starts. Canonical: window_index is always inside the shard it names, so positions
// compare equal exactly when the batches that follow are equal.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t shard_index = 0;   // index into this epoch's shard order, not into the path list
  int64_t window_index = 0;  // index into this shard's window order for this epoch
  bool operator==(const LoaderPosition&) const = default;
};

struct Batch {
  int64_t B = 0;
  int64_t T = 0;
  std::vector<int32_t> inputs;   // B * T tokens, row-major (B, T)
  std::vector<int32_t> targets;  // B * T tokens: targets[b, t] = the token after inputs[b, t]
};

class DataLoader {
 public:
  // Throws invalid_input when B or T is not positive, a shard is invalid or (with a vocabulary) holds a token
  // outside it, or the shards hold fewer than B windows of T + 1 tokens.
  DataLoader(const std::vector<std::filesystem::path>& shard_paths, const DataLoaderOptions& options);
  // The shards of `split` found in `directory` (see find_shards).
  DataLoader(const std::filesystem::path& directory, DataSplit split, const DataLoaderOptions& options);

  DataLoader(DataLoader&&) noexcept = default;
  DataLoader& operator=(DataLoader&&) noexcept = default;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  Batch next_batch();
  // Fills caller-owned buffers of B * T tokens each, without allocating.
  void next_batch(std::span<int32_t> inputs, std::span<int32_t> targets);

  // Back to the start of epoch 0.
  void reset();
  LoaderPosition position() const { return position_; }
  // Resumes at a position returned by position() of a loader with the same shards and options; throws
  // invalid_input when the position is outside these shards.
  void seek(const LoaderPosition& position);

  int64_t batch_size() const { return options_.batch_size; }
  int64_t sequence_length() const { return options_.sequence_length; }
  int64_t shard_count() const { return static_cast<int64_t>(shards_.size()); }
  int64_t total_tokens() const;
  int64_t windows_per_epoch() const { return windows_per_epoch_; }
  // Whole batches in one epoch (an evaluation pass takes this many from a fresh, unshuffled loader).
  int64_t batches_per_epoch() const { return windows_per_epoch_ / options_.batch_size; }

 private:
  DataLoader(const std::vector<std::filesystem::path>& shard_paths, const DataLoaderOptions& options,
             std::string description);

  int64_t windows_in_shard(int64_t shard) const;
  // The shard order of position_.epoch, and the window order of the shard that position_ names.
  void load_shard_order();
  void load_window_order();
  // From a shard index that may be past the end or name a shard without windows, moves on (into the next
  // epoch if need be) to the first shard with windows, at its window 0.
  void settle();
  template <typename Stored>
  void copy_window(const TokenShard& shard, std::span<const Stored> tokens, int64_t window, int32_t* inputs,
                   int32_t* targets) const;

  std::vector<TokenShard> shards_;
  DataLoaderOptions options_;
  std::string description_;  // names the data in error messages
  int64_t windows_per_epoch_ = 0;
  LoaderPosition position_;
  std::vector<int64_t> shard_order_;   // for position_.epoch
  std::vector<int64_t> window_order_;  // for the shard at position_.shard_index
};

}  // namespace octet::io
