// The tokenizer interface that data preparation and text generation use, the byte-level tokenizer
// (token = byte value) and the factory that also builds the BPE tokenizers of GPT-2
// (octet/io/gpt2_tokenizer.h) and Llama 3 (octet/io/llama3_tokenizer.h), with the files each one reads.
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
  // The token written before every document in a shard (GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>),
  // as llm.c's data scripts do; generation stops when the model produces it.
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
  bytes,   // ByteTokenizer
  gpt2,    // Gpt2Tokenizer: GPT-2's byte-level BPE, read from encoder.json and vocab.bpe
  llama3,  // Llama3Tokenizer: Llama 3's tiktoken-style BPE, read from llama3.tiktoken
};

// `vocabulary_dir` holds the files of tokenizers that have them (tokenizer_files(kind), as
// scripts/fetch_tokenizer.sh installs them); the byte tokenizer ignores it. Throws invalid_input when the
// files are missing or malformed.
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::filesystem::path& vocabulary_dir);
// The same, with the files looked for in default_vocabulary_dir(kind) (where the fetch script puts them).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind);
// "bytes", "gpt2", "llama3" -> their kind; nullopt for a name octet does not know (for command-line parsing).
std::optional<TokenizerKind> parse_tokenizer_kind(std::string_view name);
// The names parse_tokenizer_kind accepts, "bytes, gpt2, llama3" (for messages and help text).
std::string_view tokenizer_names();

// The files a tokenizer reads (none for bytes; encoder.json and vocab.bpe for gpt2; llama3.tiktoken for
// llama3). They are kept beside the data they tokenized (`octet data prepare` copies them into its --out
// directory) and in every checkpoint of a run, as Hugging Face keeps a model's tokenizer files beside its
// weights, so that generation does not depend on the working directory.
std::span<const char* const> tokenizer_files(TokenizerKind kind);
// Where scripts/fetch_tokenizer.sh puts them (default_gpt2_vocabulary_dir(),
// default_llama3_vocabulary_dir()); empty for bytes.
std::filesystem::path default_vocabulary_dir(TokenizerKind kind);
// Whether `dir` holds all of the kind's files (true for bytes, which has none).
bool has_vocabulary(TokenizerKind kind, const std::filesystem::path& dir);
// The first of `places` (empty ones skipped) that holds all the files. Throws invalid_input naming the files
// and every place looked in when none does.
std::filesystem::path find_vocabulary(TokenizerKind kind, const std::vector<std::filesystem::path>& places);
// Copies the kind's files from `from` into the directory `to` (each written atomically); nothing when they
// are the same directory. Throws invalid_input naming the file that cannot be read or written.
void copy_vocabulary(TokenizerKind kind, const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace octet::io
