// `octet report`: one self-contained HTML dashboard of a training run (loss curves, the precision map,
// per-layer FP8 statistics, throughput, alerts), read from the run's telemetry.sqlite (docs/telemetry.md) and
// optionally overlaid with a second run. The page makes no network requests: styles, script and data are
// inline, and the charts are drawn by the page itself. docs/dashboard.md explains the panels.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace octet::telemetry {

struct ReportOptions {
  std::filesystem::path run_dir;
  std::optional<std::filesystem::path>
      compare_run_dir;        // overlaid on the loss curves (e.g. a bf16 reference)
  std::filesystem::path out;  // empty: run_dir / "report.html"
};

// What went into a written report, for the command's one-line summary.
struct ReportSummary {
  std::filesystem::path path;
  int64_t bytes = 0;
  int64_t loss_points = 0;        // steps with a training loss
  int64_t validation_points = 0;  // validation losses
  int64_t fp8_layers = 0;         // layers with a GEMM in FP8 at the start of the run's latest segment
                                  // (the run's start, or its last change of mode on a resume)
  int64_t layers = 0;             // linear layers in the precision map
  int64_t events = 0;
  bool compared = false;
};

// The HTML page for a run (and the run to compare with). Throws octet::Error (invalid input) when a run
// directory has no telemetry.sqlite or it is not a readable telemetry database.
std::string render_report(const std::filesystem::path& run_dir,
                          const std::optional<std::filesystem::path>& compare_run_dir,
                          ReportSummary* summary = nullptr);

// Renders the page in memory and then writes it atomically, so that a failure leaves no partial file.
ReportSummary write_report(const ReportOptions& options);

}  // namespace octet::telemetry
