// `octet localize CONFIG [--batches N] [--budget PERCENT] [--init-from CHECKPOINT] [--out FILE]`: measures
// each FP8-eligible linear layer's cast numerics, sensitivity and gain, chooses which run in FP8 within a
// budget of predicted loss change, and writes the precision map that fp8.precision_map reads
// (docs/localization.md).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace octet::cli {

class LocalizeCommand {
 public:
  explicit LocalizeCommand(CLI::App& root);
  LocalizeCommand(const LocalizeCommand&) = delete;
  LocalizeCommand& operator=(const LocalizeCommand&) = delete;

  bool selected() const;
  int run() const;

 private:
  CLI::App* localize_ = nullptr;
  std::string config_file_;
  std::vector<std::string> overrides_;
  std::string batches_ = "4";
  std::string budget_ = "0.5";
  std::string init_from_;
  std::string out_;
  bool free_casts_ = false;
};

}  // namespace octet::cli
