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
