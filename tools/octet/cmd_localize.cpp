// See cmd_localize.h.
#include "cmd_localize.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "cmd_train.h"
#include "number_parse.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/io/atomic_file.h"
#include "octet/train/layer_chooser.h"
#include "octet/train/localization.h"

namespace octet::cli {

LocalizeCommand::LocalizeCommand(CLI::App& root) {
  localize_ = root.add_subcommand(
      "localize", "Choose by measurement which linear layers run in FP8 and write a precision map");
  localize_->add_option("CONFIG", config_file_, "TOML configuration file (docs/config.md)")->required();
  localize_->add_option("--set", overrides_, "Override a key: section.key=value (repeatable)");
  localize_->add_option(
      "--batches", batches_,
      fmt::format("Batches of the training split every variant runs, 1 to {} (default 4)", kMaxCount));
  localize_->add_option("--budget", budget_,
                        "The predicted loss change allowed, in percent of the BF16 loss (default 0.5)");
  localize_->add_option("--init-from", init_from_,
                        "Localize the weights of this checkpoint (a run directory: its latest) instead of "
                        "the initialisation");
  localize_->add_option("--out", out_,
                        "Where to write the precision map (default: beside CONFIG, NAME.precision_map.json)");
  localize_->add_flag("--free-casts", free_casts_,
                      "Without a GPU: model the FP8 casts as free (where each is fused into the op that "
                      "produces its operand) instead of as bytes moved at 3.35 TB/s");
  localize_->footer(
      "For each linear layer the [fp8] settings would convert: its casts' SQNR, saturation and underflow\n"
      "with every layer in FP8; the loss change and gradient cosines with it alone in FP8 (against all in\n"
      "BF16) and alone in BF16 (against all in FP8), on the same batches, forward and backward, no update;\n"
      "and the time its three GEMMs save in FP8 (measured on a GPU, modelled without one). The layers that\n"
      "save the most within the budget run in FP8. Train with it: fp8.precision_map = FILE.\n"
      "Exit codes: 0 written; 2 invalid configuration, data, checkpoint or option, or an output that cannot "
      "be\nwritten (one line on standard error; nothing written).\n"
      "Example:\n  octet localize configs/quickstart.toml --batches 4 --budget 0.5\n"
      "  octet train configs/quickstart.toml --set fp8.precision_map=configs/quickstart.precision_map.json");
}

bool LocalizeCommand::selected() const {
  return localize_->parsed();
}

int LocalizeCommand::run() const {
  const auto began = std::chrono::steady_clock::now();
  LocalizationOptions options;
  int64_t batches = 0;
  const auto [end, error] = std::from_chars(batches_.data(), batches_.data() + batches_.size(), batches);
  OCTET_REQUIRE(error == std::errc() && end == batches_.data() + batches_.size() && batches >= 1 &&
                    batches <= kMaxCount,
                "--batches '{}' is not a whole number from 1 to {}", quote_token(batches_), kMaxCount);
  options.batches = batches;
  double budget = -1.0;
  const auto [budget_end, budget_error] =
      std::from_chars(budget_.data(), budget_.data() + budget_.size(), budget);
  OCTET_REQUIRE(budget_error == std::errc() && budget_end == budget_.data() + budget_.size() &&
                    std::isfinite(budget) && budget >= 0.0 && budget <= 100.0,
                "--budget '{}' is not a percentage from 0 to 100", quote_token(budget_));
  options.budget = budget / 100.0;
  if (!init_from_.empty()) {
    try {
      options.init_from = resolve_checkpoint(init_from_);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("--init-from: {}", e.what()));
    }
  }
  const RunConfig config = load_run_config(config_file_, overrides_);
  const std::filesystem::path out =
      out_.empty() ? default_precision_map_path(config_file_) : std::filesystem::path(out_);
  if (free_casts_) options.gain_model.bandwidth_gbs = 0.0;
  options.out = stdout;
  const PrecisionMapFile map = run_localization(config, options);
  io::write_file_atomically(out, precision_map_file_json(map));
  std::fputs(precision_map_table(map).c_str(), stdout);
  int64_t fp8 = 0, measured = 0;
  for (const LocalizedLayer& l : map.layers) {
    measured += l.excluded.empty() ? 1 : 0;
    fp8 += l.excluded.empty() && l.fp8 ? 1 : 0;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::printf("gain: %s\n", map.gain_basis.c_str());
  std::printf(
      "wrote %s: %lld of %lld measured layers in FP8 (%zu linear layers), saving %.3g ms per micro-batch; "
      "loss change predicted %s, measured %s (budget %s); took %.1f s\n",
      out.string().c_str(), static_cast<long long>(fp8), static_cast<long long>(measured), map.layers.size(),
      map.saving_ms, percent_change(map.predicted_loss_change).c_str(),
      percent_change((map.loss_chosen - map.loss_bf16) / map.loss_bf16).c_str(),
      percent_change(map.budget).substr(1).c_str(), seconds);
  std::printf("train with fp8.precision_map = \"%s\"\n", out.string().c_str());
  return 0;
}

}  // namespace octet::cli
