// The byte-level tokenizer, the tokenizer factory and the tokenizers' files.
#include "octet/io/tokenizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "octet/check.h"
#include "octet/io/atomic_file.h"
#include "octet/io/gpt2_tokenizer.h"
#include "octet/io/input.h"
#include "octet/io/llama3_tokenizer.h"

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
    case TokenizerKind::llama3:
      return std::make_unique<Llama3Tokenizer>(vocabulary_dir);
  }
  OCTET_CHECK(false, "unhandled tokenizer kind {}", static_cast<int>(kind));
  return nullptr;
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind) {
  return make_tokenizer(kind, default_vocabulary_dir(kind));
}

std::optional<TokenizerKind> parse_tokenizer_kind(std::string_view name) {
  if (name == "bytes") return TokenizerKind::bytes;
  if (name == "gpt2") return TokenizerKind::gpt2;
  if (name == "llama3") return TokenizerKind::llama3;
  return std::nullopt;
}

std::string_view tokenizer_names() {
  return "bytes, gpt2, llama3";
}

std::span<const char* const> tokenizer_files(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::bytes:
      return {};
    case TokenizerKind::gpt2:
      return kGpt2VocabularyFiles;
    case TokenizerKind::llama3:
      return kLlama3VocabularyFiles;
  }
  OCTET_CHECK(false, "unhandled tokenizer kind {}", static_cast<int>(kind));
  return {};
}

std::filesystem::path default_vocabulary_dir(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::bytes:
      return {};
    case TokenizerKind::gpt2:
      return default_gpt2_vocabulary_dir();
    case TokenizerKind::llama3:
      return default_llama3_vocabulary_dir();
  }
  OCTET_CHECK(false, "unhandled tokenizer kind {}", static_cast<int>(kind));
  return {};
}

bool has_vocabulary(TokenizerKind kind, const std::filesystem::path& dir) {
  std::error_code error;
  for (const char* name : tokenizer_files(kind)) {
    if (!std::filesystem::is_regular_file(dir / name, error)) return false;
  }
  return true;
}

std::filesystem::path find_vocabulary(TokenizerKind kind, const std::vector<std::filesystem::path>& places) {
  std::vector<std::string> looked;
  for (const std::filesystem::path& place : places) {
    if (place.empty()) continue;
    if (has_vocabulary(kind, place)) return place;
    looked.push_back(place.string());
  }
  OCTET_REQUIRE(
      false,
      "tokenizer files {} are in none of {} (run scripts/fetch_tokenizer.sh, or copy them into one of "
      "these)",
      fmt::join(tokenizer_files(kind), ", "), fmt::join(looked, ", "));
  return {};
}

void copy_vocabulary(TokenizerKind kind, const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code error;
  if (std::filesystem::equivalent(from, to, error)) return;
  for (const char* name : tokenizer_files(kind)) {
    std::error_code exists_error;
    OCTET_REQUIRE(std::filesystem::exists(from / name, exists_error),
                  "tokenizer file {} is missing (run scripts/fetch_tokenizer.sh)", (from / name).string());
    write_file_atomically(to / name, read_regular_file(from / name, "tokenizer file", int64_t{64} << 20));
  }
}

}  // namespace octet::io
