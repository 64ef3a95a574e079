// `octet config show`, `octet data prepare` and `octet train`: the commands of a training workflow. Each only
// wires the command line to the library (run_config.h, corpus.h, training_run.h).
//   octet config show CONFIG [--set section.key=value ...]
//   octet config keys
//   octet data prepare --tokenizer bytes|gpt2|llama3 --out DIR FILES...
//   octet train CONFIG [--set section.key=value ...] [--resume | --resume-from CHECKPOINT | --init-from
//               CHECKPOINT] [--overwrite]
//   octet eval CHECKPOINT [--data DIR] [--batches N]
//   octet generate CHECKPOINT --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--seed S]
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace octet::cli {

// The largest --batches and --max-tokens value.
inline constexpr int64_t kMaxCount = 2147483647;

// A checkpoint directory, or a run directory standing for its latest complete checkpoint.
std::filesystem::path resolve_checkpoint(const std::string& given);

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
  CLI::App* eval_ = nullptr;
  CLI::App* generate_ = nullptr;
  std::string checkpoint_;
  std::string eval_data_;
  std::string eval_batches_ = "0";  // parsed and range-checked by the command, not by CLI11
  std::string prompt_;
  std::string max_tokens_ = "64";
  float temperature_ = 0.8f;
  int64_t top_k_ = 40;
  uint64_t seed_ = 1;
  std::string device_;  // eval and generate: auto, cpu or cuda; empty: the run's train.device
  std::string config_file_;
  std::vector<std::string> overrides_;
  std::string tokenizer_ = "bytes";
  std::string out_dir_;
  std::string vocabulary_dir_;
  std::vector<std::string> text_files_;
  bool resume_ = false;
  std::string resume_from_;
  std::string init_from_;
  bool overwrite_ = false;
  int64_t gpus_ = 0;
  int64_t ranks_ = 0;
};

}  // namespace octet::cli
