// `octet calibrate CONFIG [--batches N] [--statistic S] [--init-from CHECKPOINT] [--out FILE]`: measures the
// FP8 operands of the configured model's linear layers over batches of its training data in BF16 and writes
// the calibration file that fp8.calibration reads (docs/localization.md).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace octet::cli {

class CalibrateCommand {
 public:
  explicit CalibrateCommand(CLI::App& root);
  CalibrateCommand(const CalibrateCommand&) = delete;
  CalibrateCommand& operator=(const CalibrateCommand&) = delete;

  bool selected() const;
  int run() const;

 private:
  CLI::App* calibrate_ = nullptr;
  std::string config_file_;
  std::vector<std::string> overrides_;
  std::string batches_ = "8";
  std::string statistic_ = "amax";
  std::string init_from_;
  std::string out_;
};

}  // namespace octet::cli
