// Llama 3's tokenizer: the pre-tokenization scanner over UTF-8 code points, the reader of tiktoken vocabulary
// files, and byte-pair merging by rank over the bytes of each pre-token (the concatenation of lowest rank
// merges first), as tiktoken does.
#include "octet/io/llama3_tokenizer.h"

#include <array>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/io/input.h"
#include "unicode_text.h"

namespace octet::io {
namespace {

using unicode::Character;
using unicode::character_at;
using unicode::CharClass;
using unicode::run_end;

bool is_line_break(char c) {
  return c == '\r' || c == '\n';
}

char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// The length of the contraction at text[pos] ('s 't 're 've 'm 'll 'd, any case), or 0. Under Unicode's
// simple case folding the long s U+017F is an s too, so "'ſ" (bytes C5 BF) is a contraction as well.
size_t contraction_length(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const std::string_view rest = text.substr(pos + 1);
  if (rest.starts_with("\xC5\xBF")) return 3;
  const char first = ascii_lower(rest[0]);
  if (first == 's' || first == 't' || first == 'm' || first == 'd') return 2;
  if (rest.size() < 2) return 0;
  const char second = ascii_lower(rest[1]);
  if ((first == 'r' && second == 'e') || (first == 'v' && second == 'e') || (first == 'l' && second == 'l')) {
    return 3;
  }
  return 0;
}

// The length of the pre-token that starts at text[pos]: the pattern's alternatives tried in order.
size_t pre_token_length(std::string_view text, size_t pos) {
  if (const size_t length = contraction_length(text, pos)) return length;

  // `[^\r\n\p{L}\p{N}]?\p{L}+`: a run of letters, with at most one character before it that is neither a
  // line break, a letter nor a number (a space, punctuation: " the", "(x", "_id").
  const Character first = character_at(text, pos);
  if (first.kind == CharClass::letter) return run_end(text, pos, CharClass::letter) - pos;
  const size_t after_first = pos + first.length;
  if (first.kind != CharClass::number && !is_line_break(text[pos]) && after_first < text.size() &&
      character_at(text, after_first).kind == CharClass::letter) {
    return run_end(text, after_first, CharClass::letter) - pos;
  }

  // `\p{N}{1,3}`: numbers in groups of at most three digits.
  if (first.kind == CharClass::number) {
    size_t end = after_first;
    for (int digits = 1; digits < 3 && end < text.size(); ++digits) {
      const Character c = character_at(text, end);
      if (c.kind != CharClass::number) break;
      end += c.length;
    }
    return end - pos;
  }

  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`: an optional ASCII space, a run of other characters, and the line breaks that
  // directly follow it.
  const size_t body = text[pos] == ' ' ? pos + 1 : pos;
  if (body < text.size() && character_at(text, body).kind == CharClass::other) {
    size_t end = run_end(text, body, CharClass::other);
    while (end < text.size() && is_line_break(text[end])) ++end;
    return end - pos;
  }

  // What is left starts with white space. Find its run, the last line break in it and its last character.
  size_t end = pos;
  size_t after_last_line_break = pos;
  size_t last_start = pos;
  while (end < text.size()) {
    const Character c = character_at(text, end);
    if (c.kind != CharClass::space) break;
    last_start = end;
    end += c.length;
    if (is_line_break(text[last_start])) after_last_line_break = end;
  }
  // `\s*[\r\n]+`: the run up to and including its last line break ("  \n\n" of "  \n\n  x").
  if (after_last_line_break > pos) return after_last_line_break - pos;
  // `\s+(?!\S)`: a run followed by a non-space backs off by one character, leaving that last space to start
  // the next pre-token (" world" after "hello  "); `\s+` takes a lone one, or a run that ends the text.
  if (end < text.size() && last_start > pos) return last_start - pos;
  return end - pos;
}

// Strict standard base64 (RFC 4648 with padding). False for anything else.
bool decode_base64(std::string_view text, std::string& bytes) {
  static constexpr std::array<int8_t, 256> kValue = [] {
    std::array<int8_t, 256> value{};
    value.fill(-1);
    const std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < alphabet.size(); ++i)
      value[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return value;
  }();
  bytes.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const size_t padding = last ? (text[i + 3] == '=' ? (text[i + 2] == '=' ? 2 : 1) : 0) : 0;
    uint32_t group = 0;
    for (size_t j = 0; j < 4; ++j) {
      const int8_t value = j < 4 - padding ? kValue[static_cast<unsigned char>(text[i + j])] : 0;
      if (value < 0) return false;
      group = (group << 6) | static_cast<uint32_t>(value);
    }
    // Padding leaves bits unused; canonical base64 sets them to zero.
    if ((padding == 1 && (group & 0xFF) != 0) || (padding == 2 && (group & 0xFFFF) != 0)) return false;
    bytes.push_back(static_cast<char>(group >> 16));
    if (padding < 2) bytes.push_back(static_cast<char>((group >> 8) & 0xFF));
    if (padding < 1) bytes.push_back(static_cast<char>(group & 0xFF));
  }
  return true;
}

}  // namespace

std::vector<std::string> parse_tiktoken_vocabulary(std::string_view text, std::string_view name) {
  std::vector<std::string> tokens;
  std::unordered_map<std::string_view, int64_t> line_of;
  line_of.reserve(Llama3Tokenizer::kRankedTokens);
  std::vector<int64_t> lines;
  std::string_view rest = text;
  int64_t line_number = 0;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    const std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    ++line_number;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const std::string_view encoded = line.substr(0, space);
    const std::string_view rank_text =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    int64_t rank = -1;
    if (!rank_text.empty() && rank_text.size() <= 9 &&
        rank_text.find_first_not_of("0123456789") == std::string_view::npos) {
      rank = std::strtoll(std::string(rank_text).c_str(), nullptr, 10);
    }
    std::string bytes;
    OCTET_REQUIRE(rank >= 0 && decode_base64(encoded, bytes),
                  "Llama 3 tokenizer: {} line {}: \"{}\" is not \"<token bytes in base64> <rank>\" (run "
                  "scripts/fetch_tokenizer.sh)",
                  name, line_number, printable(line.substr(0, 80)));
    OCTET_REQUIRE(rank == static_cast<int64_t>(tokens.size()),
                  "Llama 3 tokenizer: {} line {}: rank {} where {} was expected (the ranks count up from 0)",
                  name, line_number, rank, tokens.size());
    tokens.push_back(std::move(bytes));
    lines.push_back(line_number);
  }
  // Repeats are looked for once all tokens are stored, so that the map's keys view strings that stay put.
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    const auto [found, inserted] = line_of.emplace(tokens[rank], lines[rank]);
    OCTET_REQUIRE(inserted,
                  "Llama 3 tokenizer: {} line {}: the token of rank {} repeats the token of line {}", name,
                  lines[rank], rank, found->second);
  }
  OCTET_REQUIRE(!tokens.empty(), "Llama 3 tokenizer: {} holds no tokens (run scripts/fetch_tokenizer.sh)",
                name);
  return tokens;
}

std::vector<std::string> read_tiktoken_vocabulary(const std::filesystem::path& path) {
  std::error_code error;
  OCTET_REQUIRE(std::filesystem::exists(path, error),
                "Llama 3 tokenizer: cannot open {} (run scripts/fetch_tokenizer.sh to download it)",
                path.string());
  // Llama 3's file is about 2 MB; a regular file only, so that a FIFO cannot block the reader.
  const std::string text = read_regular_file(path, "Llama 3 tokenizer file", int64_t{64} << 20);
  return parse_tiktoken_vocabulary(text, path.string());
}

std::filesystem::path default_llama3_vocabulary_dir() {
  const char* data_dir = std::getenv("OCTET_DATA_DIR");
  const std::filesystem::path root = data_dir != nullptr && *data_dir != '\0' ? data_dir : ".cache/data";
  return root / "llama3";
}

std::vector<std::string_view> llama3_pre_tokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = pre_token_length(text, pos);
    pieces.push_back(text.substr(pos, length));
    pos += length;
  }
  return pieces;
}

struct Llama3Tokenizer::Tables {
  std::vector<std::string> token_bytes;                   // rank -> the bytes of the token
  std::unordered_map<std::string_view, int32_t> rank_of;  // views into token_bytes

  int32_t rank(std::string_view bytes) const {
    const auto found = rank_of.find(bytes);
    return found == rank_of.end() ? std::numeric_limits<int32_t>::max() : found->second;
  }
};

struct Llama3Tokenizer::Cache {
  // Pre-tokens repeat (Zipf), so remembering their ids makes encoding mostly hash lookups. The cache is
  // cleared when it reaches kMaxEntries so that memory stays bounded on unusual text.
  static constexpr size_t kMaxEntries = 1 << 18;
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> ids;
};

Llama3Tokenizer::Llama3Tokenizer(const std::filesystem::path& vocabulary_dir)
    : cache_(std::make_unique<Cache>()) {
  auto tables = std::make_unique<Tables>();
  const std::filesystem::path path = vocabulary_dir / kLlama3VocabularyFiles[0];
  tables->token_bytes = read_tiktoken_vocabulary(path);
  OCTET_REQUIRE(
      tables->token_bytes.size() == static_cast<size_t>(kRankedTokens),
      "Llama 3 tokenizer: {} holds {} tokens where Llama 3 has {} (cut short, or another tokenizer's "
      "file; run scripts/fetch_tokenizer.sh)",
      path.string(), tables->token_bytes.size(), kRankedTokens);
  tables->rank_of.reserve(tables->token_bytes.size());
  for (size_t rank = 0; rank < tables->token_bytes.size(); ++rank) {
    tables->rank_of.emplace(tables->token_bytes[rank], static_cast<int32_t>(rank));
  }
  for (int byte = 0; byte < 256; ++byte) {
    OCTET_REQUIRE(tables->rank_of.contains(std::string_view(std::string(1, static_cast<char>(byte)))),
                  "Llama 3 tokenizer: {} has no token for byte {} (every byte needs one)", path.string(),
                  byte);
  }
  tables_ = std::move(tables);
}

Llama3Tokenizer::~Llama3Tokenizer() = default;

std::string Llama3Tokenizer::special_token_text(int32_t id) {
  OCTET_CHECK(id >= kRankedTokens && id < kVocabSize, "token {} is not one of Llama 3's special tokens", id);
  // Llama 3.1's names; the ones between are reserved, numbered on from 2 after <|finetune_right_pad_id|>.
  static constexpr std::array<const char*, 11> kNamed = {"begin_of_text",
                                                         "end_of_text",
                                                         "reserved_special_token_0",
                                                         "reserved_special_token_1",
                                                         "finetune_right_pad_id",
                                                         "reserved_special_token_2",
                                                         "start_header_id",
                                                         "end_header_id",
                                                         "eom_id",
                                                         "eot_id",
                                                         "python_tag"};
  const int32_t index = id - kRankedTokens;
  if (index < static_cast<int32_t>(kNamed.size()))
    return fmt::format("<|{}|>", kNamed[static_cast<size_t>(index)]);
  return fmt::format("<|reserved_special_token_{}|>", index - static_cast<int32_t>(kNamed.size()) + 3);
}

// Byte-pair merging by rank: start from the piece's bytes and repeatedly join the two adjacent parts whose
// concatenation is the token of lowest rank (the leftmost on a tie) until no adjacent pair is a token.
// `starts` holds where each part begins (and the piece's end); `pair_rank[i]` the rank of parts i and i+1
// joined. A piece that is one token as a whole is that token, without merging (so does tiktoken).
void Llama3Tokenizer::encode_pre_token(std::string_view piece, std::vector<int32_t>& ids) const {
  const Tables& tables = *tables_;
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  if (const int32_t whole = tables.rank(piece); whole != kNone) {
    ids.push_back(whole);
    return;
  }
  std::vector<size_t> starts(piece.size() + 1);
  for (size_t i = 0; i <= piece.size(); ++i) starts[i] = i;
  // The rank of parts i and i+1 joined: the bytes from starts[i] to starts[i + 2].
  const auto joined_rank = [&](size_t i) {
    return i + 2 < starts.size() ? tables.rank(piece.substr(starts[i], starts[i + 2] - starts[i])) : kNone;
  };
  std::vector<int32_t> pair_rank(piece.size());
  for (size_t i = 0; i < pair_rank.size(); ++i) pair_rank[i] = joined_rank(i);
  while (starts.size() > 2) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < starts.size(); ++i) {
      if (pair_rank[i] < pair_rank[best]) best = i;
    }
    if (pair_rank[best] == kNone) break;
    starts.erase(starts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    pair_rank.erase(pair_rank.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    pair_rank[best] = joined_rank(best);
    if (best > 0) pair_rank[best - 1] = joined_rank(best - 1);
  }
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const int32_t rank = tables.rank(piece.substr(starts[i], starts[i + 1] - starts[i]));
    OCTET_CHECK(rank != kNone, "Llama 3 tokenizer: a part of a merged pre-token is not a token");
    ids.push_back(rank);
  }
}

std::vector<int32_t> Llama3Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  std::vector<int32_t> piece_ids;
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
    piece_ids.clear();
    encode_pre_token(piece, piece_ids);
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    const std::lock_guard lock(cache_->mutex);
    if (cache_->ids.size() >= Cache::kMaxEntries) cache_->ids.clear();
    cache_->ids.emplace(piece, piece_ids);
  }
  return ids;
}

std::string Llama3Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    OCTET_REQUIRE(id >= 0 && id < kVocabSize,
                  "Llama 3 tokenizer: token {} at index {} is outside the vocabulary of size {}", id, i,
                  kVocabSize);
    if (id < kRankedTokens) {
      text += tables_->token_bytes[static_cast<size_t>(id)];
    } else {
      text += special_token_text(id);
    }
  }
  return text;
}

}  // namespace octet::io
