// The tokenizer files of a Hugging Face export: GPT-2's vocab.json and merges.txt (octet's encoder.json
// and vocab.bpe under transformers' names) with tokenizer_config.json, or Llama 3's tokenizer.json,
// tokenizer_config.json and special_tokens_map.json (built from llama3.tiktoken); and the bos and eos token
// ids config.json names.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "octet/config/run_config.h"
#include "octet/huggingface/hf_config.h"
#include "octet/io/tokenizer.h"

namespace octet::hf {

struct TokenizerExport {
  io::TokenizerKind kind = io::TokenizerKind::bytes;
  std::filesystem::path files;  // where the tokenizer's files are; empty: none found (or none exist)
  TokenIds ids;                 // bos and eos of the tokenizer; none for bytes
  std::string note;             // a line for the caller when files were looked for and not found
};

// The tokenizer of the checkpoint's run (data.tokenizer) and where its files are: the checkpoint's copy,
// else the run's data directory, else where scripts/fetch_tokenizer.sh puts them.
TokenizerExport find_tokenizer(const RunConfig& config, const std::filesystem::path& checkpoint);

// One file of the export's tokenizer: its name in the output directory and its contents.
struct TokenizerFile {
  std::string name;
  std::string contents;
};

// Reads the tokenizer's files and makes the export's from them, in memory, so that a file that cannot be
// read or is malformed stops the export before anything is written (throws invalid_input naming it). None
// when `tokenizer.files` is empty.
std::vector<TokenizerFile> tokenizer_output(const TokenizerExport& tokenizer, const ModelConfig& model);

}  // namespace octet::hf
