// The byte-level tokenizer: exact round trips of any bytes (UTF-8 and otherwise), the byte-value mapping,
// and rejection of tokens outside its vocabulary.
#include <string>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "octet/io/tokenizer.h"

namespace octet::io {
namespace {

TEST(ByteTokenizer, RoundTripsNonAsciiText) {
  ByteTokenizer tokenizer;
  // Two-, three- and four-byte UTF-8 sequences, a NUL, and bytes that are not valid UTF-8 at all.
  const std::string text =
      std::string("na\xC3\xAFve caf\xC3\xA9, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\n\t") +
      std::string(1, '\0') + "\xFF\xFE\x80";
  const std::vector<int32_t> tokens = tokenizer.encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[0], 'n');
  EXPECT_EQ(tokens[2], 0xC3);  // a UTF-8 lead byte becomes 195, not a negative char value
  EXPECT_EQ(tokens[3], 0xAF);
  EXPECT_EQ(tokens.back(), 0x80);
  for (int32_t token : tokens) {
    EXPECT_GE(token, 0);
    EXPECT_LT(token, tokenizer.vocab_size());
  }
  EXPECT_EQ(tokenizer.decode(tokens), text);
}

TEST(ByteTokenizer, EveryByteValueIsItsOwnToken) {
  ByteTokenizer tokenizer;
  std::string all;
  for (int byte = 0; byte < 256; ++byte) all.push_back(static_cast<char>(byte));
  const std::vector<int32_t> tokens = tokenizer.encode(all);
  for (int byte = 0; byte < 256; ++byte) EXPECT_EQ(tokens[static_cast<size_t>(byte)], byte);
  EXPECT_EQ(tokenizer.decode(tokens), all);
  EXPECT_TRUE(tokenizer.encode("").empty());
  EXPECT_EQ(tokenizer.decode({}), "");
}

TEST(ByteTokenizer, DescribesItself) {
  ByteTokenizer tokenizer;
  EXPECT_EQ(tokenizer.vocab_size(), 256);
  EXPECT_EQ(tokenizer.name(), "bytes");
  EXPECT_EQ(tokenizer.end_of_text(), 0x03);
}

TEST(ByteTokenizer, DecodeRejectsTokensOutsideTheVocabulary) {
  ByteTokenizer tokenizer;
  std::string message = octet::testing::invalid_input_message([&] {
    tokenizer.decode(std::vector<int32_t>{72, 256});
  });
  EXPECT_NE(message.find("token 256 at index 1"), std::string::npos) << message;
  message = octet::testing::invalid_input_message([&] { tokenizer.decode(std::vector<int32_t>{-1}); });
  EXPECT_NE(message.find("token -1 at index 0"), std::string::npos) << message;
}

TEST(TokenizerFactory, MakesTheByteTokenizerByKindAndName) {
  const auto kind = parse_tokenizer_kind("bytes");
  ASSERT_TRUE(kind.has_value());
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(*kind);
  EXPECT_EQ(tokenizer->name(), "bytes");
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("round trip")), "round trip");
  EXPECT_FALSE(parse_tokenizer_kind("gpt9").has_value());
}

}  // namespace
}  // namespace octet::io
