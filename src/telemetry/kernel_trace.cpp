// The kernel trace's files, their reader and the per-kernel summary (kernel_trace.h).
//
// How a kernel is recognised, from its name alone (names as CUPTI gives them, C++ names demangled):
// - an FP8 GEMM is
//   - a cuBLASLt "nvjet" kernel whose type code (the word after "nvjet_" and an optional "smNN_") has an FP8
//     letter among its operand letters, the letters before the last three (C, compute and D types):
//     "q" for E4M3 and "r" for E5M2, as in nvjet_sm90_qqtst_... (E4M3 x E4M3 into BF16) and
//     nvjet_sm90_qrtst_... (E4M3 x E5M2); nvjet_sm90_tst_... (BF16) has none;
//   - or any other kernel, not octet's own, whose name holds "gemm" and "e4m3" or "e5m2": cuBLASLt's
//     sm90_xmma_gemm_e4m3e4m3_..., sm89_xmma_gemm_e4m3bf16_..., CUTLASS's
//     cutlass3x_sm90_tensorop_gemm_e4m3_... and CUTLASS templates over float_e4m3_t;
// - a cast is one of octet's kernels (namespace octet::) whose function name has the word "cast" between its
//   underscores: cast_amax_kernel, cast_transpose_amax_kernel, produce_cast_kernel,
//   normalization_cast_transpose_kernel, swiglu_backward_cast_kernel, adamw_cast_tiles_kernel, ...
#include "octet/telemetry/kernel_trace.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/io/atomic_file.h"

namespace octet {
namespace {

using nlohmann::json;

constexpr std::string_view kFormat = "octet-kernel-trace";
constexpr int64_t kVersion = 1;
constexpr size_t kMaxNameBytes = 4096;
constexpr uintmax_t kMaxFileBytes = uintmax_t{1} << 30;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> words(std::string_view s) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find('_', begin), s.size());
    out.emplace_back(s.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

bool is_octet_kernel(std::string_view name) {
  return name.find("octet::") != std::string_view::npos;
}

bool nvjet_fp8(const std::string& function) {
  const std::vector<std::string> w = words(function);
  if (w.empty() || w[0] != "nvjet") return false;
  size_t i = 1;
  if (i < w.size() && w[i].size() > 2 && w[i].compare(0, 2, "sm") == 0 &&
      std::all_of(w[i].begin() + 2, w[i].end(),
                  [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    ++i;
  if (i >= w.size()) return false;
  const std::string& code = w[i];
  if (code.size() <= 3 || !std::all_of(code.begin(), code.end(),
                                       [](char c) { return std::islower(static_cast<unsigned char>(c)); }))
    return false;
  const std::string operands = code.substr(0, code.size() - 3);
  return operands.find_first_of("qr") != std::string::npos;
}

// The name with "(anonymous namespace)" taken out and cut before its parameter list.
std::string signature_head(std::string_view name) {
  std::string s(name);
  for (size_t at; (at = s.find("(anonymous namespace)")) != std::string::npos;) s.erase(at, 21);
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>' && depth > 0) --depth;
    if (s[i] == '(' && depth == 0) return s.substr(0, i);
  }
  return s;
}

// The last name of a qualified head ("void a::b::f<x::y>" -> "f<x::y>"), with template arguments kept.
std::string last_component(const std::string& head) {
  int depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i < head.size(); ++i) {
    const char c = head[i];
    if (c == '<') ++depth;
    if (c == '>' && depth > 0) --depth;
    if (depth == 0 && c == ' ') begin = i + 1;
    if (depth == 0 && c == ':' && i + 1 < head.size() && head[i + 1] == ':') begin = i + 2;
  }
  return head.substr(begin);
}

const char* kind_name(DeviceActivity::Kind k) {
  switch (k) {
    case DeviceActivity::Kind::kernel:
      return "kernel";
    case DeviceActivity::Kind::memcpy:
      return "memcpy";
    case DeviceActivity::Kind::memset:
      return "memset";
    case DeviceActivity::Kind::host:
      return "host";
  }
  return "?";
}

json triple(const std::array<int32_t, 3>& v) {
  return json::array({v[0], v[1], v[2]});
}

double ms(uint64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

[[noreturn]] void refuse(std::string_view origin, size_t line, const std::string& what) {
  throw Error(ErrorKind::invalid_input,
              fmt::format("{}:{}: {}; not a kernel trace as octet writes it (kernels.jsonl, docs/gpu.md)",
                          origin, line, what));
}

// An integer field in [lo, hi]; floats, strings, missing values and integers out of range are refused.
template <typename T>
T integer_field(const json& object, const char* key, T lo, T hi, std::string_view origin, size_t line) {
  const auto it = object.find(key);
  if (it == object.end()) refuse(origin, line, fmt::format("no \"{}\"", key));
  if (!it->is_number_integer())
    refuse(origin, line, fmt::format("\"{}\" must be an integer, got {}", key, it->dump().substr(0, 40)));
  // JSON's non-negative integers read as unsigned, negative ones as signed.
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    bool in_range = false;
    if constexpr (std::is_signed_v<T>) {
      in_range = v <= static_cast<uint64_t>(INT64_MAX) &&
                 static_cast<int64_t>(v) >= static_cast<int64_t>(lo) &&
                 static_cast<int64_t>(v) <= static_cast<int64_t>(hi);
    } else {
      in_range = v >= static_cast<uint64_t>(lo) && v <= static_cast<uint64_t>(hi);
    }
    if (in_range) return static_cast<T>(v);
  } else if constexpr (std::is_signed_v<T>) {
    const int64_t v = it->get<int64_t>();
    if (v >= static_cast<int64_t>(lo) && v <= static_cast<int64_t>(hi)) return static_cast<T>(v);
  }
  refuse(origin, line, fmt::format("\"{}\" = {} is out of range ({} to {})", key, it->dump(), lo, hi));
}

std::string string_field(const json& object, const char* key, std::string_view origin, size_t line) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string())
    refuse(origin, line, fmt::format("\"{}\" must be a string", key));
  return it->get<std::string>();
}

std::array<int32_t, 3> triple_field(const json& object, const char* key, std::string_view origin,
                                    size_t line) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_array() || it->size() != 3)
    refuse(origin, line, fmt::format("\"{}\" must be a list of 3 integers", key));
  std::array<int32_t, 3> out{};
  for (size_t i = 0; i < 3; ++i) {
    const json& v = (*it)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      refuse(origin, line, fmt::format("\"{}\" must be a list of 3 integers from 0 to {}", key, INT32_MAX));
    out[i] = static_cast<int32_t>(v.get<int64_t>());
  }
  return out;
}

}  // namespace

