// Tokenizer files of a Hugging Face export (see hf_tokenizer.h).
#include "hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/atomic_file.h"
#include "octet/io/input.h"
#include "octet/train/checkpoint.h"

namespace octet::hf {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kGpt2EndOfText = 50256;
constexpr int64_t kLlama3BeginOfText = 128000;
constexpr int64_t kLlama3EndOfText = 128001;
constexpr int64_t kMaxVocabularyBytes = int64_t{64} << 20;

void copy_as(const fs::path& from, const fs::path& to) {
  io::write_file_atomically(to, io::read_regular_file(from, "tokenizer file", kMaxVocabularyBytes));
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

std::vector<std::string> write_tokenizer(const TokenizerExport& t, const ModelConfig& model, const fs::path& dir) {
  if (t.files.empty()) return {};
  if (t.kind == io::TokenizerKind::gpt2) {
    // encoder.json is transformers' vocab.json and vocab.bpe its merges.txt, byte for byte.
    copy_as(t.files / "encoder.json", dir / "vocab.json");
    copy_as(t.files / "vocab.bpe", dir / "merges.txt");
    const nlohmann::json config = {{"tokenizer_class", "GPT2Tokenizer"},
                                   {"model_max_length", model.max_seq_len},
                                   {"bos_token", "<|endoftext|>"},
                                   {"eos_token", "<|endoftext|>"},
                                   {"unk_token", "<|endoftext|>"},
                                   {"add_prefix_space", false}};
    io::write_file_atomically(dir / "tokenizer_config.json", config.dump(2) + "\n");
    return {"merges.txt", "tokenizer_config.json", "vocab.json"};
  }
  // Llama 3: the tiktoken ranks as they are (docs/huggingface.md says how to load them).
  copy_as(t.files / "llama3.tiktoken", dir / "llama3.tiktoken");
  return {"llama3.tiktoken"};
}

}  // namespace octet::hf
