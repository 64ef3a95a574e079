// Llama 3's tokenizer: tiktoken-style byte-level BPE over 128,000 ranked tokens plus 256 special tokens, the
// same token ids as Meta's tokenizer for any text. The ranked tokens are read from llama3.tiktoken (the
// format of Meta's tokenizer.model; scripts/fetch_tokenizer.sh writes it from the npm package
// llama3-tokenizer-js); the pre-tokenization pattern is a hand-written scanner over UTF-8 code points, with
// no regex library.
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

// Splits text into Llama 3's pre-tokens, the matches of
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
//   \s+(?!\S)|\s+
// in order; the pieces view `text` and concatenate back to it. \s is Unicode's White_Space, \p{L} and \p{N}
// Unicode's letters and numbers, and the contractions match as Unicode simple case folding does (tiktoken's
// Rust regex): 'S and 's alike, and also the long s U+017F ("'ſ"). A byte that does not start a valid UTF-8
// sequence counts as one character that is neither space, letter nor number, so any bytes split (and
// round-trip) without error.
std::vector<std::string_view> llama3_pre_tokenize(std::string_view text);

// The directory scripts/fetch_tokenizer.sh writes llama3.tiktoken into: ${OCTET_DATA_DIR:-.cache/data}/llama3
// (a relative default resolves against the working directory, the repository root for the scripts and the
// command-line tool).
std::filesystem::path default_llama3_vocabulary_dir();

// Llama 3's tokenizer file, kept beside the data it tokenized and in every checkpoint, as GPT-2's are.
inline constexpr const char* kLlama3VocabularyFiles[] = {"llama3.tiktoken"};

// A tiktoken vocabulary: one token per line, "<the token's bytes in standard base64> <rank>", the ranks
// counting up from 0 (empty lines are skipped, as tiktoken does). Returns each token's bytes, indexed by
// rank. Throws invalid_input naming `name` and the line when a line is malformed, a rank is out of order, or
// a token is empty or a repeat. `parse_` takes the file's text (for tests); `read_` reads the file.
std::vector<std::string> parse_tiktoken_vocabulary(std::string_view text, std::string_view name);
std::vector<std::string> read_tiktoken_vocabulary(const std::filesystem::path& path);

class Llama3Tokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kRankedTokens = 128000;
  static constexpr int32_t kSpecialTokens = 256;
  static constexpr int32_t kVocabSize = kRankedTokens + kSpecialTokens;  // 128256
  static constexpr int32_t kBeginOfText = 128000;                        // <|begin_of_text|>
  static constexpr int32_t kEndOfText = 128001;                          // <|end_of_text|>

  // Reads `vocabulary_dir`/llama3.tiktoken, which must hold exactly the 128,000 ranked tokens and a token for
  // every byte. Throws invalid_input, naming the file and what was expected, when it is missing or malformed.
  explicit Llama3Tokenizer(const std::filesystem::path& vocabulary_dir);
  ~Llama3Tokenizer() override;
  Llama3Tokenizer(const Llama3Tokenizer&) = delete;
  Llama3Tokenizer& operator=(const Llama3Tokenizer&) = delete;

  // Ordinary text only: a special token is never produced, even from its own spelling ("<|eot_id|>" is
  // encoded as the characters it is made of), as tiktoken's encode_ordinary. Thread-safe: the tables are
  // read-only and the cache of encoded pre-tokens has its own lock.
  std::vector<int32_t> encode(std::string_view text) const override;
  // Ranked tokens become their bytes and special tokens their text ("<|begin_of_text|>"), as Meta's decode
  // does; throws invalid_input for an id outside 0..128255.
  std::string decode(std::span<const int32_t> tokens) const override;
  int32_t vocab_size() const override { return kVocabSize; }
  std::string_view name() const override { return "llama3"; }
  // <|begin_of_text|> (128000), not <|end_of_text|>: Llama 3's pretraining documents each start with
  // <|begin_of_text|>, so that is the token written before every document in a shard, and generation stops
  // when the model starts a new document.
  int32_t end_of_text() const override { return kBeginOfText; }

  // The text of special token `id` (kRankedTokens <= id < kVocabSize), with the names of Llama 3.1's
  // tokenizer: <|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_0|>, ..., <|eot_id|>, ...
  static std::string special_token_text(int32_t id);

 private:
  struct Tables;
  struct Cache;
  void encode_pre_token(std::string_view piece, std::vector<int32_t>& ids) const;

  std::unique_ptr<const Tables> tables_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace octet::io
