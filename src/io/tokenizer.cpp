// The byte-level tokenizer and the tokenizer factory.
#include "octet/io/tokenizer.h"

#include "octet/check.h"
#include "octet/io/gpt2_tokenizer.h"

namespace octet::io {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size());
  // Through unsigned char: bytes above 0x7F (UTF-8 continuation bytes) must become 128..255, not negatives.
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    OCTET_REQUIRE(tokens[i] >= 0 && tokens[i] < kVocabSize,
                  "byte tokenizer: token {} at index {} is outside the vocabulary of size {}", tokens[i], i,
                  kVocabSize);
    text.push_back(static_cast<char>(static_cast<unsigned char>(tokens[i])));
  }
  return text;
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::filesystem::path& vocabulary_dir) {
  switch (kind) {
    case TokenizerKind::bytes:
      return std::make_unique<ByteTokenizer>();
    case TokenizerKind::gpt2:
      return std::make_unique<Gpt2Tokenizer>(vocabulary_dir);
  }
  OCTET_CHECK(false, "unhandled tokenizer kind {}", static_cast<int>(kind));
  return nullptr;
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind) {
  return make_tokenizer(kind, default_gpt2_vocabulary_dir());
}

std::optional<TokenizerKind> parse_tokenizer_kind(std::string_view name) {
  if (name == "bytes") return TokenizerKind::bytes;
  if (name == "gpt2") return TokenizerKind::gpt2;
  return std::nullopt;
}

}  // namespace octet::io
