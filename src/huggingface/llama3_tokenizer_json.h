// Llama 3's tokenizer in Hugging Face's formats: tokenizer.json (the fast tokenizer that transformers'
// AutoTokenizer and the tokenizers libraries load), tokenizer_config.json and special_tokens_map.json, built
// from the ranked tokens of llama3.tiktoken the way transformers converts Meta's tiktoken file, so that they
// give octet's Llama 3 ids (io::Llama3Tokenizer) for any text.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace octet::hf {

// Llama 3's pre-tokenization pattern in the regex syntax of tokenizer.json (the one io::llama3_pre_tokenize
// scans by hand).
inline constexpr std::string_view kLlama3PreTokenizerPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A token's bytes spelled as byte-level BPE spells them (GPT-2's bytes_to_unicode: printable Latin-1 bytes
// as themselves, the other 68 bytes as U+0100 onwards), in UTF-8.
std::string byte_level_spelling(std::string_view bytes);

// One merge of tokenizer.json: the ranks of the two tokens joined.
struct BpeMerge {
  int32_t left;
  int32_t right;
  bool operator==(const BpeMerge&) const = default;
};

// The merges that make byte-pair merging by merge order give the same tokens as tiktoken's merging by rank:
// every split of a token into two tokens, ordered by the rank of the token they make, and the splits of one
// token by the ranks of their left, then right, parts. `tokens` holds each token's bytes, indexed by rank.
std::vector<BpeMerge> tiktoken_merges(std::span<const std::string> tokens);

// tokenizer.json for Llama 3's 128,000 ranked tokens (`tokens`, indexed by rank): byte-level BPE over the
// tokens with the merges above and `ignore_merges` (a pre-token that is a token is that token, as tiktoken
// does), the 256 special tokens (io::Llama3Tokenizer::special_token_text) as added tokens, Llama 3's
// pre-tokenization, the byte-level decoder, and <|begin_of_text|> put before every encoded text.
// Throws invalid_input when `tokens` is not 128,000 tokens with one for every byte.
std::string llama3_tokenizer_json(std::span<const std::string> tokens);

// tokenizer_config.json: PreTrainedTokenizerFast with <|begin_of_text|> and <|end_of_text|> as bos and eos,
// the special tokens as added_tokens_decoder, and `model_max_length` the model's context.
std::string llama3_tokenizer_config_json(int64_t model_max_length);

// special_tokens_map.json: the bos and eos tokens.
std::string llama3_special_tokens_map_json();

}  // namespace octet::hf
