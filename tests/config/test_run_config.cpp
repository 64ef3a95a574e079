// The run configuration: every key's default, the reference in docs/config.md, and one clear message for each
// kind of mistake.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "files.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "parse_errors.h"

namespace octet {
namespace {

using testing::error_of;

TEST(RunConfig, DefaultsRoundTripThroughToml) {
  const RunConfig defaults = parse_run_config("", "empty.toml");
  const std::string shown = to_toml(defaults);
  EXPECT_EQ(to_toml(parse_run_config(shown, "shown.toml")), shown);
  EXPECT_EQ(defaults.precision.mode, MixedPrecision::fp32);
  EXPECT_EQ(defaults.precision.recipe, RecipeKind::delayed);
  EXPECT_EQ(defaults.precision.amax_history, 16);
  EXPECT_NE(shown.find("[fp8]\nrecipe = \"delayed\""), std::string::npos) << shown;
}

TEST(RunConfig, ModelArchIsGpt2UnlessSaidAndRefusesOthers) {
  EXPECT_EQ(parse_run_config("", "empty.toml").model.arch, ModelArchitecture::gpt2);
  EXPECT_EQ(parse_run_config("[model]\narch = \"gpt2\"\n", "run.toml").model.arch, ModelArchitecture::gpt2);
  EXPECT_EQ(parse_run_config("[model]\narch = \"llama\"\n", "run.toml").model.arch, ModelArchitecture::llama);
  EXPECT_NE(to_toml(parse_run_config("", "empty.toml")).find("[model]\narch = \"gpt2\"\n"),
            std::string::npos);
  EXPECT_EQ(error_of("", {"model.arch=gpt3"}),
            "--set model.arch=gpt3: model.arch = \"gpt3\" is not valid; expected one of \"gpt2\", \"llama\"");
}

TEST(RunConfig, LlamaShapesAreCheckedAsAWhole) {
  EXPECT_EQ(error_of("[model]\narch = \"llama\"\nheads = 12\nkv_heads = 5\n"),
            "run.toml: model.kv_heads (5) must divide model.heads (12) (0: as many as heads)");
  EXPECT_EQ(error_of("[model]\nkv_heads = 4\n"),
            "run.toml: model.kv_heads (4) is for Llama; GPT-2 has as many key and value heads as heads (12)");
  EXPECT_EQ(error_of("[model]\narch = \"llama\"\nchannels = 36\nheads = 4\n"),
            "run.toml: the head size model.channels / model.heads (9) must be even for the rotary embedding");
  const RunConfig c =
      parse_run_config("[model]\narch = \"llama\"\nchannels = 2048\nkv_heads = 4\nheads = 32\n", "run.toml");
  EXPECT_EQ(c.model.hidden(), 5632);  // 8 x 2048 / 3 = 5461, rounded up to a multiple of 256
  EXPECT_EQ(c.model.qkv_width(), 2048 + 2 * 4 * 64);
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

TEST(RunConfig, ActivationCheckpointingNamesItsLevel) {
  EXPECT_EQ(parse_run_config("", "run.toml").precision.activation_checkpointing,
            ActivationCheckpointing::none);
  EXPECT_EQ(parse_run_config("[train]\nactivation_checkpointing = \"selective\"\n", "run.toml")
                .precision.activation_checkpointing,
            ActivationCheckpointing::selective);
  const RunConfig full = parse_run_config("[train]\nactivation_checkpointing = \"none\"\n", "run.toml",
                                          {"train.activation_checkpointing=full", "fp8.recompute_mlp=true"});
  EXPECT_EQ(full.precision.activation_checkpointing, ActivationCheckpointing::full);
  EXPECT_TRUE(full.precision.recompute_mlp) << "checkpointing composes with the fp8.recompute_* settings";
  EXPECT_NE(to_toml(full).find("activation_checkpointing = \"full\""), std::string::npos) << to_toml(full);
  EXPECT_EQ(
      error_of("[train]\nactivation_checkpointing = \"partial\"\n"),
      "run.toml:2: train.activation_checkpointing = \"partial\" is not valid; expected one of \"none\", "
      "\"selective\", \"full\"");
  EXPECT_EQ(
      error_of("[train]\nactivation_checkpointing = true\n"),
      "run.toml:2: train.activation_checkpointing = boolean true is not valid; expected one of \"none\", "
      "\"selective\", \"full\"");
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
            "run.toml:2: train.batch_size must be an integer (1 to 1048576), got string \"eight\"");
  EXPECT_EQ(error_of("[train]\nbatch_size = 2.5\n"),
            "run.toml:2: train.batch_size must be an integer (1 to 1048576), got number 2.5");
  EXPECT_EQ(error_of("[train]\nbatch_size = 0\n"),
            "run.toml:2: train.batch_size must be 1 to 1048576, got 0");
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

TEST(RunConfig, DeepNestingIsRefusedBeforeParsing) {
  std::string dotted = "[model]\n";
  for (int i = 0; i < 200000; ++i) dotted += "a.";
  dotted += "a = 1\n";
  EXPECT_NE(error_of(dotted).find("run.toml:2: a key nested more than 8 levels deep"), std::string::npos);
  std::string header = "[";
  for (int i = 0; i < 200000; ++i) header += "a.";
  header += "a]\n";
  EXPECT_NE(error_of(header).find("run.toml:1: a key nested more than 8 levels deep"), std::string::npos);
  const std::string arrays = "[fp8]\nexclude = " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  EXPECT_NE(error_of(arrays).find("run.toml:2: arrays or inline tables nested more than 16 deep"),
            std::string::npos);
  EXPECT_NE(error_of("", {"fp8.exclude=" + std::string(1000, '[')}).find("nested more than 16 deep"),
            std::string::npos);
  // Ordinary dotted keys, strings holding brackets and dots, and comments are not nesting.
  EXPECT_EQ(
      error_of(
          "train.steps = 5 # a.b.c.d.e.f.g.h.i.j [[[[[[[[[[[[[[[[[[\n"
          "[data]\ndir = \"a.b.c.d.e.f.g.h.i.j.[[[[[[[[[[[[[[[[[[[[[[\"\n"
          "[fp8]\nexclude = ['[[[[[[[[[[[[[[[[[[[[[[[[.......', \"\"\"\n.....[[[[[[[[[[[[[[[[[[[\"\"\"]\n"),
      "");
}

TEST(RunConfig, ShapeKeysAreBoundedSoThatEverySizeFits) {
  EXPECT_EQ(error_of("[model]\nvocab_size = 9223372036854775807\n"),
            "run.toml:2: model.vocab_size must be 2 to 2147483647, got 9223372036854775807");
  EXPECT_EQ(error_of("[model]\npadded_vocab_size = 9223372036854775000\n"),
            "run.toml:2: model.padded_vocab_size must be 0 to 2147483647, got 9223372036854775000");
  EXPECT_EQ(error_of("[model]\nchannels = 4611686018427387904\n"),
            "run.toml:2: model.channels must be 1 to 1048576, got 4611686018427387904");
  EXPECT_EQ(error_of("[train]\nbatch_size = 4294967296\n"),
            "run.toml:2: train.batch_size must be 1 to 1048576, got 4294967296");
  // Each key within its range, but their products beyond what octet can address.
  const std::string big_model =
      "[model]\nvocab_size = 2147483647\nchannels = 1048576\nheads = 1\nlayers = 65536\n";
  EXPECT_NE(error_of(big_model).find("parameters, more than"), std::string::npos) << error_of(big_model);
  const std::string big_batch =
      "[model]\nvocab_size = 2147483647\nmax_seq_len = 1048576\n[train]\nbatch_size = 1048576\nseq_len = "
      "1048576\n";
  EXPECT_NE(error_of(big_batch).find("more than"), std::string::npos) << error_of(big_batch);
}

TEST(RunConfig, NumbersMustBeFiniteAsFloat32) {
  EXPECT_EQ(
      error_of("[optimizer]\nlearning_rate = 1e300\n"),
      "run.toml:2: optimizer.learning_rate must be greater than 0, got 1e+300, which is inf as float32");
  EXPECT_EQ(error_of("", {"optimizer.learning_rate=1e-50"}),
            "--set optimizer.learning_rate=1e-50: optimizer.learning_rate must be greater than 0, got 1e-50, "
            "which is 0 as float32");
  EXPECT_NE(error_of("[optimizer]\nbeta1 = 0.999999999\n").find("which is 1 as float32"), std::string::npos);
  EXPECT_NE(error_of("[optimizer]\nweight_decay = 4e38\n").find("which is inf as float32"),
            std::string::npos);
  EXPECT_NE(error_of("[loss_scale]\ngrowth_factor = inf\n").find("got inf"), std::string::npos);
  EXPECT_EQ(error_of("[optimizer]\nlearning_rate = 3e38\n"), "");
}

TEST(RunConfig, OverridesAreOneLine) {
  EXPECT_EQ(
      error_of("", {"data.dir=shards\nlogging.run_dir = \"elsewhere\""}),
      "--set data.dir=shards\\x0alogging.run_dir = \"elsewhere\": the value must be one line (it holds a "
      "line break)");
  EXPECT_NE(error_of("", {"train.steps=5\r"}).find("must be one line"), std::string::npos);
}

TEST(RunConfig, PathsWithQuotesAndBackslashesRoundTrip) {
  const RunConfig c = parse_run_config("[data]\ndir = 'C:\\shards \"x\"'\n", "run.toml",
                                       {"logging.run_dir=runs/a\\b\"c\"\\", "fp8.exclude=['a\"\\b']"});
  EXPECT_EQ(c.data_dir.string(), "C:\\shards \"x\"");
  EXPECT_EQ(c.run_dir.string(), "runs/a\\b\"c\"\\");
  const std::string shown = to_toml(c);
  const RunConfig back = parse_run_config(shown, "shown.toml");
  EXPECT_EQ(back.data_dir, c.data_dir);
  EXPECT_EQ(back.run_dir, c.run_dir);
  EXPECT_EQ(back.precision.exclude, std::vector<std::string>{"a\"\\b"});
  EXPECT_EQ(to_toml(back), shown);
  const RunConfig unicode = parse_run_config("[data]\ndir = \"d\u00e9j\u00e0/\u6570\u636e\"\n", "run.toml");
  EXPECT_EQ(to_toml(parse_run_config(to_toml(unicode), "shown.toml")), to_toml(unicode));
}

TEST(RunConfig, PathsMustBeValidUtf8WithoutControlCharacters) {
  EXPECT_EQ(
      error_of("", {"data.dir=shards\xff"}),
      "--set data.dir=shards\\xff: data.dir is not valid UTF-8 (byte 6 of the value); paths must be UTF-8 "
      "text");
  EXPECT_EQ(error_of("[logging]\nrun_dir = \"runs\\u0007x\"\n"),
            "run.toml:2: logging.run_dir holds a control character (byte 4 of the value); paths must be "
            "printable text");
}

TEST(RunConfig, StringsAreBoundedSoThatTheSavedConfigStaysReadable) {
  EXPECT_EQ(
      error_of("", {"data.dir=" + std::string(5000, 'd')}),
      "--set data.dir=" + std::string(91, 'd') + "...: data.dir is 5000 bytes long; a path has at most 4096");
  std::string many = "[fp8]\nexclude = [";
  for (int i = 0; i < 300; ++i) many += "\"h.0.*\", ";
  EXPECT_EQ(error_of(many + "]\n"), "run.toml:2: fp8.exclude holds 300 globs; at most 256 are allowed");
  EXPECT_NE(
      error_of("[fp8]\ninclude = [\"h.\\u0001\"]\n").find("a glob is printable text of at most 256 bytes"),
      std::string::npos);
}

TEST(RunConfig, NonAsciiOutsideStringsNeverReachesTheParser) {
  // toml++ 3.3 reaches __builtin_unreachable testing such characters for whitespace (UBSan reports it).
  EXPECT_EQ(
      error_of("[data]\ndir = \"d\"\neval_every = 5 \u00e9\n"),
      "run.toml:3: not valid TOML: a non-ASCII character outside a string or comment (keys, numbers and "
      "booleans are ASCII; put text in quotes)");
  EXPECT_EQ(error_of("# caf\u00e9\n[data] # \u00e9\ndir = \"caf\u00e9\"\n"), "");
  const RunConfig c =
      parse_run_config("", "run.toml", {"data.dir=d\u00e9j\u00e0 vu", "logging.run_dir=\u00e9"});
  EXPECT_EQ(c.data_dir.string(), "d\u00e9j\u00e0 vu");
  EXPECT_EQ(c.run_dir.string(), "\u00e9");
}

TEST(RunConfig, TableHeadersMustNameATable) {
  // toml++ 3.3 assumes a key there (undefined behaviour otherwise; its debug builds assert).
  for (const char* text : {"[[[train]]]\n", "[\n", "  [ ]\n", "[[ =]]\n", "[train]\n[[#]]\n"}) {
    EXPECT_NE(error_of(text).find("not valid TOML: a table header must name a table"), std::string::npos)
        << text << ": " << error_of(text);
  }
  EXPECT_EQ(error_of("  [ train ]\n[ \"data\" ]\ndir = \"[[x\"\n"), "");
}

TEST(RunConfig, ParserMessagesAreOneLine) {
  // The TOML parser's own description may quote the input, line break included.
  const std::string message = error_of("[fp8]\nlm_head = f\n\n");
  EXPECT_NE(message.find("not valid TOML"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(RunConfig, EchoedInputIsShortAndEscaped) {
  const std::string huge_key = std::string(1'000'000, 'k');
  const std::string unknown = error_of("[train]\n" + huge_key + " = 1\n");
  EXPECT_LT(unknown.size(), 300u) << unknown.substr(0, 300);
  EXPECT_NE(unknown.find("train.kkkk"), std::string::npos);
  EXPECT_NE(unknown.find("..."), std::string::npos);
  const std::string overridden = error_of("", {"train.device=\x1b[31mgpu" + std::string(100000, 'x')});
  EXPECT_LT(overridden.size(), 400u) << overridden.substr(0, 400);
  EXPECT_EQ(overridden.find('\x1b'), std::string::npos);
  EXPECT_NE(overridden.find("\\x1b[31mgpu"), std::string::npos) << overridden;
  const std::string value = error_of("[train]\nbatch_size = \"" + std::string(5000, 'b') + "\"\n");
  EXPECT_LT(value.size(), 300u);
}

TEST(RunConfig, ConfigFileMustBeARegularFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("octet-config-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  try {
    load_run_config(dir);
    ADD_FAILURE() << "a directory was read as a config";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(std::string(e.what()),
              "config file " + dir.string() + " is a directory; CONFIG must be a TOML file (docs/config.md)");
  }
  {
    // A FIFO is refused at once instead of waiting for a writer.
    const testing::FifoWithLateWriter fifo(dir / "fifo.toml");
    const auto began = std::chrono::steady_clock::now();
    std::string message;
    try {
      load_run_config(fifo.path());
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(2));
    EXPECT_NE(message.find("is a FIFO, not a regular file"), std::string::npos) << message;
  }
  std::filesystem::remove_all(dir);
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
