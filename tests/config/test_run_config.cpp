// The run configuration: every key's default, the reference in docs/config.md, and one clear message for each
// kind of mistake.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/config/run_config.h"

namespace octet {
namespace {

// The message of the Error that parsing `text` (with `overrides`) throws; empty when it parses.
std::string error_of(std::string_view text, std::vector<std::string> overrides = {}) {
  try {
    parse_run_config(text, "run.toml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return {};
}

TEST(RunConfig, DefaultsRoundTripThroughToml) {
  const RunConfig defaults = parse_run_config("", "empty.toml");
  const std::string shown = to_toml(defaults);
  EXPECT_EQ(to_toml(parse_run_config(shown, "shown.toml")), shown);
  EXPECT_EQ(defaults.precision.mode, MixedPrecision::fp32);
  EXPECT_EQ(defaults.precision.recipe, RecipeKind::delayed);
  EXPECT_EQ(defaults.precision.amax_history, 16);
  EXPECT_NE(shown.find("[fp8]\nrecipe = \"delayed\""), std::string::npos) << shown;
}

TEST(RunConfig, ValuesReachTheirSettings) {
  const RunConfig c = parse_run_config(R"(
[model]
vocab_size = 256
layers = 3
[train]
mixed_precision = "fp16"
batch_size = 4
seq_len = 32
steps = 50
gemm_algorithms = "timed"
[fp8]
recipe = "block"
formats = "e4m3"
exclude = ["*.mlp.*", "h.0.*"]
[optimizer]
learning_rate = 1e-3
[scheduler]
warmup_steps = 5
[data]
dir = "shards"
)",
                                       "run.toml");
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.precision.mode, MixedPrecision::fp16);
  EXPECT_TRUE(c.train.loss_scale.dynamic) << "fp16 turns dynamic loss scaling on";
  EXPECT_EQ(c.precision.recipe, RecipeKind::block);
  EXPECT_TRUE(c.precision.all_e4m3);
  EXPECT_EQ(c.precision.exclude, (std::vector<std::string>{"*.mlp.*", "h.0.*"}));
  EXPECT_FLOAT_EQ(c.train.schedule.max_learning_rate, 1e-3f);
  EXPECT_EQ(c.train.schedule.total_steps, 50);
  EXPECT_EQ(c.data_dir, "shards");
  EXPECT_TRUE(c.time_gemm_algorithms);
  EXPECT_FALSE(parse_run_config("", "empty.toml").time_gemm_algorithms) << "heuristic is the default";
}

TEST(RunConfig, OverridesWinAndBareWordsAreStrings) {
  const RunConfig c = parse_run_config("[train]\nmixed_precision = \"bf16\"\n", "run.toml",
                                       {"train.mixed_precision=fp8", "optimizer.learning_rate=2e-4",
                                        "fp8.include=[\"h.1.*\"]", "fp8.lm_head=true"});
  EXPECT_EQ(c.precision.mode, MixedPrecision::fp8);
  EXPECT_FLOAT_EQ(c.train.schedule.max_learning_rate, 2e-4f);
  EXPECT_EQ(c.precision.include, (std::vector<std::string>{"h.1.*"}));
  EXPECT_TRUE(c.precision.lm_head);
}

TEST(RunConfig, RecomputeKeysSetTheirSettings) {
  const RunConfig off = parse_run_config("", "run.toml");
  EXPECT_FALSE(off.precision.recompute_mlp || off.precision.recompute_qkv ||
               off.precision.recompute_residual || off.precision.recompute_weight_transposes)
      << "every recompute is off by default";
  const RunConfig c = parse_run_config("[fp8]\nrecompute_qkv = true\nrecompute_residual = true\n", "run.toml",
                                       {"fp8.recompute_weight_transposes=true"});
  EXPECT_FALSE(c.precision.recompute_mlp);
  EXPECT_TRUE(c.precision.recompute_qkv);
  EXPECT_TRUE(c.precision.recompute_residual);
  EXPECT_TRUE(c.precision.recompute_weight_transposes);
  EXPECT_EQ(error_of("[fp8]\nrecompute_qkv = 1\n"),
            "run.toml:2: fp8.recompute_qkv must be true or false, got integer 1");
}

TEST(RunConfig, UnknownKeysAndSectionsSuggestTheNearest) {
  EXPECT_EQ(error_of("[train]\nbatchsize = 3\n"),
            "run.toml:2: unknown key train.batchsize; did you mean train.batch_size? (docs/config.md lists "
            "every key)");
  EXPECT_NE(error_of("[trian]\nsteps = 3\n").find("unknown section [trian]; did you mean [train]?"),
            std::string::npos);
  EXPECT_NE(error_of("steps = 3\n").find("steps is outside any section"), std::string::npos);
  EXPECT_NE(error_of("", {"optimizer.lr=1"}).find("unknown key optimizer.lr; did you mean optimizer.eps?"),
            std::string::npos);
}

TEST(RunConfig, BadValuesListTheValidOnes) {
  EXPECT_EQ(error_of("[train]\nmixed_precision = \"FP8\"\n"),
            "run.toml:2: train.mixed_precision = \"FP8\" is not valid; expected one of \"fp32\", \"bf16\", "
            "\"fp16\", "
            "\"fp8\"");
  EXPECT_NE(error_of("[fp8]\nrecipe = \"tensorwise\"\n")
                .find("expected one of \"delayed\", \"current\", \"static\", \"block\", \"mxfp8\""),
            std::string::npos);
  EXPECT_NE(error_of("[data]\ntokenizer = 5\n").find("data.tokenizer = integer 5 is not valid"),
            std::string::npos);
  EXPECT_EQ(error_of("[train]\ngemm_algorithms = \"autotune\"\n"),
            "run.toml:2: train.gemm_algorithms = \"autotune\" is not valid; expected one of \"heuristic\", "
            "\"timed\"");
}

TEST(RunConfig, WrongTypesAndRangesSayWhatWasExpected) {
  EXPECT_EQ(error_of("[train]\nbatch_size = \"eight\"\n"),
            "run.toml:2: train.batch_size must be an integer (at least 1), got string \"eight\"");
  EXPECT_EQ(error_of("[train]\nbatch_size = 2.5\n"),
            "run.toml:2: train.batch_size must be an integer (at least 1), got number 2.5");
  EXPECT_EQ(error_of("[train]\nbatch_size = 0\n"), "run.toml:2: train.batch_size must be at least 1, got 0");
  EXPECT_EQ(error_of("[optimizer]\nbeta2 = 1.0\n"), "run.toml:2: optimizer.beta2 must be [0, 1), got 1");
  EXPECT_EQ(error_of("[fp8]\namax_history = 0\n"), "run.toml:2: fp8.amax_history must be 1 to 1024, got 0");
  EXPECT_EQ(error_of("[fp8]\nlm_head = \"yes\"\n"),
            "run.toml:2: fp8.lm_head must be true or false, got string \"yes\"");
  EXPECT_NE(error_of("[fp8]\nexclude = \"*.mlp.*\"\n").find("must be a list of strings"), std::string::npos);
  EXPECT_NE(error_of("[train\nsteps = 3\n").find("run.toml:1:"), std::string::npos);
  EXPECT_NE(error_of("[train\nsteps = 3\n").find("not valid TOML"), std::string::npos);
}

TEST(RunConfig, ContradictionsAreRefusedWithTheReason) {
  EXPECT_EQ(error_of("[model]\nmax_seq_len = 64\n[train]\nseq_len = 128\n"),
            "run.toml: train.seq_len (128) is longer than model.max_seq_len (64): the model has no positions "
            "beyond it");
  EXPECT_EQ(error_of("[train]\nsteps = 10\n[scheduler]\nwarmup_steps = 20\n"),
            "run.toml: scheduler.warmup_steps (20) is more than train.steps (10)");
  EXPECT_EQ(error_of("[train]\nmixed_precision = \"fp32\"\nweight_gradients = \"bf16\"\n"),
            "run.toml: train.weight_gradients = \"bf16\" needs train.mixed_precision = \"bf16\" or \"fp8\" "
            "(weight-gradient GEMMs that round to bf16), got \"fp32\"");
  EXPECT_EQ(
      error_of("[train]\nweight_gradients = \"fp16\"\n"),
      "run.toml:2: train.weight_gradients = \"fp16\" is not valid; expected one of \"float32\", \"bf16\"");
  EXPECT_EQ(error_of("[model]\nchannels = 30\nheads = 4\n"),
            "run.toml: model.channels (30) must be a multiple of model.heads (4)");
  EXPECT_EQ(error_of("[model]\nvocab_size = 256\n[data]\ntokenizer = \"gpt2\"\n"),
            "run.toml: model.vocab_size (256) is smaller than the gpt2 tokenizer's vocabulary (50257)");
}

TEST(RunConfig, TheReferenceInDocsHoldsEveryKey) {
  std::string table = "| key | type | default | valid values | meaning |\n|---|---|---|---|---|\n";
  for (const ConfigKeyInfo& k : config_keys()) {
    table += "| `" + k.name + "` | " + k.type + " | `" + k.default_value + "` | " + k.valid + " | " +
             k.description + " |\n";
  }
  std::ifstream in(std::filesystem::path(OCTET_SOURCE_DIR) / "docs" / "config.md");
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string text = doc.str();
  const size_t begin = text.find("<!-- config-keys:begin -->\n"), end = text.find("<!-- config-keys:end -->");
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(text.substr(begin + 27, end - begin - 27), table)
      << "docs/config.md is out of date: paste the output of `octet config keys` between its markers";
}

}  // namespace
}  // namespace octet
