// Llama 3's tokenizer as Hugging Face's tokenizer files (see llama3_tokenizer_json.h). The layout and the
// settings are those of Meta-Llama-3's own tokenizer.json and tokenizer_config.json; the vocabulary and the
// merges, the bulk of the file, are streamed one entry a line.
#include "llama3_tokenizer_json.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/llama3_tokenizer.h"

namespace octet::hf {

namespace {

using io::Llama3Tokenizer;
using nlohmann::ordered_json;

constexpr int32_t kBeginOfText = Llama3Tokenizer::kBeginOfText;
constexpr int32_t kEndOfText = Llama3Tokenizer::kEndOfText;

// GPT-2's bytes_to_unicode(), as UTF-8: printable Latin-1 bytes stand for themselves and the other 68 bytes
// for the code points 256, 257, ... in byte order, so that every token is a string of printable characters.
const std::array<std::string, 256>& byte_level_characters() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> characters;
    uint32_t next = 256;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      const uint32_t code_point = printable ? byte : next++;
      std::string& utf8 = characters[byte];
      if (code_point < 0x80) {
        utf8.push_back(static_cast<char>(code_point));
      } else {  // below U+0800: two bytes
        utf8.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
        utf8.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
      }
    }
    return characters;
  }();
  return table;
}

// A JSON string literal (byte-level spellings and special token names are valid UTF-8).
std::string json_string(std::string_view text) {
  return nlohmann::json(std::string(text)).dump();
}

// An added token as transformers and the tokenizers library write them: matched whole in the input, never
// normalized, special.
template <typename Json>
Json special_token(const std::string& content) {
  return Json{{"content", content}, {"single_word", false}, {"lstrip", false},
              {"rstrip", false},    {"normalized", false},  {"special", true}};
}

// <|begin_of_text|> before the text, and before each of a pair (the second one of type 1), as Meta's file.
ordered_json post_processor() {
  const std::string bos = Llama3Tokenizer::special_token_text(kBeginOfText);
  const auto special = [&](int type_id) {
    return ordered_json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
  };
  const auto sequence = [](const char* id, int type_id) {
    return ordered_json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  ordered_json template_processing = {
      {"type", "TemplateProcessing"},
      {"single", {special(0), sequence("A", 0)}},
      {"pair", {special(0), sequence("A", 0), special(1), sequence("B", 1)}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {kBeginOfText}}, {"tokens", {bos}}}}}}};
  // Meta's file has this byte-level step; it only adjusts offsets, and with trim_offsets false not those.
  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  return {{"type", "Sequence"}, {"processors", {byte_level, std::move(template_processing)}}};
}

// Llama 3's pattern splits the text (each match a pre-token), then each pre-token is spelled in byte-level
// characters; the byte-level step's own GPT-2 pattern is off.
ordered_json pre_tokenizer() {
  const ordered_json split = {{"type", "Split"},
                              {"pattern", {{"Regex", std::string(kLlama3PreTokenizerPattern)}}},
                              {"behavior", "Isolated"},
                              {"invert", false}};
  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  return {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
}

void check_ranked_tokens(std::span<const std::string> tokens) {
  OCTET_REQUIRE(tokens.size() == static_cast<size_t>(Llama3Tokenizer::kRankedTokens),
                "Llama 3 tokenizer.json: {} ranked tokens where Llama 3 has {}", tokens.size(),
                Llama3Tokenizer::kRankedTokens);
  std::array<bool, 256> has_byte{};
  for (const std::string& token : tokens) {
    OCTET_REQUIRE(!token.empty(), "Llama 3 tokenizer.json: an empty token");
    if (token.size() == 1) has_byte[static_cast<unsigned char>(token[0])] = true;
  }
  for (int byte = 0; byte < 256; ++byte) {
    OCTET_REQUIRE(has_byte[static_cast<size_t>(byte)], "Llama 3 tokenizer.json: no token for byte {}", byte);
  }
}

}  // namespace

std::string byte_level_spelling(std::string_view bytes) {
  const std::array<std::string, 256>& characters = byte_level_characters();
  std::string spelling;
  spelling.reserve(bytes.size() * 2);
  for (const char c : bytes) spelling += characters[static_cast<unsigned char>(c)];
  return spelling;
}

std::vector<BpeMerge> tiktoken_merges(std::span<const std::string> tokens) {
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(tokens.size());
  for (size_t rank = 0; rank < tokens.size(); ++rank)
    rank_of.emplace(tokens[rank], static_cast<int32_t>(rank));
  const auto rank = [&](std::string_view bytes) {
    const auto found = rank_of.find(bytes);
    return found == rank_of.end() ? -1 : found->second;
  };
  // tiktoken joins any two adjacent parts whose bytes together are a token, lowest rank first; merges in the
  // order of the joined token's rank make byte-pair merging do the same. Splits of one token meet only where
  // two of them could join at once (rarely), and are ordered as transformers' conversion orders them.
  std::vector<BpeMerge> merges;
  std::vector<BpeMerge> splits;
  for (const std::string& token : tokens) {
    splits.clear();
    const std::string_view bytes = token;
    for (size_t at = 1; at < bytes.size(); ++at) {
      const int32_t left = rank(bytes.substr(0, at));
      const int32_t right = rank(bytes.substr(at));
      if (left >= 0 && right >= 0) splits.push_back({left, right});
    }
    std::sort(splits.begin(), splits.end(), [](const BpeMerge& a, const BpeMerge& b) {
      return a.left != b.left ? a.left < b.left : a.right < b.right;
    });
    merges.insert(merges.end(), splits.begin(), splits.end());
  }
  return merges;
}

