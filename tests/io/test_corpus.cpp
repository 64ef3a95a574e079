// Preparing text files into shards: the exact token stream (end-of-text before each document), the
// every-k-th-document validation rule, paragraph documents, shard size limits, stale shards, and errors.
#include <string>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "octet/io/corpus.h"
#include "octet/io/token_shard.h"

namespace octet::io {
namespace {

using octet::testing::directory_listing;
using octet::testing::invalid_input_message;
using octet::testing::TempDir;
using octet::testing::write_file;

constexpr int32_t kEot = ByteTokenizer::kEndOfText;

std::vector<int32_t> shard_tokens(const std::filesystem::path& path) {
  TokenShard shard = TokenShard::open(path);
  std::vector<int32_t> tokens;
  for (uint16_t token : shard.tokens().as_uint16()) tokens.push_back(token);
  return tokens;
}

// The token stream prepare_text_shards should write for these documents: each preceded by end-of-text.
std::vector<int32_t> stream(const std::vector<std::string>& documents) {
  std::vector<int32_t> tokens;
  for (const auto& document : documents) {
    tokens.push_back(kEot);
    for (char c : document) tokens.push_back(static_cast<unsigned char>(c));
  }
  return tokens;
}

std::vector<std::filesystem::path> write_documents(const TempDir& dir,
                                                   const std::vector<std::string>& documents) {
  std::filesystem::create_directories(dir / "text");
  std::vector<std::filesystem::path> files;
  for (size_t i = 0; i < documents.size(); ++i) {
    files.push_back(dir / ("text/doc" + std::to_string(i) + ".txt"));
    write_file(files.back(), documents[i]);
  }
  return files;
}

TEST(PrepareTextShards, EveryKthDocumentGoesToValidation) {
  TempDir dir;
  const std::vector<std::string> docs = {"first\n", "second caf\xC3\xA9\n", "third", "fourth\n\n", "fifth"};
  const auto files = write_documents(dir, docs);
  PrepareOptions options;
  options.validation_every = 2;
  const PrepareSummary summary = prepare_text_shards(files, ByteTokenizer(), dir / "out", options);
  EXPECT_EQ(summary.train_documents, 3);
  EXPECT_EQ(summary.validation_documents, 2);
  ASSERT_EQ(summary.train_shards, std::vector<std::filesystem::path>{dir / "out/train_000000.bin"});
  ASSERT_EQ(summary.validation_shards, std::vector<std::filesystem::path>{dir / "out/val_000000.bin"});
  EXPECT_EQ(shard_tokens(dir / "out/train_000000.bin"), stream({docs[0], docs[2], docs[4]}));
  EXPECT_EQ(shard_tokens(dir / "out/val_000000.bin"), stream({docs[1], docs[3]}));
  EXPECT_EQ(summary.train_tokens, static_cast<int64_t>(stream({docs[0], docs[2], docs[4]}).size()));
  EXPECT_EQ(summary.validation_tokens, static_cast<int64_t>(stream({docs[1], docs[3]}).size()));
  EXPECT_EQ(directory_listing(dir / "out"), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
}

TEST(PrepareTextShards, ParagraphsAsDocuments) {
  TempDir dir;
  // Blank lines (empty or whitespace only) separate paragraphs; lines within a paragraph stay joined.
  const auto files = write_documents(dir, {"\nalpha\n\n \t\nbeta one\nbeta two\n\n\n", "gamma\r\n\r\ndelta"});
  PrepareOptions options;
  options.document_boundary = DocumentBoundary::blank_line;
  options.validation_every = 4;
  const PrepareSummary summary = prepare_text_shards(files, ByteTokenizer(), dir / "out", options);
  EXPECT_EQ(summary.train_documents, 3);
  EXPECT_EQ(summary.validation_documents, 1);
  EXPECT_EQ(shard_tokens(dir / "out/train_000000.bin"), stream({"alpha", "beta one\nbeta two", "gamma\r"}));
  EXPECT_EQ(shard_tokens(dir / "out/val_000000.bin"), stream({"delta"}));
}

TEST(PrepareTextShards, SplitsAtTheShardTokenLimitAndRemovesStaleShards) {
  TempDir dir;
  const std::vector<std::string> docs = {"0123456789", "abcdefghij", "ABCDEFGHIJ", "klmnopqrst"};
  const auto files = write_documents(dir, docs);
  PrepareOptions options;
  options.validation_every = 4;
  options.max_tokens_per_shard = 8;
  PrepareSummary summary = prepare_text_shards(files, ByteTokenizer(), dir / "out", options);
  // 33 train tokens in shards of 8, 8, 8, 8, 1; documents run across shard boundaries.
  ASSERT_EQ(summary.train_shards.size(), 5u);
  EXPECT_EQ(summary.train_shards[4], dir / "out/train_000004.bin");
  std::vector<int32_t> joined;
  for (const auto& path : summary.train_shards) {
    const auto tokens = shard_tokens(path);
    EXPECT_LE(tokens.size(), 8u);
    joined.insert(joined.end(), tokens.begin(), tokens.end());
  }
  EXPECT_EQ(joined, stream({docs[0], docs[1], docs[2]}));
  EXPECT_EQ(summary.validation_shards.size(), 2u);

  // A rerun with larger shards leaves only its own shards for find_shards to see.
  options.max_tokens_per_shard = 1000;
  summary = prepare_text_shards(files, ByteTokenizer(), dir / "out", options);
  EXPECT_EQ(directory_listing(dir / "out"), (std::vector<std::string>{"train_000000.bin", "val_000000.bin"}));
  EXPECT_EQ(find_shards(dir / "out", DataSplit::train), summary.train_shards);

  // Without a validation split, earlier validation shards go too.
  options.validation_every = 0;
  summary = prepare_text_shards(files, ByteTokenizer(), dir / "out", options);
  EXPECT_EQ(summary.validation_documents, 0);
  EXPECT_EQ(directory_listing(dir / "out"), std::vector<std::string>{"train_000000.bin"});
  EXPECT_EQ(shard_tokens(dir / "out/train_000000.bin"), stream(docs));
}

TEST(PrepareTextShards, RejectsTextContainingTheSeparator) {
  TempDir dir;
  const auto files = write_documents(dir, {"fine", std::string("bad\x03text"), "x", "y"});
  PrepareOptions options;
  options.validation_every = 2;
  const std::string message =
      invalid_input_message([&] { prepare_text_shards(files, ByteTokenizer(), dir / "out", options); });
  EXPECT_NE(message.find(files[1].string()), std::string::npos) << message;
  EXPECT_NE(message.find("end-of-text token 3"), std::string::npos) << message;
  EXPECT_NE(message.find("token index 3"), std::string::npos) << message;
}

TEST(PrepareTextShards, RejectsAnEmptyValidationSplitBeforeWritingAnything) {
  TempDir dir;
  const auto files = write_documents(dir, {"one", "two", "three"});
  const std::string message =
      invalid_input_message([&] { prepare_text_shards(files, ByteTokenizer(), dir / "out", {}); });
  EXPECT_NE(message.find("3 document(s)"), std::string::npos) << message;
  EXPECT_NE(message.find("every 20th"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(PrepareTextShards, RejectsMissingFilesAndBadOptions) {
  TempDir dir;
  std::vector<std::filesystem::path> files = {dir / "absent.txt"};
  std::string message =
      invalid_input_message([&] { prepare_text_shards(files, ByteTokenizer(), dir / "out", {}); });
  EXPECT_NE(message.find("absent.txt"), std::string::npos) << message;
  files = write_documents(dir, {"a", "b"});
  PrepareOptions options;
  options.validation_every = 1;
  invalid_input_message([&] { prepare_text_shards(files, ByteTokenizer(), dir / "out", options); });
  options.validation_every = 2;
  options.max_tokens_per_shard = 0;
  invalid_input_message([&] { prepare_text_shards(files, ByteTokenizer(), dir / "out", options); });
}

TEST(FindShards, SortsByNameAndIgnoresOtherFiles) {
  TempDir dir;
  for (const char* name : {"train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin",
                           "train_0001.bin", "train_000003.bin.tmp", "notes.txt"}) {
    write_token_shard(dir / name, std::vector<int32_t>{1}, TokenWidth::uint16);
  }
  EXPECT_EQ(find_shards(dir.path(), DataSplit::train),
            (std::vector<std::filesystem::path>{dir / "train_000000.bin", dir / "train_000001.bin",
                                                dir / "train_000002.bin"}));
  EXPECT_EQ(find_shards(dir.path(), DataSplit::validation),
            std::vector<std::filesystem::path>{dir / "val_000000.bin"});
  std::filesystem::create_directories(dir / "empty");
  const std::string message =
      invalid_input_message([&] { find_shards(dir / "empty", DataSplit::validation); });
  EXPECT_NE(message.find("no val shards"), std::string::npos) << message;
  EXPECT_EQ(list_files(dir.path(), ".txt"), std::vector<std::filesystem::path>{dir / "notes.txt"});
}

TEST(PrepareTextShards, RejectsFilesWithoutText) {
  TempDir dir;
  const auto files = write_documents(dir, std::vector<std::string>(25, ""));
  const std::string message =
      invalid_input_message([&] { prepare_text_shards(files, ByteTokenizer(), dir / "out", {}); });
  EXPECT_NE(message.find("the 25 text file(s) hold no text"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

}  // namespace
}  // namespace octet::io
