// Fuzzing through the built binary: `octet config show` on mutated configurations, `octet eval` on a
// checkpoint with a mutated state.json or optimizer.safetensors, and `octet train` on a mutated token shard
// with a tiny model. Each run is under a time limit and must exit 0, or 2 with one line on standard error and
// nothing on standard output; a refused train must not create its run directory, and eval writes nothing.
#include <csignal>
#include <filesystem>
#include <fstream>

#include "command_util.h"
#include "fuzz_harness.h"
#include "octet/io/token_shard.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::CommandScratch;
using testing::run_octet_limited;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every file under `dir` with its size, to see that a command wrote nothing.
std::vector<std::pair<std::string, uintmax_t>> listing(const fs::path& dir) {
  std::vector<std::pair<std::string, uintmax_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    files.emplace_back(e.path().string(), e.is_regular_file() ? e.file_size() : 0);
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Records one run: exit 0, or a clean refusal; anything else is a failure naming the case.
void record(fuzz::Campaign& campaign, int index, const testing::ProcessResult& r, bool wrote_nothing) {
  if (r.exit_code == 0) {
    campaign.record(index, fuzz::Outcome::accepted);
  } else if (testing::is_refusal(r) && wrote_nothing) {
    campaign.record(index, fuzz::Outcome::refused);
  } else {
    const fuzz::Outcome outcome = r.term_signal == SIGALRM ? fuzz::Outcome::hung
                                  : r.term_signal != 0      ? fuzz::Outcome::crashed
                                                            : fuzz::Outcome::bad_message;
    campaign.record(index, outcome);
    std::printf("case %d: exit %d, signal %d, wrote %s, stderr: %s\n", index, r.exit_code, r.term_signal,
                wrote_nothing ? "nothing" : "files", r.err.substr(0, 300).c_str());
  }
}

void write_shards(const fs::path& dir) {
  fs::create_directories(dir);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(3 + (i * 7) % 200);
  io::write_token_shard(dir / "train_000000.bin", tokens, io::TokenWidth::uint16);
  io::write_token_shard(dir / "val_000000.bin", tokens, io::TokenWidth::uint16);
}

TEST(FuzzCommands, ConfigShow) {
  CommandScratch dir;
  const std::vector<std::string> corpus = {
      read_bytes(fs::path(OCTET_SOURCE_DIR) / "configs/quickstart.toml"),
      read_bytes(fs::path(OCTET_SOURCE_DIR) / "configs/bench/gpt2-124M.toml"),
      testing::tiny_run_config(dir / "shards", dir / "run")};
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(31);
  const int cases = fuzz::scaled_cases(400);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    write_bytes(dir / "case.toml", fuzz::mutate(corpus[rng() % corpus.size()], corpus, rng));
    const testing::ProcessResult r = run_octet_limited({"config", "show", (dir / "case.toml").string()}, 30);
    record(campaign, i, r, true);
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
}

TEST(FuzzCommands, EvalOnAMutatedCheckpoint) {
  CommandScratch dir;
  write_shards(dir / "shards");
  write_bytes(dir / "run.toml", testing::tiny_run_config(dir / "shards", dir / "run"));
  const testing::ProcessResult trained = run_octet_limited({"train", (dir / "run.toml").string()});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const fs::path checkpoint = dir / "run" / "checkpoints" / "step_000002";
  const std::string state = read_bytes(checkpoint / "state.json");
  const std::string optimizer = read_bytes(checkpoint / "optimizer.safetensors");
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(37);
  const int cases = fuzz::scaled_cases(120);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    if (rng() % 3 != 0) {
      write_bytes(checkpoint / "state.json", fuzz::mutate(state, {state}, rng));
    } else {
      fuzz::MutatorOptions options;
      options.binary = true;
      options.hot_end = 2048;
      write_bytes(checkpoint / "optimizer.safetensors", fuzz::mutate(optimizer, {optimizer}, rng, options));
    }
    const auto before = listing(dir.path());
    const testing::ProcessResult r = run_octet_limited({"eval", checkpoint.string(), "--device", "cpu"}, 60);
    record(campaign, i, r, listing(dir.path()) == before);
    write_bytes(checkpoint / "state.json", state);
    write_bytes(checkpoint / "optimizer.safetensors", optimizer);
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
}

TEST(FuzzCommands, TrainOnAMutatedShard) {
  CommandScratch dir;
  write_shards(dir / "shards");
  const std::string shard = read_bytes(dir / "shards" / "train_000000.bin");
  write_bytes(dir / "run.toml", testing::tiny_run_config(dir / "shards", dir / "run", 1));
  fuzz::MutatorOptions options;
  options.binary = true;
  options.hot_end = 16;
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(41);
  const int cases = fuzz::scaled_cases(120);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    write_bytes(dir / "shards" / "train_000000.bin", fuzz::mutate(shard, {shard}, rng, options));
    fs::remove_all(dir / "run");
    const testing::ProcessResult r = run_octet_limited({"train", (dir / "run.toml").string()}, 60);
    record(campaign, i, r, !fs::exists(dir / "run"));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
}

}  // namespace
}  // namespace octet