std::string llama3_tokenizer_json(std::span<const std::string> tokens) {
  check_ranked_tokens(tokens);
  std::vector<std::string> spellings(tokens.size());
  for (size_t rank = 0; rank < tokens.size(); ++rank) spellings[rank] = byte_level_spelling(tokens[rank]);
  const std::vector<BpeMerge> merges = tiktoken_merges(tokens);

  // The byte-level decoder ignores its options; these are Meta's.
  const ordered_json decoder = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  const ordered_json model = {{"type", "BPE"},
                              {"dropout", nullptr},
                              {"unk_token", nullptr},
                              {"continuing_subword_prefix", nullptr},
                              {"end_of_word_suffix", nullptr},
                              {"fuse_unk", false},
                              {"byte_fallback", false},
                              {"ignore_merges", true}};
  // `"key": value,` on a line of its own, indented by `indent` spaces.
  const auto member = [](std::string& out, int indent, std::string_view key, const ordered_json& value) {
    out += std::string(static_cast<size_t>(indent), ' ') + json_string(key) + ": " + value.dump() + ",\n";
  };

  std::string out = "{\n";
  member(out, 2, "version", "1.0");
  member(out, 2, "truncation", nullptr);
  member(out, 2, "padding", nullptr);
  out += "  \"added_tokens\": [\n";
  for (int32_t id = Llama3Tokenizer::kRankedTokens; id < Llama3Tokenizer::kVocabSize; ++id) {
    ordered_json added = {{"id", id}};
    added.update(special_token<ordered_json>(Llama3Tokenizer::special_token_text(id)));
    out += "    " + added.dump() + (id + 1 < Llama3Tokenizer::kVocabSize ? ",\n" : "\n");
  }
  out += "  ],\n";
  member(out, 2, "normalizer", nullptr);
  member(out, 2, "pre_tokenizer", pre_tokenizer());
  member(out, 2, "post_processor", post_processor());
  member(out, 2, "decoder", decoder);
  out += "  \"model\": {\n";
  for (const auto& setting : model.items()) member(out, 4, setting.key(), setting.value());
  out += "    \"vocab\": {\n";
  for (size_t rank = 0; rank < spellings.size(); ++rank) {
    out += "      " + json_string(spellings[rank]) + ": " + std::to_string(rank) +
           (rank + 1 < spellings.size() ? ",\n" : "\n");
  }
  // Merges as "left right": byte-level spellings hold no space (byte 0x20 is spelled U+0120).
  out += "    },\n    \"merges\": [\n";
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string pair = spellings[static_cast<size_t>(merges[i].left)] + " " +
                             spellings[static_cast<size_t>(merges[i].right)];
    out += "      " + json_string(pair) + (i + 1 < merges.size() ? ",\n" : "\n");
  }
  out += "    ]\n  }\n}\n";
  return out;
}

std::string llama3_tokenizer_config_json(int64_t model_max_length) {
  // transformers writes its configuration files with sorted keys, as nlohmann::json's map keeps them.
  nlohmann::json added_tokens_decoder = nlohmann::json::object();
  for (int32_t id = Llama3Tokenizer::kRankedTokens; id < Llama3Tokenizer::kVocabSize; ++id) {
    added_tokens_decoder[std::to_string(id)] =
        special_token<nlohmann::json>(Llama3Tokenizer::special_token_text(id));
  }
  const nlohmann::json config = {
      {"added_tokens_decoder", std::move(added_tokens_decoder)},
      {"bos_token", Llama3Tokenizer::special_token_text(kBeginOfText)},
      // Meta's file says true, which makes decode drop the space before punctuation and contractions
      // (" ." -> "."); false keeps decode the exact inverse of encode, as octet's own decode is.
      {"clean_up_tokenization_spaces", false},
      {"eos_token", Llama3Tokenizer::special_token_text(kEndOfText)},
      {"model_input_names", {"input_ids", "attention_mask"}},
      {"model_max_length", model_max_length},
      {"tokenizer_class", "PreTrainedTokenizerFast"}};
  return config.dump(2) + "\n";
}

std::string llama3_special_tokens_map_json() {
  nlohmann::json bos = special_token<nlohmann::json>(Llama3Tokenizer::special_token_text(kBeginOfText));
  nlohmann::json eos = special_token<nlohmann::json>(Llama3Tokenizer::special_token_text(kEndOfText));
  // The map leaves out "special", which every token in it is.
  bos.erase("special");
  eos.erase("special");
  return nlohmann::json{{"bos_token", std::move(bos)}, {"eos_token", std::move(eos)}}.dump(2) + "\n";
}

}  // namespace octet::hf
