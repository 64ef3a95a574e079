// Llama 3's BPE tokenizer: the pre-tokenization scanner piece by piece, the tiktoken file reader and its
// errors, merging by rank on a hand-made vocabulary (no download needed), and, with the real vocabulary
// installed by scripts/fetch_tokenizer.sh, token ids identical to the npm package llama3-tokenizer-js's (run
// through tests/io/llama3_reference.js with node) on mixed-script text, random fragments and the Brown
// corpus.
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io_test_util.h"
#include "llama3_test_data.h"
#include "mixed_text.h"
#include "octet/io/llama3_tokenizer.h"

namespace octet::io {
namespace {

using octet::testing::invalid_input_message;
using octet::testing::read_file_bytes;
using octet::testing::TempDir;
using octet::testing::write_file;

std::filesystem::path data_dir() {
  return octet::testing::tokenizer_data_dir();
}

std::filesystem::path vocabulary_dir() {
  return data_dir() / "llama3";
}

#define SKIP_WITHOUT_VOCABULARY()                                                  \
  do {                                                                             \
    if (!std::filesystem::is_regular_file(vocabulary_dir() / "llama3.tiktoken")) { \
      GTEST_SKIP() << "Llama 3's vocabulary is not in " << vocabulary_dir()        \
                   << " (run scripts/fetch_tokenizer.sh)";                         \
    }                                                                              \
  } while (0)

using Pieces = std::vector<std::string>;

Pieces pieces_of(std::string_view text) {
  Pieces pieces;
  for (std::string_view piece : llama3_pre_tokenize(text)) pieces.emplace_back(piece);
  return pieces;
}

TEST(Llama3PreTokenize, SplitsAsLlama3sPattern) {
  EXPECT_EQ(pieces_of("Hello world"), (Pieces{"Hello", " world"}));
  // Contractions in any case; the long s U+017F folds to s as in tiktoken's Rust regex.
  EXPECT_EQ(pieces_of("DON'T it's WE'RE they'Ll"),
            (Pieces{"DON", "'T", " it", "'s", " WE", "'RE", " they", "'Ll"}));
  EXPECT_EQ(pieces_of("x'\xC5\xBF"), (Pieces{"x", "'\xC5\xBF"}));
  EXPECT_EQ(pieces_of("'tis 'x"), (Pieces{"'t", "is", " '", "x"}));
  // One character that is not a line break, letter or number may lead a run of letters.
  EXPECT_EQ(pieces_of("(x _id \tab $y"), (Pieces{"(x", " _", "id", " ", "\tab", " $", "y"}));
  EXPECT_EQ(pieces_of("\nx"), (Pieces{"\n", "x"}));
  // Numbers in groups of at most three, never with a space in front.
  EXPECT_EQ(pieces_of("1234567 42"), (Pieces{"123", "456", "7", " ", "42"}));
  EXPECT_EQ(pieces_of("x2024y"), (Pieces{"x", "202", "4", "y"}));
  // Punctuation takes an optional space before it and the line breaks after it.
  EXPECT_EQ(pieces_of("a.\n\nb ...\r\nc"), (Pieces{"a", ".\n\n", "b", " ...\r\n", "c"}));
  // White space: up to the last line break of a run, else a run before a non-space gives its last
  // character to the next piece, and a run at the end stays whole.
  EXPECT_EQ(pieces_of("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces_of("a\n\nb"), (Pieces{"a", "\n\n", "b"}));
  EXPECT_EQ(pieces_of("a \n  \n  b"), (Pieces{"a", " \n  \n", " ", " b"}));
  EXPECT_EQ(pieces_of("end.   "), (Pieces{"end", ".", "   "}));
  EXPECT_EQ(pieces_of(" 7"), (Pieces{" ", "7"}));
  EXPECT_TRUE(pieces_of("").empty());
  // Unicode classes: accented and CJK letters, Arabic-Indic digits, a no-break space, an emoji.
  EXPECT_EQ(pieces_of("na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC"),
            (Pieces{"na\xC3\xAFve", " \xE6\x97\xA5\xE6\x9C\xAC"}));
  EXPECT_EQ(pieces_of("\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4"), (Pieces{"\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"}));
  EXPECT_EQ(pieces_of("a\xC2\xA0"
                      "b"),
            (Pieces{"a",
                    "\xC2\xA0"
                    "b"}));
  EXPECT_EQ(pieces_of("ok \xF0\x9F\x99\x82!"), (Pieces{"ok", " \xF0\x9F\x99\x82!"}));
  // Bytes that are not UTF-8 are characters of the "other" class, one byte each.
  EXPECT_EQ(pieces_of("a\xFF\xFE"
                      "b\xC3"),
            (Pieces{"a", "\xFF\xFE", "b", "\xC3"}));
  EXPECT_EQ(pieces_of("\xFF"
                      "b"),
            (Pieces{"\xFF"
                    "b"}));
}

TEST(Llama3Tokenizer, MergesByRankOnAHandMadeVocabulary) {
  TempDir dir;
  write_file(dir / "llama3.tiktoken",
             octet::testing::tiktoken_file(octet::testing::hand_made_llama3_tokens()));
  const Llama3Tokenizer tokenizer(dir.path());
  EXPECT_EQ(tokenizer.vocab_size(), 128256);
  EXPECT_EQ(tokenizer.encode("hello"), (std::vector<int32_t>{259}));
  // "ll" (rank 256) is joined before "he" (257), then "hell" and "hello": never "hel" + "lo".
  EXPECT_EQ(tokenizer.encode("hellol"), (std::vector<int32_t>{259, 'l'}));
  EXPECT_EQ(tokenizer.encode("lll"), (std::vector<int32_t>{256, 'l'}));  // the leftmost pair first
  EXPECT_EQ(tokenizer.encode(" wo"), (std::vector<int32_t>{260, 'o'}));
  // A pre-token that is a token as a whole is that token, although no merge leads to it.
  EXPECT_EQ(tokenizer.encode("xyz"), (std::vector<int32_t>{261}));
  EXPECT_EQ(tokenizer.encode("xyzz"), (std::vector<int32_t>{'x', 'y', 'z', 'z'}));
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{259, 260, 128000, 128009}),
            "hello w<|begin_of_text|><|eot_id|>");
}

TEST(Llama3Tokenizer, ReportsMissingAndDamagedFiles) {
  TempDir dir;
  const std::string path = (dir / "llama3.tiktoken").string();
  std::string message = invalid_input_message([&] { Llama3Tokenizer tokenizer(dir.path()); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("scripts/fetch_tokenizer.sh"), std::string::npos) << message;
  message = invalid_input_message([&] { make_tokenizer(TokenizerKind::llama3, dir.path()); });
  EXPECT_NE(message.find(path), std::string::npos) << message;

  write_file(dir / "llama3.tiktoken", "IQ== 0\nIg== 1\nIw== 2\n");
  message = invalid_input_message([&] { Llama3Tokenizer tokenizer(dir.path()); });
  EXPECT_NE(message.find(path + " holds 3 tokens where Llama 3 has 128000"), std::string::npos) << message;

  // Each line must be "<base64> <rank>", the ranks counting up from 0, the tokens distinct.
  const auto parse_error = [](std::string_view text) {
    return invalid_input_message([&] { parse_tiktoken_vocabulary(text, "v.tiktoken"); });
  };
  EXPECT_NE(parse_error("IQ== 0\nIg==1\n")
                .find("v.tiktoken line 2: \"Ig==1\" is not \"<token bytes in base64> <rank>\""),
            std::string::npos);
  EXPECT_NE(parse_error("IQ== 0\nI!== 1\n").find("line 2"), std::string::npos);
  EXPECT_NE(parse_error("IQ== 0\nIR== 1\n").find("line 2"), std::string::npos);  // non-zero unused bits
  EXPECT_NE(parse_error("IQ== 0\nIg== -1\n").find("line 2"), std::string::npos);
  EXPECT_NE(parse_error("IQ== 0\nIg== 2\n").find("line 2: rank 2 where 1 was expected"), std::string::npos);
  EXPECT_NE(
      parse_error("IQ== 0\nIg== 1\nIQ== 2\n").find("line 3: the token of rank 2 repeats the token of line 1"),
      std::string::npos);
  EXPECT_NE(parse_error("\n\n").find("holds no tokens"), std::string::npos);
  // Empty lines are skipped, as tiktoken does, and the last line needs no line break.
  EXPECT_EQ(parse_tiktoken_vocabulary("IQ== 0\n\nIWE= 1\naGVsbG8= 2", "v"),
            (std::vector<std::string>{"!", "!a", "hello"}));
}

TEST(Llama3Tokenizer, KnownIds) {
  SKIP_WITHOUT_VOCABULARY();
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  EXPECT_EQ(tokenizer.vocab_size(), 128256);
  EXPECT_EQ(tokenizer.end_of_text(), 128000);
  EXPECT_EQ(tokenizer.name(), "llama3");
  // Ids from llama3-tokenizer-js's own tests (which take them from Meta's library).
  EXPECT_EQ(tokenizer.encode("Hello world!"), (std::vector<int32_t>{9906, 1917, 0}));
  EXPECT_EQ(tokenizer.encode("This is a test sentence."),
            (std::vector<int32_t>{2028, 374, 264, 1296, 11914, 13}));
  EXPECT_EQ(tokenizer.encode("\xF0\x9F\xA6\x99"), (std::vector<int32_t>{9468, 99, 247}));
  EXPECT_EQ(tokenizer.encode("           grabbed"), (std::vector<int32_t>{1881, 30418}));
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{128000, 2028, 374, 264, 1296, 11914, 13, 128001}),
            "<|begin_of_text|>This is a test sentence.<|end_of_text|>");
  EXPECT_EQ(Llama3Tokenizer::special_token_text(128004), "<|finetune_right_pad_id|>");
  EXPECT_EQ(Llama3Tokenizer::special_token_text(128255), "<|reserved_special_token_247|>");
  // Special tokens are never produced from text, even from their own spelling.
  for (int32_t id : tokenizer.encode("<|begin_of_text|>x<|eot_id|>")) EXPECT_LT(id, 128000);
  std::string message = invalid_input_message([&] { tokenizer.decode(std::vector<int32_t>{9906, 128256}); });
  EXPECT_NE(message.find("token 128256 at index 1 is outside the vocabulary of size 128256"),
            std::string::npos)
      << message;
  message = invalid_input_message([&] { tokenizer.decode(std::vector<int32_t>{-1}); });
  EXPECT_NE(message.find("token -1 at index 0"), std::string::npos) << message;
  EXPECT_EQ(make_tokenizer(TokenizerKind::llama3, vocabulary_dir())->name(), "llama3");
  EXPECT_EQ(parse_tokenizer_kind("llama3"), TokenizerKind::llama3);
}

TEST(Llama3Tokenizer, RoundTripsAnyBytes) {
  SKIP_WITHOUT_VOCABULARY();
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  std::string all;
  for (int byte = 0; byte < 256; ++byte) all.push_back(static_cast<char>(byte));
  const std::string text = all + " caf\xC3\xA9 \xFF\xFE\x80 \xF0\x9F\x99 x\xE2\x82 x'\xC5\xBF" + all;
  const std::vector<int32_t> ids = tokenizer.encode(text);
  for (int32_t id : ids) ASSERT_LT(id, Llama3Tokenizer::kRankedTokens);
  EXPECT_EQ(tokenizer.decode(ids), text);
  EXPECT_TRUE(tokenizer.encode("").empty());
}

struct Reference {
  std::vector<int32_t> ids;
  std::vector<std::string> special_tokens;
};

// Runs tests/io/llama3_reference.js on `text`; nullopt (with the reason in `why`) when node or the package
// is missing.
std::optional<Reference> reference(const std::string& text, std::string& why) {
  if (std::system("command -v node > /dev/null 2>&1") != 0) {
    why = "node is not on PATH";
    return std::nullopt;
  }
  TempDir dir;
  write_file(dir / "text.txt", text);
  const std::string command = "node '" OCTET_SOURCE_DIR "/tests/io/llama3_reference.js' '" +
                              (dir / "text.txt").string() + "' '" + (data_dir() / "npm").string() + "' > '" +
                              (dir / "out.json").string() + "' 2> '" + (dir / "log").string() + "'";
  const int status = std::system(command.c_str());
  const int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (exit_code == 3) {
    why = read_file_bytes(dir / "log");
    return std::nullopt;
  }
  EXPECT_EQ(exit_code, 0) << read_file_bytes(dir / "log");
  const nlohmann::json out = nlohmann::json::parse(read_file_bytes(dir / "out.json"));
  Reference result;
  for (const auto& id : out.at("ids")) result.ids.push_back(id.is_number_integer() ? id.get<int32_t>() : -1);
  for (const auto& token : out.at("special_tokens"))
    result.special_tokens.push_back(token.get<std::string>());
  return result;
}

#define EXPECT_MATCHES_REFERENCE(tokenizer, text)                                  \
  do {                                                                             \
    std::string why;                                                               \
    const auto expected = reference(text, why);                                    \
    if (!expected) GTEST_SKIP() << why;                                            \
    const std::vector<int32_t> actual = (tokenizer).encode(text);                  \
    ASSERT_EQ(actual.size(), expected->ids.size());                                \
    for (size_t i = 0; i < actual.size(); ++i) {                                   \
      ASSERT_EQ(actual[i], expected->ids[i]) << "first difference at token " << i; \
    }                                                                              \
    EXPECT_EQ((tokenizer).decode(actual), text);                                   \
  } while (0)

TEST(Llama3Tokenizer, MatchesTheJavaScriptReferenceOnMixedText) {
  SKIP_WITHOUT_VOCABULARY();
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  // Special tokens' spellings are ordinary text to both.
  const std::string text = std::string(octet::testing::kMixedScriptText) + "<|begin_of_text|> <|eot_id|>\n";
  EXPECT_MATCHES_REFERENCE(tokenizer, text);
}

TEST(Llama3Tokenizer, SpecialTokensAreTheReferences) {
  SKIP_WITHOUT_VOCABULARY();
  std::string why;
  const auto expected = reference("x", why);
  if (!expected) GTEST_SKIP() << why;
  ASSERT_EQ(expected->special_tokens.size(), 256u);
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  for (int32_t id = 128000; id < 128256; ++id) {
    EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{id}),
              expected->special_tokens[static_cast<size_t>(id - 128000)])
        << id;
  }
}

TEST(Llama3Tokenizer, MatchesTheJavaScriptReferenceOnRandomFragments) {
  SKIP_WITHOUT_VOCABULARY();
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  const std::string text = octet::testing::llama3_random_fragments(30'000);
  EXPECT_MATCHES_REFERENCE(tokenizer, text);
}

TEST(Llama3Tokenizer, MatchesTheJavaScriptReferenceOnTheBrownCorpus) {
  SKIP_WITHOUT_VOCABULARY();
  const std::string text = octet::testing::brown_corpus_sample();
  if (text.empty()) GTEST_SKIP() << "the Brown corpus is not in " << data_dir() / "brown/text";
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  EXPECT_MATCHES_REFERENCE(tokenizer, text);
}

}  // namespace
}  // namespace octet::io
