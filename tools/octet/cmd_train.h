// `octet config show`, `octet data prepare` and `octet train`: the commands of a training workflow. Each only
// wires the command line to the library (run_config.h, corpus.h, training_run.h).
//   octet config show CONFIG [--set section.key=value ...]
//   octet config keys
//   octet data prepare --tokenizer bytes|gpt2 --out DIR FILES...
//   octet train CONFIG [--set section.key=value ...] [--resume]
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace octet::cli {

class WorkflowCommands {
 public:
  explicit WorkflowCommands(CLI::App& root);
  WorkflowCommands(const WorkflowCommands&) = delete;
  WorkflowCommands& operator=(const WorkflowCommands&) = delete;

  bool selected() const;
  // The group (`config`, `data`) was named without a subcommand.
  bool group_without_command() const;
  int run() const;

 private:
  CLI::App* config_ = nullptr;
  CLI::App* config_show_ = nullptr;
  CLI::App* config_keys_ = nullptr;
  CLI::App* data_ = nullptr;
  CLI::App* data_prepare_ = nullptr;
  CLI::App* train_ = nullptr;
  std::string config_file_;
  std::vector<std::string> overrides_;
  std::string tokenizer_ = "bytes";
  std::string out_dir_;
  std::string vocabulary_dir_;
  std::vector<std::string> text_files_;
  bool resume_ = false;
};

}  // namespace octet::cli
