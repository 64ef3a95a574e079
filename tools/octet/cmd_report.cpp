// See cmd_report.h.
#include "cmd_report.h"

#include <cstdio>

#include <fmt/format.h>

#include "octet/telemetry/report.h"

namespace octet::cli {

ReportCommand::ReportCommand(CLI::App& root) {
  report_ = root.add_subcommand("report", "Write a run's dashboard: one self-contained HTML file");
  report_->add_option("RUN_DIR", run_dir_, "Run directory holding telemetry.sqlite")->required();
  report_->add_option("--compare", compare_dir_,
                      "Another run directory to overlay on the loss curves (e.g. a bf16 reference)");
  report_->add_option("--out", out_, "Where to write the page (default RUN_DIR/report.html)");
  report_->footer(
      "The page works offline: its styles, script and data are inline. docs/dashboard.md explains the "
      "panels.\n"
      "Exit codes: 0 written, 2 no or unreadable telemetry.sqlite (nothing written).\n"
      "Example:\n  octet report runs/quickstart --compare runs/quickstart-bf16");
}

bool ReportCommand::selected() const {
  return report_->parsed();
}

int ReportCommand::run() const {
  telemetry::ReportOptions options;
  options.run_dir = run_dir_;
  if (!compare_dir_.empty()) options.compare_run_dir = compare_dir_;
  options.out = out_;
  const telemetry::ReportSummary s = telemetry::write_report(options);
  std::fputs(
      fmt::format("{}: {} KiB; {} training and {} validation losses, {} of {} layers in FP8, {} events{}\n",
                  s.path.string(), (s.bytes + 1023) / 1024, s.loss_points, s.validation_points, s.fp8_layers,
                  s.layers, s.events,
                  s.compared ? fmt::format("; compared with {}", compare_dir_) : std::string())
          .c_str(),
      stdout);
  return 0;
}

}  // namespace octet::cli
