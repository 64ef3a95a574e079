// The tokenizer interface that data preparation and text generation use, the byte-level tokenizer
// (token = byte value) and the factory that also builds GPT-2's BPE tokenizer (octet/io/gpt2_tokenizer.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace octet::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ordinary text to tokens. The end-of-text token is never produced by a tokenizer that reserves it for
  // document boundaries (BPE); see ByteTokenizer for the byte case.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Tokens back to text; throws invalid_input for a token outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> tokens) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual std::string_view name() const = 0;
  // The token written before every document in a shard (GPT-2's <|endoftext|>), as llm.c's data scripts do.
  virtual int32_t end_of_text() const = 0;
};

// One token per byte: the vocabulary is the 256 byte values, so any input (UTF-8 or not) round-trips
// exactly. Byte 0x03 (ASCII "end of text") doubles as the document separator; prepare_text_shards rejects
// input text that contains it, so in a shard it only ever marks a document boundary.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kVocabSize = 256;
  static constexpr int32_t kEndOfText = 0x03;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
  int32_t vocab_size() const override { return kVocabSize; }
  std::string_view name() const override { return "bytes"; }
  int32_t end_of_text() const override { return kEndOfText; }
};

enum class TokenizerKind {
  bytes,  // ByteTokenizer
  gpt2,   // Gpt2Tokenizer: GPT-2's byte-level BPE, read from encoder.json and vocab.bpe
};

// `vocabulary_dir` holds the files of tokenizers that have them (gpt2: encoder.json and vocab.bpe, as
// scripts/fetch_tokenizer.sh installs them); the byte tokenizer ignores it. Throws invalid_input when the
// files are missing or malformed.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::filesystem::path& vocabulary_dir);
// The same, with gpt2's files looked for in default_gpt2_vocabulary_dir() (where the fetch script puts them).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind);
// "bytes" -> TokenizerKind::bytes, "gpt2" -> TokenizerKind::gpt2; nullopt for a name octet does not know
// (for command-line parsing).
std::optional<TokenizerKind> parse_tokenizer_kind(std::string_view name);

}  // namespace octet::io
