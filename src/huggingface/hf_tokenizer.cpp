// Tokenizer files of a Hugging Face export (see hf_tokenizer.h).
#include "hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "llama3_tokenizer_json.h"
#include "octet/check.h"
#include "octet/io/input.h"
#include "octet/io/llama3_tokenizer.h"
#include "octet/train/checkpoint.h"

namespace octet::hf {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kGpt2EndOfText = 50256;
constexpr int64_t kLlama3BeginOfText = 128000;
constexpr int64_t kLlama3EndOfText = 128001;
constexpr int64_t kMaxVocabularyBytes = int64_t{64} << 20;

std::string read_tokenizer_file(const fs::path& path) {
  return io::read_regular_file(path, "tokenizer file", kMaxVocabularyBytes);
}

}  // namespace

TokenizerExport find_tokenizer(const RunConfig& config, const fs::path& checkpoint) {
  TokenizerExport t;
  const std::optional<io::TokenizerKind> kind = io::parse_tokenizer_kind(config.tokenizer);
  OCTET_REQUIRE(kind.has_value(), "the checkpoint's tokenizer '{}' is not one octet knows",
                io::printable(config.tokenizer));
  t.kind = *kind;
  if (t.kind == io::TokenizerKind::gpt2) t.ids = {kGpt2EndOfText, kGpt2EndOfText};
  if (t.kind == io::TokenizerKind::llama3) t.ids = {kLlama3BeginOfText, kLlama3EndOfText};
  if (io::tokenizer_files(t.kind).empty()) return t;
  try {
    t.files = checkpoint_tokenizer_files(t.kind, checkpoint, config.data_dir);
  } catch (const Error& e) {
    t.note = std::string("no tokenizer files written: ") + e.what();
  }
  return t;
}

std::vector<TokenizerFile> tokenizer_output(const TokenizerExport& t, const ModelConfig& model) {
  if (t.files.empty()) return {};
  if (t.kind == io::TokenizerKind::gpt2) {
    // encoder.json is transformers' vocab.json and vocab.bpe its merges.txt, byte for byte.
    const nlohmann::json config = {{"tokenizer_class", "GPT2Tokenizer"},
                                   {"model_max_length", model.max_seq_len},
                                   {"bos_token", "<|endoftext|>"},
                                   {"eos_token", "<|endoftext|>"},
                                   {"unk_token", "<|endoftext|>"},
                                   {"add_prefix_space", false}};
    return {{"merges.txt", read_tokenizer_file(t.files / "vocab.bpe")},
            {"tokenizer_config.json", config.dump(2) + "\n"},
            {"vocab.json", read_tokenizer_file(t.files / "encoder.json")}};
  }
  // Llama 3: the ranked tokens of llama3.tiktoken as the fast tokenizer transformers loads.
  const std::vector<std::string> tokens =
      io::read_tiktoken_vocabulary(t.files / io::kLlama3VocabularyFiles[0]);
  return {{"special_tokens_map.json", llama3_special_tokens_map_json()},
          {"tokenizer.json", llama3_tokenizer_json(tokens)},
          {"tokenizer_config.json", llama3_tokenizer_config_json(model.max_seq_len)}};
}

}  // namespace octet::hf
