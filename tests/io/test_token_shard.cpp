// Token shards: round trips in both widths, the header byte for byte against llm.c's layout, the atomic
// write, and the move-only mapping.
#include <cstring>
#include <limits>
#include <utility>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "octet/io/token_shard.h"

namespace octet::io {
namespace {

using octet::testing::directory_listing;
using octet::testing::read_file_bytes;
using octet::testing::TempDir;

// Distinct, deterministic tokens in [0, modulus) that include both ends of the range.
std::vector<int32_t> sample_tokens(size_t count, int64_t modulus) {
  std::vector<int32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<int32_t>((int64_t(i) * 7919 + 13) % modulus);
  if (count >= 2) {
    tokens[0] = 0;
    tokens[count - 1] = static_cast<int32_t>(modulus - 1);
  }
  return tokens;
}

std::vector<int32_t> read_back(const TokenShard& shard) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < shard.size(); ++i) tokens.push_back(static_cast<int32_t>(shard.tokens()[i]));
  return tokens;
}

int32_t little_endian_int32(const std::string& bytes, size_t offset) {
  uint32_t value = 0;
  for (int b = 3; b >= 0; --b) value = (value << 8) | static_cast<unsigned char>(bytes[offset + b]);
  return static_cast<int32_t>(value);
}

TEST(TokenShard, RoundTripsUint16TokensOfOddCounts) {
  TempDir dir;
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{3221}}) {
    const auto tokens = sample_tokens(count, 65536);
    const auto path = dir / "shard.bin";
    write_token_shard(path, tokens, TokenWidth::uint16);
    TokenShard shard = TokenShard::open(path);
    EXPECT_EQ(shard.width(), TokenWidth::uint16);
    EXPECT_EQ(shard.size(), static_cast<int64_t>(count));
    EXPECT_EQ(read_back(shard), tokens);
    EXPECT_EQ(shard.tokens().as_uint16().size(), count);
  }
}

TEST(TokenShard, RoundTripsUint32TokensAboveTheUint16Range) {
  TempDir dir;
  auto tokens = sample_tokens(2333, 200'000);
  tokens.push_back(std::numeric_limits<int32_t>::max());
  const auto path = dir / "wide.bin";
  write_token_shard(path, tokens, TokenWidth::uint32);
  TokenShard shard = TokenShard::open(path);
  EXPECT_EQ(shard.width(), TokenWidth::uint32);
  EXPECT_EQ(read_back(shard), tokens);
  EXPECT_EQ(shard.tokens().as_uint32().back(), static_cast<uint32_t>(std::numeric_limits<int32_t>::max()));
}

// The layout llm.c's write_datafile produces: 256 little-endian int32 (magic, version, count, zeros), then
// the tokens as little-endian uint16 (or uint32 with llm.c's Llama 3 magic and version).
TEST(TokenShard, HeaderMatchesLlmcLayoutByteForByte) {
  TempDir dir;
  const std::vector<int32_t> tokens = {50256, 0, 1, 258, 65535};
  for (TokenWidth width : {TokenWidth::uint16, TokenWidth::uint32}) {
    const auto path = dir / "layout.bin";
    write_token_shard(path, tokens, width);
    const std::string bytes = read_file_bytes(path);
    const size_t token_size = width == TokenWidth::uint16 ? 2 : 4;
    ASSERT_EQ(bytes.size(), 1024 + tokens.size() * token_size);
    EXPECT_EQ(little_endian_int32(bytes, 0), width == TokenWidth::uint16 ? 20240520 : 20240801);
    EXPECT_EQ(little_endian_int32(bytes, 4), width == TokenWidth::uint16 ? 1 : 7);
    EXPECT_EQ(little_endian_int32(bytes, 8), static_cast<int32_t>(tokens.size()));
    for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(bytes[i], '\0') << "header byte " << i;
    for (size_t t = 0; t < tokens.size(); ++t) {
      uint32_t value = 0;
      for (size_t b = token_size; b-- > 0;)
        value = (value << 8) | static_cast<unsigned char>(bytes[1024 + t * token_size + b]);
      EXPECT_EQ(value, static_cast<uint32_t>(tokens[t])) << "token " << t;
    }
  }
  // 50256 = 0xC450 stored low byte first: the first token's bytes are 0x50 0xC4 in the uint16 layout.
  write_token_shard(dir / "gpt2.bin", tokens, TokenWidth::uint16);
  const std::string bytes = read_file_bytes(dir / "gpt2.bin");
  EXPECT_EQ(static_cast<unsigned char>(bytes[1024]), 0x50);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1025]), 0xC4);
}