std::string_view kernel_class_name(KernelClass c) {
  switch (c) {
    case KernelClass::fp8_gemm:
      return "fp8_gemm";
    case KernelClass::cast:
      return "cast";
    case KernelClass::other:
      return "other";
  }
  return "other";
}

std::string kernel_function_name(std::string_view name) {
  const std::string component = last_component(signature_head(name));
  const size_t angle = component.find('<');
  return angle == std::string::npos ? component : component.substr(0, angle);
}

std::string kernel_display_name(std::string_view name, size_t width) {
  std::string shown = last_component(signature_head(name));
  if (shown.empty()) shown = std::string(name);
  if (width >= 4 && shown.size() > width) shown = shown.substr(0, width - 3) + "...";
  return shown;
}

KernelClass classify_kernel(std::string_view name) {
  const std::string function = kernel_function_name(name);
  if (is_octet_kernel(name)) {
    const std::vector<std::string> w = words(function);
    return std::find(w.begin(), w.end(), "cast") != w.end() ? KernelClass::cast : KernelClass::other;
  }
  if (nvjet_fp8(function)) return KernelClass::fp8_gemm;
  const std::string l = lower(name);
  if (l.find("gemm") != std::string::npos &&
      (l.find("e4m3") != std::string::npos || l.find("e5m2") != std::string::npos))
    return KernelClass::fp8_gemm;
  return KernelClass::other;
}

