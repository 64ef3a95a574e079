// See cmd_calibrate.h.
#include "cmd_calibrate.h"

#include <charconv>
#include <cstdio>

#include <fmt/format.h>

#include "cmd_train.h"
#include "number_parse.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/io/atomic_file.h"
#include "octet/train/calibration_run.h"

namespace octet::cli {

CalibrateCommand::CalibrateCommand(CLI::App& root) {
  calibrate_ = root.add_subcommand(
      "calibrate", "Measure the FP8 operands of every linear layer on training data and write their scales");
  calibrate_->add_option("CONFIG", config_file_, "TOML configuration file (docs/config.md)")->required();
  calibrate_->add_option("--set", overrides_, "Override a key: section.key=value (repeatable)");
  calibrate_->add_option("--batches", batches_,
                         fmt::format("Batches of the training split to run, 1 to {} (default 8)", kMaxCount));
  calibrate_->add_option("--statistic", statistic_,
                         "What chooses each scale: amax (default), p99, p99.9 or p99.99 of the magnitudes");
  calibrate_->add_option("--init-from", init_from_,
                         "Calibrate the weights of this checkpoint (a run directory: its latest) instead of "
                         "the initialisation");
  calibrate_->add_option(
      "--out", out_, "Where to write the calibration file (default: beside CONFIG, NAME.calibration.json)");
  calibrate_->footer(
      "Runs the configured model in bf16 (forward and backward, no update) on the first batches training "
      "would\n"
      "take, and records each FP8 layer's activation, weight and gradient: amax, p99, p99.9, p99.99 and the\n"
      "scale fp8_max / (statistic x 2^fp8.margin). Train with it: fp8.recipe = \"static\" and "
      "fp8.calibration = FILE.\n"
      "Exit codes: 0 written; 2 invalid configuration, data, checkpoint or option, or an output that cannot "
      "be\n"
      "written (one line on standard error; nothing written).\n"
      "Example:\n  octet calibrate configs/quickstart.toml --batches 16\n"
      "  octet train configs/quickstart.toml --set train.mixed_precision=fp8 --set fp8.recipe=static "
      "--set fp8.calibration=configs/quickstart.calibration.json");
}

bool CalibrateCommand::selected() const {
  return calibrate_->parsed();
}

int CalibrateCommand::run() const {
  CalibrationOptions options;
  int64_t batches = 0;
  const auto [end, error] = std::from_chars(batches_.data(), batches_.data() + batches_.size(), batches);
  OCTET_REQUIRE(error == std::errc() && end == batches_.data() + batches_.size() && batches >= 1 &&
                    batches <= kMaxCount,
                "--batches '{}' is not a whole number from 1 to {}", quote_token(batches_), kMaxCount);
  options.batches = batches;
  const std::optional<CalibrationStatistic> statistic = parse_calibration_statistic(statistic_);
  OCTET_REQUIRE(statistic.has_value(), "--statistic '{}' is not one of amax, p99, p99.9, p99.99",
                quote_token(statistic_));
  options.statistic = *statistic;
  if (!init_from_.empty()) {
    try {
      options.init_from = resolve_checkpoint(init_from_);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("--init-from: {}", e.what()));
    }
  }
  const RunConfig config = load_run_config(config_file_, overrides_);
  const std::filesystem::path out =
      out_.empty() ? default_calibration_path(config_file_) : std::filesystem::path(out_);
  options.out = stdout;
  const Calibration calibration = run_calibration(config, options);
  io::write_file_atomically(out, calibration_json(calibration));
  int64_t measured = 0;
  for (const CalibratedLayer& l : calibration.layers) measured += l.excluded.empty() ? 1 : 0;
  std::printf(
      "wrote %s: %lld of %zu linear layers calibrated (scales from %s); train with fp8.recipe = "
      "\"static\" and fp8.calibration = \"%s\"\n",
      out.string().c_str(), static_cast<long long>(measured), calibration.layers.size(),
      std::string(calibration_statistic_name(calibration.statistic)).c_str(), out.string().c_str());
  return 0;
}

}  // namespace octet::cli
