// See report.h. The page is put together from fixed parts (report_page.inc, report_charts.inc,
// report_script.inc) around the runs' data, which is embedded as one JSON document that the page's script
// reads.
#include "octet/telemetry/report.h"

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/atomic_file.h"
#include "octet/version.h"
#include "report_data.h"

namespace octet::telemetry {
namespace {

#include "report_charts.inc"
#include "report_page.inc"
#include "report_script.inc"

std::string escape_html(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// JSON that can sit inside a <script> element: '<' appears only inside JSON strings, where \u003c means the
// same, so no "</script>" or "<!--" can end or disturb the element.
std::string json_for_script(const nlohmann::json& document) {
  const std::string text =
      document.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string render_report(const std::filesystem::path& run_dir,
                          const std::optional<std::filesystem::path>& compare_run_dir,
                          ReportSummary* summary) {
  const RunReportData run = load_run_report_data(run_dir);
  std::optional<RunReportData> compare;
  if (compare_run_dir) {
    try {
      compare = load_run_report_data(*compare_run_dir);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::invalid_input) throw;
      throw Error(ErrorKind::invalid_input, std::string("--compare: ") + e.what());
    }
  }

  nlohmann::json document = {{"octet_version", kVersion},
                             {"run", run.document},
                             {"compare", compare ? compare->document : nlohmann::json(nullptr)}};
  const nlohmann::json& facts = run.document["facts"];
  const std::string name =
      facts.contains("name") ? facts["name"].get<std::string>() : run_dir.filename().string();

  std::string page;
  page += kPageHead;
  page += escape_html("octet report: " + name);
  page += kPageBody;
  page += json_for_script(document);
  page += kPageScript;
  page += kChartsScript;
  page += kPanelsScript;
  page += kPageEnd;

  if (summary != nullptr) {
    summary->bytes = static_cast<int64_t>(page.size());
    summary->loss_points = run.loss_points;
    summary->validation_points = run.validation_points;
    summary->fp8_layers = run.fp8_layers;
    summary->layers = run.layers;
    summary->events = run.events;
    summary->compared = compare.has_value();
  }
  return page;
}

ReportSummary write_report(const ReportOptions& options) {
  ReportSummary summary;
  summary.path = options.out.empty() ? options.run_dir / "report.html" : options.out;
  const std::string page = render_report(options.run_dir, options.compare_run_dir, &summary);
  io::write_file_atomically(summary.path, page);
  return summary;
}

}  // namespace octet::telemetry