TEST(TokenShard, AtomicWriteLeavesOnlyTheShard) {
  TempDir dir;
  write_token_shard(dir / "a.bin", sample_tokens(100, 256), TokenWidth::uint16);
  // Overwriting an existing shard replaces it whole.
  write_token_shard(dir / "a.bin", sample_tokens(5, 256), TokenWidth::uint16);
  EXPECT_EQ(directory_listing(dir.path()), std::vector<std::string>{"a.bin"});
  EXPECT_EQ(TokenShard::open(dir / "a.bin").size(), 5);
}

TEST(TokenShard, FailedWriteLeavesNeitherShardNorTemporaryFile) {
  TempDir dir;
  const std::string message = octet::testing::invalid_input_message([&] {
    write_token_shard(dir / "b.bin", std::vector<int32_t>{1, 2, 65536}, TokenWidth::uint16);
  });
  EXPECT_NE(message.find("b.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("token 65536 at index 2"), std::string::npos) << message;
  octet::testing::invalid_input_message(
      [&] { write_token_shard(dir / "c.bin", std::vector<int32_t>{-1}, TokenWidth::uint32); });
  EXPECT_TRUE(directory_listing(dir.path()).empty());
}

TEST(TokenShard, WriteIntoMissingDirectoryNamesTheShard) {
  TempDir dir;
  const std::string message = octet::testing::invalid_input_message(
      [&] { write_token_shard(dir / "missing" / "d.bin", std::vector<int32_t>{1}, TokenWidth::uint16); });
  EXPECT_NE(message.find("d.bin"), std::string::npos) << message;
}

TEST(TokenShard, MovesOwnershipOfTheMapping) {
  TempDir dir;
  write_token_shard(dir / "e.bin", sample_tokens(64, 1000), TokenWidth::uint16);
  write_token_shard(dir / "f.bin", sample_tokens(3, 1000), TokenWidth::uint32);
  TokenShard first = TokenShard::open(dir / "e.bin");
  TokenShard moved = std::move(first);
  EXPECT_EQ(moved.size(), 64);
  EXPECT_EQ(moved.path(), dir / "e.bin");
  TokenShard other = TokenShard::open(dir / "f.bin");
  moved = std::move(other);  // unmaps e.bin, takes over f.bin
  EXPECT_EQ(moved.size(), 3);
  EXPECT_EQ(moved.width(), TokenWidth::uint32);
  EXPECT_EQ(read_back(moved), sample_tokens(3, 1000));
  std::vector<TokenShard> shards;
  for (int i = 0; i < 10; ++i) shards.push_back(TokenShard::open(dir / "e.bin"));  // reallocation moves them
  EXPECT_EQ(read_back(shards.front()), sample_tokens(64, 1000));
}

TEST(TokenShard, WidthFollowsVocabularySize) {
  EXPECT_EQ(token_width_for_vocab(256), TokenWidth::uint16);
  EXPECT_EQ(token_width_for_vocab(50257), TokenWidth::uint16);
  EXPECT_EQ(token_width_for_vocab(65536), TokenWidth::uint16);
  EXPECT_EQ(token_width_for_vocab(65537), TokenWidth::uint32);
  EXPECT_EQ(token_width_for_vocab(128256), TokenWidth::uint32);
}

}  // namespace
}  // namespace octet::io
