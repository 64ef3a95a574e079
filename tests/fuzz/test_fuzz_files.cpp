// Fuzzing the binary readers: token shards (opened and read through a data loader with a vocabulary),
// tiktoken vocabularies (Llama 3's tokenizer file), safetensors files, and checkpoints (state.json, and
// optimizer.safetensors, loaded into a model; a checkpoint of shards' manifest and shard files). Mutations of valid files, each case in a forked child under a
// time limit, must load or be refused with one line.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "checkpoint_fixture.h"
#include "fuzz_harness.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/io/data_loader.h"
#include "octet/io/llama3_tokenizer.h"
#include "octet/io/safetensors.h"
#include "octet/io/token_shard.h"
#include "octet/dist/in_process.h"
#include "octet/train/checkpoint.h"
#include "octet/train/checkpoint_shards.h"
#include "octet/train/data_parallel.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

bool replaying() {
  return std::getenv("OCTET_FUZZ_CASE") != nullptr;
}

TEST(FuzzFiles, TokenShards) {
  testing::ScratchDir dir;
  std::vector<std::string> corpus;
  const std::vector<std::pair<int, io::TokenWidth>> seeds = {
      {64, io::TokenWidth::uint16}, {37, io::TokenWidth::uint32}, {0, io::TokenWidth::uint16}, {9, io::TokenWidth::uint16}};
  for (const auto& [count, width] : seeds) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < count; ++i) tokens.push_back((i * 37 + 11) % 300);
    io::write_token_shard(dir.path() / "seed.bin", tokens, width);
    corpus.push_back(read_bytes(dir.path() / "seed.bin"));
  }
  fuzz::MutatorOptions options;
  options.binary = true;
  options.hot_begin = 0;
  options.hot_end = 16;
  const fs::path shard = dir.path() / "train_000000.bin";
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(5);
  const int cases = fuzz::scaled_cases(3000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    write_bytes(shard, fuzz::mutate(corpus[rng() % corpus.size()], corpus, rng, options));
    campaign.record(i, fuzz::run_case([&] {
      io::DataLoaderOptions loader_options;
      loader_options.batch_size = 2;
      loader_options.sequence_length = 4;
      loader_options.vocab_size = 300;
      io::DataLoader loader(dir.path(), io::DataSplit::train, loader_options);
      for (int b = 0; b < 20; ++b) loader.next_batch();
    }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (!replaying()) {
    EXPECT_GT(campaign.accepted, 0);
  }
}

// Mutations of small tiktoken files, read from disk: a valid file gives each token's bytes in rank order,
// anything else one line naming the file.
TEST(FuzzFiles, TiktokenVocabularies) {
  testing::ScratchDir dir;
  const std::vector<std::string> corpus = {"IQ== 0\nIg== 1\nIw== 2\nJA== 3\nIGE= 4\naGVsbG8= 5\n",
                                           "AA== 0\n/w== 1\n4pyT 2\n8J+mmQ== 3\n",
                                           "YQ== 0\n\nYmM= 1\nIA== 2"};
  const fs::path path = dir.path() / "llama3.tiktoken";
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(11);
  const int cases = fuzz::scaled_cases(2000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const std::string text = fuzz::mutate(corpus[rng() % corpus.size()], corpus, rng);
    write_bytes(path, text);
    campaign.record(
        i, fuzz::run_case([&] {
          const std::vector<std::string> tokens = io::read_tiktoken_vocabulary(path);
          // Accepted: one token per non-empty line, none empty or repeated.
          size_t lines = 0;
          for (size_t start = 0; start < text.size();) {
            const size_t end = std::min(text.find('\n', start), text.size());
            if (end > start) ++lines;
            start = end + 1;
          }
          if (tokens.size() != lines) throw fuzz::PropertyFailure{"a token per non-empty line"};
          std::vector<std::string> sorted = tokens;
          std::sort(sorted.begin(), sorted.end());
          if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front().empty()) {
            throw fuzz::PropertyFailure{"tokens are distinct and non-empty"};
          }
        }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (!replaying()) {
    EXPECT_GT(campaign.accepted, 0);
    EXPECT_GT(campaign.refused, 0);
  }
}

TEST(FuzzFiles, Safetensors) {
  testing::ScratchDir dir;
  std::vector<std::string> corpus;
  const std::vector<float> a = {1.0f, -2.0f, 3.5f, 0.25f, 8.0f, 9.0f}, b = {7.0f}, empty;
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<io::SafetensorsEntry> entries = {{"wte", {2, 3}, a}, {"h.0.bias", {1}, b}};
    if (variant == 1) entries.push_back({"nothing", {0, 4}, empty});
    std::map<std::string, std::string> metadata;
    if (variant != 2) metadata = {{"format", "pt"}, {"config", "{\"n_layer\": 1}"}};
    io::write_safetensors(dir.path() / "seed.safetensors", entries, metadata);
    corpus.push_back(read_bytes(dir.path() / "seed.safetensors"));
  }
  const fs::path file = dir.path() / "case.safetensors";
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(11);
  const int cases = fuzz::scaled_cases(3000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const std::string& seed = corpus[rng() % corpus.size()];
    uint64_t header_length = 0;
    std::memcpy(&header_length, seed.data(), 8);
    fuzz::MutatorOptions options;
    options.binary = true;
    options.hot_begin = 0;
    options.hot_end = 8 + header_length;
    // Mostly the header: mutate it as text and put the length back in front, or mutate the whole file.
    std::string bytes;
    if (rng() % 3 != 0) {
      const std::string header = fuzz::mutate(seed.substr(8, header_length), {}, rng);
      const uint64_t length = rng() % 4 == 0 ? header_length : header.size();
      bytes = std::string(reinterpret_cast<const char*>(&length), 8) + header + seed.substr(8 + header_length);
    } else {
      bytes = fuzz::mutate(seed, corpus, rng, options);
    }
    write_bytes(file, bytes);
    campaign.record(i, fuzz::run_case([&] { io::read_safetensors(file); }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (!replaying()) {
    EXPECT_GT(campaign.accepted, 0);
  }
}

TEST(FuzzFiles, Checkpoints) {
  testing::ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), testing::tiny_config().vocab_size);
  testing::TrainingProcess run(testing::tiny_config(), MixedPrecision::fp8, shard);
  run.train(2);
  TrainingProgress progress = run.progress();
  progress.config = to_toml(parse_run_config("[model]\nvocab_size = 256\n", "fuzz.toml"));
  const fs::path saved = save_checkpoint(dir.path() / "run", *run.model, *run.trainer, progress);
  const std::string state = read_bytes(saved / "state.json");
  const std::string optimizer = read_bytes(saved / "optimizer.safetensors");
  // A fresh target, as `octet eval` builds one.
  testing::TrainingProcess target(testing::tiny_config(), MixedPrecision::fp8, shard);
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(23);
  const int cases = fuzz::scaled_cases(1500);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const bool state_case = rng() % 4 != 0;
    if (state_case) {
      write_bytes(saved / "state.json", fuzz::mutate(state, {state}, rng));
    } else {
      fuzz::MutatorOptions options;
      options.binary = true;
      options.hot_end = 4096;
      write_bytes(saved / "optimizer.safetensors", fuzz::mutate(optimizer, {optimizer}, rng, options));
    }
    campaign.record(i, fuzz::run_case([&] {
      parse_run_config(checkpoint_config(saved), "state.json");
      load_checkpoint(saved, *target.model, *target.trainer);
      list_checkpoints(dir.path() / "run");
    }));
    write_bytes(saved / "state.json", state);
    write_bytes(saved / "optimizer.safetensors", optimizer);
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (!replaying()) {
    EXPECT_GT(campaign.accepted, 0);
  }
}

TEST(FuzzFiles, CheckpointsOfShards) {
  testing::ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), testing::tiny_config().vocab_size);
  // Two ranks with a sharded optimizer state save a checkpoint of shards.
  fs::path saved;
  dist::run_ranks(2, [&](dist::Communicator& c) {
    testing::TrainingProcess rank(testing::tiny_config(), MixedPrecision::fp8, shard);
    rank.trainer = std::make_unique<Trainer>(*rank.model, testing::checkpoint_settings(),
                                             DataParallel{.communicator = &c, .shard_optimizer_state = true});
    rank.train(1);
    const fs::path path = save_checkpoint(dir.path() / "run", *rank.model, *rank.trainer, rank.progress());
    if (c.rank() == 0) saved = path;
  });
  ASSERT_TRUE(fs::exists(saved / kShardManifestFile));
  const std::vector<std::string> files = {kShardManifestFile, optimizer_shard_file_name(0, 2),
                                          optimizer_shard_file_name(1, 2)};
  std::vector<std::string> good;
  for (const std::string& f : files) good.push_back(read_bytes(saved / f));
  testing::TrainingProcess target(testing::tiny_config(), MixedPrecision::fp8, shard);
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(29);
  const int cases = fuzz::scaled_cases(1000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const size_t which = rng() % 4 == 0 ? 1 + rng() % 2 : 0;  // the manifest three times in four
    fuzz::MutatorOptions options;
    options.binary = which != 0;
    write_bytes(saved / files[which], fuzz::mutate(good[which], {good[which]}, rng, options));
    campaign.record(i, fuzz::run_case([&] {
      list_checkpoints(dir.path() / "run");
      checkpoint_to_continue(dir.path() / "run");
      load_checkpoint(saved, *target.model, *target.trainer);
    }));
    write_bytes(saved / files[which], good[which]);
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (!replaying()) {
    EXPECT_GT(campaign.accepted, 0);
  }
}

}  // namespace
}  // namespace octet
