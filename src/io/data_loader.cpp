// The data loader: window orders drawn from the seed, batch assembly, and positions for exact resumption.
#include "octet/io/data_loader.h"

#include <limits>
#include <numeric>
#include <utility>

#include "octet/check.h"

namespace octet::io {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// SplitMix64 with a hand-written unbiased bounded draw and Fisher-Yates below: std::shuffle and the standard
// distributions differ between standard libraries, and the orders must not, or a checkpoint would resume
// onto different data on another machine.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next() { return mix64(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform in [0, n) by rejection of the low values that would bias the remainder.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

 private:
  uint64_t state_;
};

// The order in which to visit n items for (seed, epoch, stream); the identity when not shuffling.
std::vector<int64_t> visiting_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  SplitMix64 random(mix64(mix64(mix64(seed) + static_cast<uint64_t>(epoch)) + stream));
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(random.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

// Opens every shard and, with a vocabulary, checks every token now: a bad token must be refused before a
// run directory exists, not when a batch first reaches it hours into the run.
std::vector<TokenShard> open_shards(const std::vector<std::filesystem::path>& paths,
                                    std::optional<int64_t> vocab_size) {
  std::vector<TokenShard> shards;
  shards.reserve(paths.size());
  for (const auto& path : paths) {
    shards.push_back(TokenShard::open(path));
    if (vocab_size) shards.back().validate_tokens(*vocab_size);
  }
  return shards;
}

std::string describe_paths(const std::vector<std::filesystem::path>& paths) {
  if (paths.size() == 1) return fmt::format("token shard {}", paths[0].string());
  return fmt::format("{} token shards from {}", paths.size(), paths.empty() ? "" : paths[0].string());
}

}  // namespace

DataLoader::DataLoader(const std::vector<std::filesystem::path>& shard_paths,
                       const DataLoaderOptions& options)
    : DataLoader(shard_paths, options, describe_paths(shard_paths)) {}

DataLoader::DataLoader(const std::filesystem::path& directory, DataSplit split,
                       const DataLoaderOptions& options)
    : DataLoader(find_shards(directory, split), options,
                 fmt::format("the {} split in {}", split_prefix(split), directory.string())) {}

DataLoader::DataLoader(const std::vector<std::filesystem::path>& shard_paths,
                       const DataLoaderOptions& options, std::string description)
    : options_(options), description_(std::move(description)) {
  OCTET_REQUIRE(!shard_paths.empty(), "data loader: no token shards given");
  OCTET_REQUIRE(options.batch_size > 0 && options.sequence_length > 0,
                "data loader: batch size B and sequence length T must be positive, got B={} T={}",
                options.batch_size, options.sequence_length);
  OCTET_REQUIRE(!options.vocab_size || *options.vocab_size > 0,
                "data loader: vocabulary size must be positive, got {}", options.vocab_size.value_or(0));
  shards_ = open_shards(shard_paths, options.vocab_size);
  for (int64_t shard = 0; shard < shard_count(); ++shard) windows_per_epoch_ += windows_in_shard(shard);
  const int64_t T = options.sequence_length, B = options.batch_size;
  OCTET_REQUIRE(
      windows_per_epoch_ >= B,
      "{}: {} tokens in {} shard(s) give {} window(s) of T+1={} tokens, fewer than one batch of B={} "
      "windows (a shard of n tokens gives (n-1)/T windows); use more data or a smaller B or T",
      description_, total_tokens(), shard_count(), windows_per_epoch_, T + 1, B);
  reset();
}

int64_t DataLoader::total_tokens() const {
  int64_t total = 0;
  for (const auto& shard : shards_) total += shard.size();
  return total;
}

int64_t DataLoader::windows_in_shard(int64_t shard) const {
  const int64_t tokens = shards_[static_cast<size_t>(shard)].size();
  return tokens < 1 ? 0 : (tokens - 1) / options_.sequence_length;
}

void DataLoader::load_shard_order() {
  shard_order_ = visiting_order(shard_count(), options_.shuffle, options_.seed, position_.epoch, 0);
}

void DataLoader::load_window_order() {
  const int64_t shard = shard_order_[static_cast<size_t>(position_.shard_index)];
  // Stream shard + 1: stream 0 is the shard order, and each shard's windows get a stream of their own.
  window_order_ = visiting_order(windows_in_shard(shard), options_.shuffle, options_.seed, position_.epoch,
                                 static_cast<uint64_t>(shard) + 1);
}