KernelSummary summarize_kernels(const KernelTrace& trace) {
  KernelSummary s;
  s.device = trace.device;
  s.dropped_records = trace.dropped_records;
  std::map<std::pair<int, std::string>, KernelSummaryRow> rows;
  bool any = false;
  for (const DeviceActivity& a : trace.activities) {
    const uint64_t ns = a.end_ns - a.start_ns;
    s.first_step = !any ? a.step : std::min(s.first_step, a.step);
    s.last_step = !any ? a.step : std::max(s.last_step, a.step);
    any = true;
    if (a.kind == DeviceActivity::Kind::host) {  // the host's parts: beside the device's work, not in it
      auto part = std::find_if(s.host_parts.begin(), s.host_parts.end(),
                               [&](const HostPartRow& r) { return r.name == a.name; });
      if (part == s.host_parts.end()) part = s.host_parts.insert(part, HostPartRow{.name = a.name});
      ++part->count;
      part->total_ns += ns;
      continue;
    }
    ++s.launches;
    s.total_ns += ns;
    KernelSummaryRow& row = rows[{static_cast<int>(a.kind), a.name}];
    if (row.count == 0) {
      row.name = a.name;
      row.kind = a.kind;
      row.kernel_class =
          a.kind == DeviceActivity::Kind::kernel ? classify_kernel(a.name) : KernelClass::other;
    }
    ++row.count;
    row.total_ns += ns;
    if (row.kernel_class == KernelClass::fp8_gemm) {
      ++s.fp8_gemm_launches;
      s.fp8_gemm_ns += ns;
    } else if (row.kernel_class == KernelClass::cast) {
      ++s.cast_launches;
      s.cast_ns += ns;
    }
  }
  for (auto& [key, row] : rows) {
    row.mean_ns = static_cast<double>(row.total_ns) / static_cast<double>(row.count);
    row.share = s.total_ns > 0 ? static_cast<double>(row.total_ns) / static_cast<double>(s.total_ns) : 0.0;
    s.rows.push_back(std::move(row));
  }
  std::stable_sort(s.rows.begin(), s.rows.end(), [](const KernelSummaryRow& a, const KernelSummaryRow& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  return s;
}

std::string kernels_jsonl(const KernelTrace& trace) {
  int64_t first = 0, last = 0;
  for (size_t i = 0; i < trace.activities.size(); ++i) {
    const int64_t step = trace.activities[i].step;
    first = i == 0 ? step : std::min(first, step);
    last = i == 0 ? step : std::max(last, step);
  }
  std::string out = json{{"format", kFormat},
                         {"version", kVersion},
                         {"device", trace.device},
                         {"records", trace.activities.size()},
                         {"first_step", first},
                         {"last_step", last},
                         {"dropped_records", trace.dropped_records}}
                        .dump(-1, ' ', false, json::error_handler_t::replace);
  out += '\n';
  for (const DeviceActivity& a : trace.activities) {
    json line{{"step", a.step},         {"kind", kind_name(a.kind)}, {"name", a.name},
              {"start_ns", a.start_ns}, {"end_ns", a.end_ns},        {"stream", a.stream},
              {"device", a.device}};
    if (a.kind == DeviceActivity::Kind::kernel) {
      line["grid"] = triple(a.grid);
      line["block"] = triple(a.block);
    } else {
      line["bytes"] = a.bytes;
    }
    out += line.dump(-1, ' ', false, json::error_handler_t::replace);
    out += '\n';
  }
  return out;
}

std::string chrome_trace_json(const KernelTrace& trace) {
  uint64_t origin = 0;
  for (size_t i = 0; i < trace.activities.size(); ++i)
    origin = i == 0 ? trace.activities[i].start_ns : std::min(origin, trace.activities[i].start_ns);
  const auto us = [origin](uint64_t ns) { return static_cast<double>(ns - origin) / 1000.0; };
  json events = json::array();
  // The host's parts of the steps on a row of their own, above the devices'.
  constexpr uint32_t kHostProcess = 1u << 20;
  bool host = false;
  std::map<uint32_t, std::map<uint32_t, bool>> streams;                         // device -> streams seen
  std::map<std::pair<uint32_t, int64_t>, std::pair<uint64_t, uint64_t>> steps;  // (device, step) -> span
  for (const DeviceActivity& a : trace.activities) {
    json args{{"step", a.step}};
    if (a.kind == DeviceActivity::Kind::host) {
      events.push_back({{"name", a.name},
                        {"cat", "host"},
                        {"ph", "X"},
                        {"ts", us(a.start_ns)},
                        {"dur", static_cast<double>(a.end_ns - a.start_ns) / 1000.0},
                        {"pid", kHostProcess},
                        {"tid", 0},
                        {"args", args}});
      host = true;
      continue;
    }
    if (a.kind == DeviceActivity::Kind::kernel) {
      args["grid"] = triple(a.grid);
      args["block"] = triple(a.block);
      args["class"] = kernel_class_name(classify_kernel(a.name));
    } else {
      args["bytes"] = a.bytes;
    }
    events.push_back({{"name", a.name},
                      {"cat", kind_name(a.kind)},
                      {"ph", "X"},
                      {"ts", us(a.start_ns)},
                      {"dur", static_cast<double>(a.end_ns - a.start_ns) / 1000.0},
                      {"pid", a.device},
                      {"tid", a.stream},
                      {"args", args}});
    streams[a.device][a.stream] = true;
    auto [it, fresh] = steps.try_emplace({a.device, a.step}, a.start_ns, a.end_ns);
    if (!fresh) {
      it->second.first = std::min(it->second.first, a.start_ns);
      it->second.second = std::max(it->second.second, a.end_ns);
    }
  }
  // One row per device above its streams: each step from its first start to its last end.
  constexpr uint32_t kStepRow = 0xFFFFFFFFu;
  for (const auto& [key, span] : steps) {
    events.push_back({{"name", fmt::format("step {}", key.second)},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"ts", us(span.first)},
                      {"dur", static_cast<double>(span.second - span.first) / 1000.0},
                      {"pid", key.first},
                      {"tid", kStepRow}});
  }
  for (const auto& [device, seen] : streams) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", device},
                      {"args", {{"name", fmt::format("GPU {}", device)}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", device},
                      {"tid", kStepRow},
                      {"args", {{"name", "steps"}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", device},
                      {"tid", kStepRow},
                      {"args", {{"sort_index", -1}}}});
    for (const auto& [stream, unused] : seen) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", device},
                        {"tid", stream},
                        {"args", {{"name", fmt::format("stream {}", stream)}}}});
    }
  }
  if (host) {
    events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", kHostProcess}, {"args", {{"name", "host"}}}});
    events.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", kHostProcess}, {"args", {{"sort_index", -1}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", kHostProcess},
                      {"tid", 0},
                      {"args", {{"name", "trainer"}}}});
  }
  const json doc{{"traceEvents", events},
                 {"displayTimeUnit", "ns"},
                 {"otherData", {{"producer", "octet"}, {"device", trace.device}, {"origin_ns", origin}}}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string kernel_summary_json(const KernelSummary& s) {
  const auto share = [&](uint64_t ns) {
    return s.total_ns > 0 ? static_cast<double>(ns) / static_cast<double>(s.total_ns) : 0.0;
  };
  json kernels = json::array();
  for (const KernelSummaryRow& r : s.rows) {
    kernels.push_back({{"name", r.name},
                       {"kind", kind_name(r.kind)},
                       {"class", kernel_class_name(r.kernel_class)},
                       {"fp8", r.kernel_class == KernelClass::fp8_gemm},
                       {"cast", r.kernel_class == KernelClass::cast},
                       {"count", r.count},
                       {"total_ms", ms(r.total_ns)},
                       {"mean_us", r.mean_ns / 1000.0},
                       {"share", r.share}});
  }
  json host = json::array();
  for (const HostPartRow& r : s.host_parts) {
    host.push_back({{"name", r.name},
                    {"count", r.count},
                    {"total_ms", ms(r.total_ns)},
                    {"mean_ms", ms(r.total_ns) / static_cast<double>(r.count)}});
  }
  const json doc{
      {"format", "octet-kernel-summary"},
      {"version", kVersion},
      {"device", s.device},
      {"first_step", s.first_step},
      {"last_step", s.last_step},
      {"launches", s.launches},
      {"total_ms", ms(s.total_ns)},
      {"dropped_records", s.dropped_records},
      {"fp8_gemm",
       {{"launches", s.fp8_gemm_launches}, {"total_ms", ms(s.fp8_gemm_ns)}, {"share", share(s.fp8_gemm_ns)}}},
      {"casts", {{"launches", s.cast_launches}, {"total_ms", ms(s.cast_ns)}, {"share", share(s.cast_ns)}}},
      {"kernels", kernels},
      {"host_parts", host}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

void write_kernel_trace(const std::filesystem::path& dir, const KernelTrace& trace) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  OCTET_REQUIRE(!ec, "cannot create the trace directory {}: {}", dir.string(), ec.message());
  io::write_file_atomically(dir / "trace.json", chrome_trace_json(trace));
  io::write_file_atomically(dir / "summary.json", kernel_summary_json(summarize_kernels(trace)));
  // Last: the file octet reads back, so that a trace directory with kernels.jsonl is whole.
  io::write_file_atomically(dir / "kernels.jsonl", kernels_jsonl(trace));
}

KernelTrace parse_kernels_jsonl(std::string_view text, std::string_view origin) {
  if (text.empty()) refuse(origin, 1, "the file is empty");
  if (text.back() != '\n')
    refuse(origin, static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1,
           "the last line is cut short (no line break at its end)");
  KernelTrace trace;
  size_t line_number = 0;
  size_t records = 0;
  int64_t first_step = 0, last_step = 0;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    const json object = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (object.is_discarded() || !object.is_object()) refuse(origin, line_number, "not one JSON object");
    if (line_number == 1) {
      const auto format = object.find("format");
      if (format == object.end() || !format->is_string() || format->get<std::string>() != kFormat)
        refuse(origin, 1, fmt::format("the first line must name the format \"{}\"", kFormat));
      const int64_t version = integer_field<int64_t>(object, "version", 0, INT64_MAX, origin, 1);
      if (version != kVersion)
        refuse(origin, 1, fmt::format("version {} (this octet reads {})", version, kVersion));
      trace.device = string_field(object, "device", origin, 1);
      records = integer_field<uint64_t>(object, "records", 0, uint64_t{1} << 40, origin, 1);
      first_step = integer_field<int64_t>(object, "first_step", 0, INT64_MAX, origin, 1);
      last_step = integer_field<int64_t>(object, "last_step", first_step, INT64_MAX, origin, 1);
      trace.dropped_records = integer_field<uint64_t>(object, "dropped_records", 0, UINT64_MAX, origin, 1);
      continue;
    }
    if (trace.activities.size() == records)
      refuse(origin, line_number,
             fmt::format("more lines than the {} records the first line announces", records));
    DeviceActivity a;
    const std::string kind = string_field(object, "kind", origin, line_number);
    if (kind == "kernel") {
      a.kind = DeviceActivity::Kind::kernel;
    } else if (kind == "memcpy") {
      a.kind = DeviceActivity::Kind::memcpy;
    } else if (kind == "memset") {
      a.kind = DeviceActivity::Kind::memset;
    } else if (kind == "host") {
      a.kind = DeviceActivity::Kind::host;
    } else {
      refuse(origin, line_number, "\"kind\" must be \"kernel\", \"memcpy\", \"memset\" or \"host\"");
    }
    a.name = string_field(object, "name", origin, line_number);
    if (a.name.empty() || a.name.size() > kMaxNameBytes)
      refuse(origin, line_number, fmt::format("\"name\" must have 1 to {} bytes", kMaxNameBytes));
    a.step = integer_field<int64_t>(object, "step", std::max<int64_t>(first_step, 1), last_step, origin,
                                    line_number);
    a.start_ns = integer_field<uint64_t>(object, "start_ns", 0, UINT64_MAX, origin, line_number);
    a.end_ns = integer_field<uint64_t>(object, "end_ns", a.start_ns, UINT64_MAX, origin, line_number);
    a.stream = integer_field<uint32_t>(object, "stream", 0, UINT32_MAX, origin, line_number);
    a.device = integer_field<uint32_t>(object, "device", 0, UINT32_MAX, origin, line_number);
    if (a.kind == DeviceActivity::Kind::kernel) {
      a.grid = triple_field(object, "grid", origin, line_number);
      a.block = triple_field(object, "block", origin, line_number);
    } else {
      a.bytes = integer_field<uint64_t>(object, "bytes", 0, UINT64_MAX, origin, line_number);
    }
    trace.activities.push_back(std::move(a));
  }
  if (trace.activities.size() != records) {
    refuse(origin, line_number,
           fmt::format("{} records where the first line announces {} (the file is cut short)",
                       trace.activities.size(), records));
  }
  return trace;
}

KernelTrace read_kernel_trace(const std::filesystem::path& kernels_file) {
  std::error_code ec;
  const bool regular = std::filesystem::is_regular_file(kernels_file, ec);
  OCTET_REQUIRE(regular, "{} is not a file", kernels_file.string());
  const uintmax_t bytes = std::filesystem::file_size(kernels_file, ec);
  OCTET_REQUIRE(!ec && bytes <= kMaxFileBytes, "{}: {} bytes, more than the {} a kernel trace may have",
                kernels_file.string(), bytes, kMaxFileBytes);
  std::ifstream in(kernels_file, std::ios::binary);
  OCTET_REQUIRE(in.good(), "cannot open {}", kernels_file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_kernels_jsonl(text.str(), kernels_file.string());
}

std::filesystem::path find_kernel_trace(const std::filesystem::path& dir) {
  std::error_code ec;
  OCTET_REQUIRE(std::filesystem::is_directory(dir, ec),
                "{} is not a directory (a run directory or a trace directory)", dir.string());
  for (const std::filesystem::path& candidate : {dir / "kernels.jsonl", dir / "profile" / "kernels.jsonl"}) {
    if (std::filesystem::exists(candidate, ec)) return candidate;
  }
  OCTET_REQUIRE(
      false,
      "{} holds no kernel trace (no kernels.jsonl, no profile/kernels.jsonl): train on the GPU with "
      "--set profiling.enabled=true (docs/gpu.md, \"Profiling\"); a run whose profiling.trace_dir is "
      "elsewhere: pass that directory",
      dir.string());
  return {};
}

}  // namespace octet
