// Reads one run's telemetry.sqlite (docs/telemetry.md) into the JSON document that the dashboard page embeds.
// Internal to the report: the page's script (report_script.inc) is the only reader of this document.
#pragma once

#include <cstdint>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace octet::telemetry {

struct RunReportData {
  nlohmann::json document;  // see load_run_report_data for its layout
  int64_t loss_points = 0;
  int64_t validation_points = 0;
  int64_t fp8_layers = 0;
  int64_t layers = 0;
  int64_t events = 0;
};

// At most this many telemetry steps become heatmap columns; longer runs are sampled evenly (first and last
// kept).
inline constexpr int64_t kMaxHeatmapColumns = 400;

// Throws octet::Error (invalid input) naming the file when there is no database or it cannot be read as one.
RunReportData load_run_report_data(const std::filesystem::path& run_dir);

}  // namespace octet::telemetry
