// Every way a shard can be damaged or foreign gives invalid_input (exit code 2) with a message that names
// the file and says what is wrong.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "octet/io/corpus.h"
#include "octet/io/token_shard.h"
#include "files.h"

namespace octet::io {
namespace {

using octet::testing::invalid_input_message;
using octet::testing::TempDir;
using octet::testing::write_file;

// A shard's bytes written by hand: a header with the given fields and `token_bytes` bytes of tokens.
std::string raw_shard(int32_t magic, int32_t version, int32_t count, size_t token_bytes) {
  std::string bytes(1024 + token_bytes, '\0');
  const int32_t fields[3] = {magic, version, count};
  std::memcpy(bytes.data(), fields, sizeof(fields));  // the test host is little-endian, as octet requires
  return bytes;
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos)
      << "message: " << message << "\nexpected to contain: " << part;
}

TEST(ShardErrors, BadMagicSaysWhatWasFoundAndExpected) {
  TempDir dir;
  write_file(dir / "magic.bin", raw_shard(12345, 1, 0, 0));
  const std::string message = invalid_input_message([&] { TokenShard::open(dir / "magic.bin"); });
  expect_contains(message, (dir / "magic.bin").string());
  expect_contains(message, "bad magic number 12345");
  expect_contains(message, "20240520");
  expect_contains(message, "20240801");
}

TEST(ShardErrors, UnknownVersion) {
  TempDir dir;
  write_file(dir / "version.bin", raw_shard(20240520, 2, 0, 0));
  std::string message = invalid_input_message([&] { TokenShard::open(dir / "version.bin"); });
  expect_contains(message, (dir / "version.bin").string());
  expect_contains(message, "unknown version 2");
  expect_contains(message, "expected version 1");
  // The uint32 magic only goes with llm.c's version 7.
  write_file(dir / "version32.bin", raw_shard(20240801, 1, 0, 0));
  message = invalid_input_message([&] { TokenShard::open(dir / "version32.bin"); });
  expect_contains(message, "unknown version 1 for magic 20240801 (expected version 7)");
}

TEST(ShardErrors, TruncatedTokens) {
  TempDir dir;
  write_file(dir / "short.bin", raw_shard(20240520, 1, 100, 150));
  std::string message = invalid_input_message([&] { TokenShard::open(dir / "short.bin"); });
  expect_contains(message, (dir / "short.bin").string());
  expect_contains(message,
                  "truncated: the header says 100 tokens (200 bytes) but the file holds only 150 bytes");
  write_file(dir / "short32.bin", raw_shard(20240801, 7, 10, 39));
  message = invalid_input_message([&] { TokenShard::open(dir / "short32.bin"); });
  expect_contains(message, "header says 10 tokens (40 bytes) but the file holds only 39 bytes");
}

TEST(ShardErrors, BytesAfterTheDeclaredTokens) {
  TempDir dir;
  write_file(dir / "long.bin", raw_shard(20240520, 1, 4, 9));
  const std::string message = invalid_input_message([&] { TokenShard::open(dir / "long.bin"); });
  expect_contains(message, (dir / "long.bin").string());
  expect_contains(message, "1 unexpected byte(s) after the 4 tokens");
}

TEST(ShardErrors, NegativeTokenCount) {
  TempDir dir;
  write_file(dir / "negative.bin", raw_shard(20240520, 1, -3, 0));
  expect_contains(invalid_input_message([&] { TokenShard::open(dir / "negative.bin"); }),
                  "negative token count -3");
}

TEST(ShardErrors, FileShorterThanTheHeader) {
  TempDir dir;
  for (size_t size : {size_t{0}, size_t{12}, size_t{1023}}) {
    write_file(dir / "tiny.bin", std::string(size, 'x'));
    const std::string message = invalid_input_message([&] { TokenShard::open(dir / "tiny.bin"); });
    expect_contains(message, (dir / "tiny.bin").string());
    expect_contains(message, "file is " + std::to_string(size) + " bytes, shorter than the 1024-byte header");
  }
}

TEST(ShardErrors, MissingFileAndDirectory) {
  TempDir dir;
  std::string message = invalid_input_message([&] { TokenShard::open(dir / "absent.bin"); });
  expect_contains(message, (dir / "absent.bin").string());
  expect_contains(message, "cannot open");
  message = invalid_input_message([&] { TokenShard::open(dir.path()); });
  expect_contains(message, "not a regular file");
}

TEST(ShardErrors, TokenOutsideTheVocabularyNamesValueIndexAndSize) {
  TempDir dir;
  write_token_shard(dir / "vocab.bin", std::vector<int32_t>{1, 255, 3, 256, 7}, TokenWidth::uint16);
  TokenShard shard = TokenShard::open(dir / "vocab.bin");
  shard.validate_tokens(257);  // every token fits
  const std::string message = invalid_input_message([&] { shard.validate_tokens(256); });
  expect_contains(message, (dir / "vocab.bin").string());
  expect_contains(message, "token 256 at index 3 is outside the vocabulary of size 256");

  write_token_shard(dir / "vocab32.bin", std::vector<int32_t>{70000, 128256}, TokenWidth::uint32);
  TokenShard wide = TokenShard::open(dir / "vocab32.bin");
  expect_contains(invalid_input_message([&] { wide.validate_tokens(128256); }),
                  "token 128256 at index 1 is outside the vocabulary of size 128256");
}

TEST(ShardErrors, AFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const testing::FifoWithLateWriter fifo(dir / "train_000000.bin");
  const auto began = std::chrono::steady_clock::now();
  const std::string message = invalid_input_message([&] { TokenShard::open(fifo.path()); });
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(2));
  expect_contains(message, fifo.path().string());
  expect_contains(message, "is a FIFO, not a regular file");
}

TEST(ShardErrors, ADataDirectoryThatIsAFileSaysSo) {
  TempDir dir;
  write_file(dir / "shards", "not a directory");
  const std::string message = invalid_input_message([&] { find_shards(dir / "shards", DataSplit::train); });
  expect_contains(message, (dir / "shards").string() + " is a file, not a directory of token shards");
  expect_contains(invalid_input_message([&] { find_shards(dir / "absent", DataSplit::train); }),
                  "does not exist");
}

}  // namespace
}  // namespace octet::io
