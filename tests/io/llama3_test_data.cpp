// Texts and vocabularies for the Llama 3 tokenizer tests (see llama3_test_data.h).
#include "llama3_test_data.h"

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "io_test_util.h"
#include "octet/io/corpus.h"
#include "octet/io/llama3_tokenizer.h"

namespace octet::testing {

namespace {

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) group |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 2]);
    out.push_back(kAlphabet[(group >> 18) & 63]);
    out.push_back(kAlphabet[(group >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(group >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kAlphabet[group & 63] : '=');
  }
  return out;
}

}  // namespace

std::filesystem::path tokenizer_data_dir() {
  const char* env = std::getenv("OCTET_DATA_DIR");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env) : OCTET_SOURCE_DIR "/.cache/data";
}

std::string llama3_mixed_text() {
  return "Hello world! The quick brown fox jumps over the lazy dog.\n"
         "It's, they're, we've, I'm, you'll, he'd; don't. DON'T IT'S We'Re THEY'LL she'D 'tis' ''quoted'' "
         "x's\n"
         "Numbers: 0 7 42 1961 3.14159 -273.15 1,000,000 2^10=1024 #1 $5 50% 12th 0x1F 12345678901234567890\n"
         "int main(int argc, char** argv) {\n    for (size_t i = 0; i < n; ++i) x[i] += y[i] * 2;\n"
         "    return argc > 1 ? EXIT_FAILURE : 0;  // done\n}\n"
         "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2], \"b\": None}\n"
         "Whitespace:  two  spaces,\tone\ttab,\t\ttwo tabs, trailing spaces   \n"
         "\n\n\nthree blank lines, then a line of spaces\n      \nand CRLF\r\nend\r\n  \r\n\r\n x\n"
         "Punctuation: ... !!! ??? --- (parens) [brackets] {braces} <angle> \"quotes\" `tick` "
         "@#%&*+=|\\/~^_\n"
         "Caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 Stra\xC3\x9F"
         "e \xC3\x85ngstr\xC3\xB6m fa\xC3\xA7"
         "ade \xC3\x89L\xC3\x88VE\n"
         "Greek: \xCE\x93\xCE\xB5\xCE\xB9\xCE\xAC \xCF\x83\xCE\xBF\xCF\x85 \xCF\x80=3.14\n"
         "Cyrillic: \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!\n"
         "CJK: \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 "
         "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 "
         "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xE9\x95\x87\n"
         "Emoji: \xF0\x9F\x99\x82 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
         "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"
         "\xE2\x80\x8D\xF0\x9F\x91\xA7 \xE2\x9D\xA4\xEF\xB8\x8F!! \xF0\x9F\xA6\x99Llama\n"
         "Combining: e\xCC\x81 a\xCC\x88o\xCC\x88 n\xCC\x83 \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D"
         "\xE0\xA4\xA6\xE0\xA5\x80\n"
         "Digits: \xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4 \xE2\x85\xA0\xE2\x85\xA1 \xC2\xBD \xE2\x91\xA0 "
         "\xEF\xBC\x91\xEF\xBC\x92\n"
         "Spaces: a\xC2\xA0"
         "b c\xE2\x80\x83"
         "d e\xE3\x80\x80"
         "f g\xE2\x80\xA8h\n"
         "Arabic: \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 Hebrew: "
         "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D\n"
         "   leading spaces and trailing ones \t \n  ";
}

std::string llama3_random_fragments(size_t size) {
  // White space and line breaks, apostrophes next to letters of either case, digits of several scripts,
  // letters of several scripts, combining marks, emoji, zero-width joiners, Unicode spaces, punctuation.
  const std::vector<std::string> fragments = {" ",
                                              " ",
                                              "  ",
                                              "\t",
                                              "\n",
                                              "\r\n",
                                              "\r",
                                              "'",
                                              "'s",
                                              "'T",
                                              "'re",
                                              "'VE",
                                              "'m",
                                              "'Ll",
                                              "'d",
                                              "'S",
                                              "a",
                                              "the",
                                              "Z",
                                              "ing",
                                              "1",
                                              "42",
                                              "2024",
                                              "7",
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
                                              "\xE2\x80\xA8",
                                              "\xEF\xBC\x91"};
  std::string text;
  uint64_t state = 20240801;
  while (text.size() < size) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    text += fragments[(state >> 33) % fragments.size()];
  }
  return text;
}

std::string brown_corpus_sample() {
  const auto text_dir = tokenizer_data_dir() / "brown/text";
  if (!std::filesystem::is_directory(text_dir)) return "";
  const auto files = io::list_files(text_dir, ".txt");
  // Documents from every genre, about 200 KB in all.
  std::string text;
  for (size_t i = 0; i < files.size() && text.size() < 200'000; i += 17) text += read_file_bytes(files[i]);
  return text;
}

std::vector<std::string> hand_made_llama3_tokens() {
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.emplace_back(1, static_cast<char>(byte));
  for (const char* token : {"ll", "he", "hell", "hello", " w", "xyz"}) tokens.emplace_back(token);
  while (tokens.size() < static_cast<size_t>(io::Llama3Tokenizer::kRankedTokens)) {
    const size_t i = tokens.size();
    tokens.push_back(
        std::string{'\xF8', static_cast<char>(i >> 16), static_cast<char>(i >> 8), static_cast<char>(i)});
  }
  return tokens;
}

std::string tiktoken_file(std::span<const std::string> tokens) {
  std::string text;
  for (size_t rank = 0; rank < tokens.size(); ++rank)
    text += base64(tokens[rank]) + " " + std::to_string(rank) + "\n";
  return text;
}

}  // namespace octet::testing
