// See cmd_inspect.h. The JSON keys are documented in docs/telemetry.md and kept stable.
#include "cmd_inspect.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/telemetry/inspect.h"
#include "octet/telemetry/kernel_trace.h"

namespace octet::cli {
namespace {

using nlohmann::json;

template <typename T>
json or_null(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

std::string percent(double fraction) {
  return fmt::format("{:.3g}%", fraction * 100.0);
}

template <typename T>
std::string or_dash(const std::optional<T>& v, const char* format = "{:.4g}") {
  return v ? fmt::format(fmt::runtime(format), *v) : std::string("-");
}

json gemm_json(const GemmRecord& g) {
  return {{"layer", g.layer},
          {"gemm", g.gemm},
          {"mode", g.mode},
          {"reason", g.reason},
          {"since_step", g.since_step}};
}

json ranking_json(const std::vector<LayerRanking>& ranking) {
  json out = json::array();
  for (const LayerRanking& r : ranking) {
    out.push_back(
        {{"layer", r.layer}, {"tensor", r.tensor}, {"worst", r.worst}, {"step", r.step}, {"mean", r.mean}});
  }
  return out;
}

json to_json(const InspectReport& r, const InspectOptions& options) {
  json run = json::object();
  for (const auto& [key, value] : r.run) run[key] = value;
  json events = json::array();
  for (const EventRecord& e : r.events) {
    events.push_back({{"step", or_null(e.step)},
                      {"kind", e.kind},
                      {"layer", or_null(e.layer)},
                      {"tensor", or_null(e.tensor)},
                      {"value", or_null(e.value)},
                      {"threshold", or_null(e.threshold)},
                      {"message", e.message}});
  }
  json changes = json::array();
  for (const GemmRecord& g : r.precision_changes) changes.push_back(gemm_json(g));
  json mode_changes = json::array();
  for (const InspectReport::ModeChange& m : r.mode_changes) {
    mode_changes.push_back({{"step", m.step},
                            {"mode", m.mode},
                            {"before", m.before},
                            {"fp8_layers", m.fp8_layers},
                            {"layers", m.layers}});
  }
  json layer = nullptr;
  if (!options.layer.empty()) {
    json history = json::array();
    for (const TensorRecord& t : r.layer_history) {
      history.push_back({{"step", t.step},
                         {"tensor", t.tensor},
                         {"amax", or_null(t.amax)},
                         {"scale", or_null(t.scale)},
                         {"saturated_fraction", or_null(t.saturated_fraction)},
                         {"underflow_fraction", or_null(t.underflow_fraction)},
                         {"sqnr_db", or_null(t.sqnr_db)}});
    }
    json gemms = json::array();
    for (const GemmRecord& g : r.layer_gemms) gemms.push_back(gemm_json(g));
    layer = {{"name", options.layer}, {"gemms", gemms}, {"history", history}};
  }
  return {{"database", r.database.string()},
          {"run", run},
          {"steps",
           {{"recorded", r.steps_recorded},
            {"last", r.last_step},
            {"skipped", r.skipped_steps},
            {"last_loss", or_null(r.last_loss)},
            {"last_validation_loss", or_null(r.last_validation_loss)},
            {"fp8_gemms_first", r.first_fp8_gemms},
            {"fp8_gemms_last", r.last_fp8_gemms},
            {"other_gemms_last", r.last_other_gemms},
            {"telemetry_steps", r.telemetry_steps}}},
          {"saturation", ranking_json(r.saturation)},
          {"underflow", ranking_json(r.underflow)},
          {"precision_changes", changes},
          {"mode_changes", mode_changes},
          {"events", events},
          {"layer", layer}};
}

std::string value_of(const InspectReport& r, const char* key) {
  const auto it = r.run.find(key);
  return it != r.run.end() ? it->second : std::string("?");
}

void print_ranking(std::string& out, const std::vector<LayerRanking>& ranking, const char* title,
                   const char* none) {
  out += fmt::format("\n{}\n", title);
  if (ranking.empty()) {
    out += fmt::format("  {}\n", none);
    return;
  }
  out += fmt::format("  {:<20} {:<10} {:>9} {:>8} {:>9}\n", "layer", "tensor", "worst", "at step", "mean");
  for (const LayerRanking& l : ranking) {
    out += fmt::format("  {:<20} {:<10} {:>9} {:>8} {:>9}\n", l.layer, l.tensor, percent(l.worst), l.step,
                       percent(l.mean));
  }
}

std::string to_text(const InspectReport& r, const InspectOptions& options) {
  std::string out;
  out += fmt::format("Run {} ({})\n", value_of(r, "name"), r.database.string());
  out += fmt::format("  mode {}, device {}, octet {}, started {}\n", value_of(r, "mode"),
                     value_of(r, "device"), value_of(r, "octet_version"), value_of(r, "started_at"));
  if (r.run.count("recipe") != 0) out += fmt::format("  recipe {}\n", value_of(r, "recipe"));
  out += fmt::format("  steps: {} recorded, the last {}; {} skipped; last loss {}; last validation loss {}\n",
                     r.steps_recorded, r.last_step, r.skipped_steps, or_dash(r.last_loss),
                     or_dash(r.last_validation_loss));
  out += fmt::format("  FP8 GEMMs per step: {} at the first step, {} at the last ({} others)\n",
                     r.first_fp8_gemms, r.last_fp8_gemms, r.last_other_gemms);
  out += fmt::format("  FP8 tensors recorded at {} steps (every {} steps)\n", r.telemetry_steps,
                     value_of(r, "telemetry_interval"));
  print_ranking(out, r.saturation,
                "Most saturated (fraction of a tensor's values clipped to the largest FP8 value):",
                "no FP8 tensor saturated");
  print_ranking(out, r.underflow,
                "Most underflowed (fraction of a tensor's non-zero values flushed to zero):",
                "no FP8 tensor underflowed");
  out += "\nPrecision changes:\n";
  if (r.precision_changes.empty()) out += "  none: every GEMM ran as the policy set it at the start\n";
  // A change of mode is one line for all the GEMM rows written at its step; a layer's GEMMs that changed
  // together are one line.
  for (const InspectReport::ModeChange& m : r.mode_changes) {
    out += fmt::format("  from step {}: mode {} ({} before): {} of {} layers with a GEMM in FP8\n", m.step,
                       m.mode, m.before, m.fp8_layers, m.layers);
  }
  for (size_t i = 0; i < r.precision_changes.size();) {
    const GemmRecord& g = r.precision_changes[i];
    if (std::any_of(r.mode_changes.begin(), r.mode_changes.end(),
                    [&](const InspectReport::ModeChange& m) { return m.step == g.since_step; })) {
      ++i;
      continue;
    }
    std::vector<std::string> gemms;
    for (; i < r.precision_changes.size(); ++i) {
      const GemmRecord& h = r.precision_changes[i];
      if (h.layer != g.layer || h.since_step != g.since_step || h.mode != g.mode || h.reason != g.reason)
        break;
      gemms.push_back(h.gemm);
    }
    out += fmt::format("  from step {}: {} {} in {} ({})\n", g.since_step, g.layer, fmt::join(gemms, ", "),
                       g.mode, g.reason);
  }
  out += fmt::format("\nEvents ({}):\n", r.events.size());
  if (r.events.empty()) out += "  none\n";
  for (const EventRecord& e : r.events) {
    out += fmt::format("  step {} {}: {}\n", or_dash(e.step, "{}"), e.kind, e.message);
  }
  if (!options.layer.empty()) {
    out += fmt::format("\nLayer {}:\n", options.layer);
    for (const GemmRecord& g : r.layer_gemms) {
      out += fmt::format("  {} in {} from step {} ({})\n", g.gemm, g.mode, g.since_step, g.reason);
    }
    out += fmt::format("  {:>6} {:<10} {:>11} {:>11} {:>10} {:>10} {:>8}\n", "step", "tensor", "amax",
                       "scale", "saturated", "underflow", "sqnr_db");
    for (const TensorRecord& t : r.layer_history) {
      out += fmt::format("  {:>6} {:<10} {:>11} {:>11} {:>10} {:>10} {:>8}\n", t.step, t.tensor,
                         or_dash(t.amax), or_dash(t.scale),
                         t.saturated_fraction ? percent(*t.saturated_fraction) : std::string("-"),
                         t.underflow_fraction ? percent(*t.underflow_fraction) : std::string("-"),
                         or_dash(t.sqnr_db, "{:.1f}"));
    }
  }
  return out;
}

// `--kernels`: the kernel trace's summary, one row per kernel name, most time first.
std::string kernels_text(const KernelSummary& s, const std::string& source) {
  const auto share = [&](uint64_t ns) {
    return s.total_ns > 0 ? static_cast<double>(ns) / static_cast<double>(s.total_ns) : 0.0;
  };
  std::string out = fmt::format("Kernel trace {}\n", source);
  out += fmt::format("  steps {} to {} on {}: {} launches, {:.3f} ms of GPU time{}\n", s.first_step,
                     s.last_step, s.device, s.launches, static_cast<double>(s.total_ns) / 1e6,
                     s.dropped_records > 0
                         ? fmt::format(" ({} records lost: the trace is incomplete)", s.dropped_records)
                         : std::string());
  out +=
      fmt::format("  {:<64} {:>7} {:>10} {:>10} {:>7}\n", "kernel", "count", "total ms", "mean us", "share");
  for (const KernelSummaryRow& r : s.rows) {
    const char* marker = r.kernel_class == KernelClass::fp8_gemm ? "  FP8 GEMM"
                         : r.kernel_class == KernelClass::cast   ? "  cast"
                                                                 : "";
    out += fmt::format("  {:<64} {:>7} {:>10.3f} {:>10.2f} {:>7}{}\n",
                       r.kind == DeviceActivity::Kind::kernel ? kernel_display_name(r.name) : r.name, r.count,
                       static_cast<double>(r.total_ns) / 1e6, r.mean_ns / 1e3, percent(r.share), marker);
  }
  if (s.fp8_gemm_launches > 0) {
    out += fmt::format("FP8 GEMM kernels: {} launches, {} of GPU time\n", s.fp8_gemm_launches,
                       percent(share(s.fp8_gemm_ns)));
  } else {
    out +=
        fmt::format("FP8 GEMM kernels: none ran in the profiled steps ({} launches recorded)\n", s.launches);
  }
  out += fmt::format("octet's FP8 casts: {} launches, {} of GPU time\n", s.cast_launches,
                     percent(share(s.cast_ns)));
  if (!s.host_parts.empty()) {
    // The trainer's parts of the steps as the host spent them: enqueueing work, and waiting where a part
    // needs a result from the device (the forward's loss, the gradient norm).
    out += fmt::format("host, the trainer's parts of the steps:\n  {:<64} {:>7} {:>10} {:>10}\n", "part",
                       "count", "total ms", "mean ms");
    for (const HostPartRow& r : s.host_parts) {
      out += fmt::format("  {:<64} {:>7} {:>10.3f} {:>10.3f}\n", r.name, r.count,
                         static_cast<double>(r.total_ns) / 1e6,
                         static_cast<double>(r.total_ns) / 1e6 / static_cast<double>(r.count));
    }
  }
  return out;
}

}  // namespace

InspectCommand::InspectCommand(CLI::App& root) {
  inspect_ =
      root.add_subcommand("inspect", "Show what a run's FP8 scaling did, layer by layer, from its telemetry");
  inspect_->add_option("RUN_DIR", run_dir_, "Run directory holding telemetry.sqlite")->required();
  inspect_->add_flag("--json", json_, "Print one JSON document (keys in docs/telemetry.md)");
  CLI::Option* layer = inspect_->add_option(
      "--layer", layer_, "Also print this layer's amax, scale, saturation and underflow history");
  CLI::Option* top = inspect_->add_option("--top", top_, "Layers in each ranking (default 5)");
  inspect_
      ->add_flag("--kernels", kernels_,
                 "Print the kernel trace of [profiling] instead (RUN_DIR/profile/kernels.jsonl, or RUN_DIR "
                 "itself holding kernels.jsonl): each kernel's launches, time and share, FP8 GEMMs marked")
      ->excludes(layer)
      ->excludes(top);
  inspect_->footer(
      "Works while the run is still training. docs/telemetry.md explains every figure.\n"
      "Exit codes: 0 printed, 2 no run directory, no or unreadable telemetry.sqlite, or an unknown layer;\n"
      "with --kernels, 2 no kernel trace or an unreadable one.\n"
      "Examples:\n  octet inspect runs/quickstart\n  octet inspect runs/quickstart --layer h.0.mlp.c_fc\n"
      "  octet inspect runs/quickstart --json\n  octet inspect runs/quickstart --kernels");
}

bool InspectCommand::selected() const {
  return inspect_->parsed();
}

int InspectCommand::run() const {
  if (kernels_) {
    const std::filesystem::path file = find_kernel_trace(run_dir_);
    const KernelSummary summary = summarize_kernels(read_kernel_trace(file));
    std::string text;
    if (json_) {
      json doc = json::parse(kernel_summary_json(summary));
      doc["trace"] = file.string();
      text = doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    } else {
      text = kernels_text(summary, file.string());
    }
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  InspectOptions options;
  options.layer = layer_;
  options.top = top_;
  const InspectReport report = inspect_run(run_dir_, options);
  const std::string text =
      json_ ? to_json(report, options).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
            : to_text(report, options);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace octet::cli
