// `octet report RUN_DIR [--compare OTHER_RUN_DIR] [--out FILE]`: writes the run's HTML dashboard
// (docs/dashboard.md) and prints one line saying where and what it holds.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace octet::cli {

class ReportCommand {
 public:
  explicit ReportCommand(CLI::App& root);
  ReportCommand(const ReportCommand&) = delete;
  ReportCommand& operator=(const ReportCommand&) = delete;

  bool selected() const;
  int run() const;

 private:
  CLI::App* report_ = nullptr;
  std::string run_dir_;
  std::string compare_dir_;
  std::string out_;
};

}  // namespace octet::cli
