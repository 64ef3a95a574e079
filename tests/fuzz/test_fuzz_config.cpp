// Fuzzing the configuration reader: mutated TOML files and `--set` overrides, from the project's own
// configurations and the resolved defaults. Every case ends in a configuration or one clean refusal, and an
// accepted configuration round-trips: to_toml's text parses back to the same text.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "fuzz_harness.h"
#include "octet/check.h"
#include "octet/config/run_config.h"

namespace octet {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> config_corpus() {
  const std::filesystem::path root = OCTET_SOURCE_DIR;
  std::vector<std::string> corpus;
  for (const char* name : {"configs/quickstart.toml", "configs/bench/gpt2-124M.toml",
                           "configs/bench/gpt2-350M.toml", "configs/bench/gpt2-1.5B.toml"}) {
    corpus.push_back(read_text(root / name));
    EXPECT_FALSE(corpus.back().empty()) << name;
  }
  corpus.push_back(to_toml(parse_run_config("", "defaults")));
  corpus.push_back(
      "[data]\ndir = 'C:\\\\data \"x\"'\n[fp8]\nexclude = [\"h.0.*\", '''*.mlp.*''']\n[train]\nsteps = 7\n");
  return corpus;
}

bool replaying() {
  return std::getenv("OCTET_FUZZ_CASE") != nullptr;
}

// Parses and checks that an accepted configuration round-trips through to_toml.
void parse_and_round_trip(const std::string& text, const std::vector<std::string>& overrides) {
  const RunConfig config = parse_run_config(text, "fuzz.toml", overrides);
  const std::string shown = to_toml(config);
  std::string again;
  try {
    again = to_toml(parse_run_config(shown, "shown.toml"));
  } catch (const Error& e) {
    throw fuzz::PropertyFailure{std::string("to_toml's output does not parse: ") + e.what()};
  }
  if (again != shown) throw fuzz::PropertyFailure{"to_toml's output parses to another configuration"};
}

TEST(FuzzConfig, MutatedFilesParseOrAreRefusedCleanly) {
  const std::vector<std::string> corpus = config_corpus();
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(20261126);
  const int cases = fuzz::scaled_cases(6000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    const std::string text = fuzz::mutate(corpus[rng() % corpus.size()], corpus, rng);
    if (replaying()) std::ofstream("fuzz-case.toml", std::ios::binary) << text;  // the replayed input
    campaign.record(i, fuzz::run_case([&] { parse_and_round_trip(text, {}); }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (std::getenv("OCTET_FUZZ_CASE") == nullptr) {
    EXPECT_GT(campaign.refused, 0);
  }
}

TEST(FuzzConfig, MutatedOverridesApplyOrAreRefusedCleanly) {
  const std::vector<std::string> corpus = config_corpus();
  const std::vector<std::string> overrides = {
      "train.mixed_precision=fp8", "optimizer.learning_rate=2e-4", "fp8.include=[\"h.1.*\"]",
      "fp8.lm_head=true",          "data.dir=shards/a b",          "logging.run_dir=\"runs/x\"",
      "model.vocab_size=50257",    "train.batch_size=4",           "loss_scale.initial_scale=65536.0",
      "fp8.alert_scale_jump=8"};
  fuzz::Campaign campaign;
  campaign.seed = fuzz::seed_from_environment(77);
  const int cases = fuzz::scaled_cases(3000);
  for (int i = 0; i < cases; ++i) {
    if (!fuzz::selected(i)) continue;
    std::mt19937_64 rng = fuzz::case_rng(campaign.seed, i);
    std::vector<std::string> set;
    const size_t count = 1 + rng() % 3;
    for (size_t k = 0; k < count; ++k) {
      const std::string& base = overrides[rng() % overrides.size()];
      set.push_back(rng() % 4 == 0 ? base : fuzz::mutate(base, overrides, rng));
    }
    const std::string& text = corpus[rng() % corpus.size()];
    campaign.record(i, fuzz::run_case([&] { parse_and_round_trip(text, set); }));
  }
  std::printf("%s\n", campaign.summary().c_str());
  EXPECT_TRUE(campaign.failures.empty()) << campaign.summary();
  if (std::getenv("OCTET_FUZZ_CASE") == nullptr) {
    EXPECT_GT(campaign.refused, 0);
    EXPECT_GT(campaign.accepted, 0);
  }
}

}  // namespace
}  // namespace octet