void DataLoader::settle() {
  position_.window_index = 0;
  for (;;) {
    if (position_.shard_index == shard_count()) {
      ++position_.epoch;
      position_.shard_index = 0;
      load_shard_order();
    }
    // The constructor guarantees at least one window per epoch, so this finds a shard within one epoch.
    if (windows_in_shard(shard_order_[static_cast<size_t>(position_.shard_index)]) > 0) break;
    ++position_.shard_index;
  }
  load_window_order();
}

void DataLoader::reset() {
  position_ = LoaderPosition{};
  load_shard_order();
  settle();
}

void DataLoader::seek(const LoaderPosition& position) {
  OCTET_REQUIRE(position.epoch >= 0 && position.shard_index >= 0 && position.shard_index < shard_count() &&
                    position.window_index >= 0,
                "data loader: position (epoch {}, shard {}, window {}) is outside {} ({} shard(s))",
                position.epoch, position.shard_index, position.window_index, description_, shard_count());
  position_ = position;
  load_shard_order();
  const int64_t shard = shard_order_[static_cast<size_t>(position.shard_index)];
  const int64_t windows = windows_in_shard(shard);
  OCTET_REQUIRE(
      position.window_index < windows,
      "data loader: position (epoch {}, shard {}, window {}) is outside {}: that shard ({}) has {} windows "
      "of T+1={} tokens; was the position saved with other data or another T?",
      position.epoch, position.shard_index, position.window_index, description_,
      shards_[static_cast<size_t>(shard)].path().string(), windows, options_.sequence_length + 1);
  load_window_order();
}

Batch DataLoader::next_batch() {
  Batch batch;
  batch.B = options_.batch_size;
  batch.T = options_.sequence_length;
  batch.inputs.resize(static_cast<size_t>(batch.B * batch.T));
  batch.targets.resize(static_cast<size_t>(batch.B * batch.T));
  next_batch(batch.inputs, batch.targets);
  return batch;
}

template <typename Stored>
void DataLoader::copy_window(const TokenShard& shard, std::span<const Stored> tokens, int64_t window,
                             int32_t* inputs, int32_t* targets) const {
  const int64_t T = options_.sequence_length;
  const int64_t limit = options_.vocab_size.value_or(int64_t{std::numeric_limits<int32_t>::max()} + 1);
  const int64_t begin = window * T;
  for (int64_t t = 0; t <= T; ++t) {
    const int64_t token = tokens[static_cast<size_t>(begin + t)];
    if (token >= limit) [[unlikely]] {
      OCTET_REQUIRE(!options_.vocab_size,
                    "token shard {}: token {} at index {} is outside the vocabulary of size {}",
                    shard.path().string(), token, begin + t, limit);
      OCTET_REQUIRE(false, "token shard {}: token {} at index {} does not fit an int32 token id",
                    shard.path().string(), token, begin + t);
    }
    if (t < T) inputs[t] = static_cast<int32_t>(token);
    if (t > 0) targets[t - 1] = static_cast<int32_t>(token);
  }
}

void DataLoader::next_batch(std::span<int32_t> inputs, std::span<int32_t> targets) {
  const int64_t B = options_.batch_size, T = options_.sequence_length;
  OCTET_CHECK(static_cast<int64_t>(inputs.size()) == B * T && static_cast<int64_t>(targets.size()) == B * T,
              "batch buffers must hold B*T={} tokens, got {} inputs and {} targets", B * T, inputs.size(),
              targets.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t shard_number = shard_order_[static_cast<size_t>(position_.shard_index)];
    const TokenShard& shard = shards_[static_cast<size_t>(shard_number)];
    const int64_t window = window_order_[static_cast<size_t>(position_.window_index)];
    int32_t* row_inputs = inputs.data() + b * T;
    int32_t* row_targets = targets.data() + b * T;
    if (shard.width() == TokenWidth::uint16) {
      copy_window(shard, shard.tokens().as_uint16(), window, row_inputs, row_targets);
    } else {
      copy_window(shard, shard.tokens().as_uint32(), window, row_inputs, row_targets);
    }
    if (++position_.window_index == static_cast<int64_t>(window_order_.size())) {
      ++position_.shard_index;
      settle();
    }
  }
}

}  // namespace octet::io
