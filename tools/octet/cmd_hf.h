// `octet import hf` and `octet export`: Hugging Face checkpoints in and out (hf_convert.h).
//   octet import hf DIR --out CHECKPOINT_DIR [--tokenizer bytes|gpt2|llama3] [--force]
//   octet export CHECKPOINT --format hf|hf-fp8 --out DIR [--force]
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace octet::cli {

class HuggingFaceCommands {
 public:
  explicit HuggingFaceCommands(CLI::App& root);
  HuggingFaceCommands(const HuggingFaceCommands&) = delete;
  HuggingFaceCommands& operator=(const HuggingFaceCommands&) = delete;

  bool selected() const;
  // `octet import` was named without `hf`.
  bool group_without_command() const;
  int run() const;

 private:
  CLI::App* import_ = nullptr;
  CLI::App* import_hf_ = nullptr;
  CLI::App* export_ = nullptr;
  std::string source_;
  std::string out_;
  std::string tokenizer_;
  std::string format_;
  bool force_ = false;
};

}  // namespace octet::cli
