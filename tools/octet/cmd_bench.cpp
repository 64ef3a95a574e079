// See cmd_bench.h. The JSON keys are documented in docs/cli.md and kept stable: bench/compare.sh reads them.
#include "cmd_bench.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/backend/gpu_bench.h"
#include "octet/backend/registry.h"
#include "octet/check.h"
#include "octet/config/run_config.h"
#include "octet/model/model.h"
#include "octet/model/precision_policy.h"
#include "octet/numerics/scaling.h"
#include "octet/train/training_bench.h"
#include "octet/version.h"

namespace octet::cli {
namespace {

using nlohmann::json;

// Without --config or --shapes: square products and the shapes of GPT-2 124M and of a 4096-wide model.
const GemmBenchShape kDefaultShapes[] = {
    {8192, 8192, 8192, ""}, {16384, 768, 768, ""},   {16384, 3072, 768, ""},
    {16384, 768, 3072, ""}, {16384, 4096, 4096, ""}, {16384, 11008, 4096, ""},
};

// "M,N,K": three positive integers, nothing else.
GemmBenchShape parse_shape(const std::string& text) {
  GemmBenchShape shape;
  int64_t* const fields[3] = {&shape.M, &shape.N, &shape.K};
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  bool ok = true;
  for (int i = 0; i < 3 && ok; ++i) {
    const std::from_chars_result r = std::from_chars(p, end, *fields[i]);
    ok = r.ec == std::errc() && r.ptr != p && *fields[i] >= 1;
    p = r.ptr;
    if (ok && i < 2) ok = p != end && *p++ == ',';
  }
  OCTET_REQUIRE(
      ok && p == end,
      "--shapes '{}' is not a shape: expected M,N,K, three positive integers such as 4096,4096,4096", text);
  return shape;
}

// Per linear layer of the model: forward (M = B*T, N = OC, K = C), input gradient (M = B*T, N = C, K = OC)
// and weight gradient (M = OC, N = C, K = B*T). An LM head without FP8 GEMMs runs them on chunks of
// lm_head_chunk_rows(model.arch) rows instead of B*T: those shapes too. Products of the same shape share one
// row.
std::vector<GemmBenchShape> shapes_of(const RunConfig& config) {
  const int64_t BT = config.train.batch_size * config.train.seq_len;
  const int64_t C = config.model.channels;
  struct Layer {
    const char* name;
    int64_t in;
    int64_t out;
  };
  const Layer layers[] = {{"h.*.attn.c_attn", C, 3 * C},
                          {"h.*.attn.c_proj", C, C},
                          {"h.*.mlp.c_fc", C, 4 * C},
                          {"h.*.mlp.c_proj", 4 * C, C},
                          {"lm_head", C, config.model.padded_vocab()}};
  std::vector<GemmBenchShape> shapes;
  const auto add = [&shapes](int64_t M, int64_t N, int64_t K, const std::string& label) {
    for (GemmBenchShape& s : shapes) {
      if (s.M == M && s.N == N && s.K == K) {
        s.label += ", " + label;
        return;
      }
    }
    shapes.push_back({M, N, K, label});
  };
  for (const Layer& l : layers) {
    add(BT, l.out, l.in, fmt::format("{} forward", l.name));
    add(BT, l.in, l.out, fmt::format("{} input grad", l.name));
    add(l.out, l.in, BT, fmt::format("{} weight grad", l.name));
  }
  const int64_t Vp = config.model.padded_vocab();
  const int64_t rows = lm_head_chunk_rows(config.model.arch);
  if (BT > rows && !PrecisionPolicy(config.precision, config.model, BT).layer("lm_head").fp8()) {
    add(rows, Vp, C, fmt::format("lm_head forward, {}-row chunk", rows));
    add(rows, C, Vp, fmt::format("lm_head input grad, {}-row chunk", rows));
    add(Vp, C, rows, fmt::format("lm_head weight grad, {}-row chunk", rows));
  }
  return shapes;
}

// The CUDA backend, which has a GPU to measure.
const BackendFactory& require_gpu(const char* command) {
  const BackendFactory* cuda = find_backend("cuda");
  OCTET_REQUIRE(cuda != nullptr,
                "this octet was built without CUDA: `{}` needs a CUDA build (configure where nvcc is found) "
                "and a GPU",
                command);
  OCTET_REQUIRE(cuda->device_count() > 0, "no CUDA GPU is visible (no driver, or no device): `{}` needs one",
                command);
  OCTET_CHECK(cuda->device_bench() != nullptr, "the CUDA backend has device measurements");
  return *cuda;
}

// The fastest FP8 kind over BF16; none when either is missing.
std::optional<double> fp8_over_bf16(const GemmBenchRow& row) {
  double fp8 = 0.0, bf16 = 0.0;
  for (const GemmBenchResult& r : row.results) {
    if (!r.skipped.empty()) continue;
    if (is_fp8_kind(r.kind)) fp8 = std::max(fp8, r.tflops);
    if (r.kind == GemmBenchKind::bf16) bf16 = r.tflops;
  }
  if (fp8 <= 0.0 || bf16 <= 0.0) return std::nullopt;
  return fp8 / bf16;
}

json row_json(const GemmBenchRow& row) {
  json results = json::object();
  for (const GemmBenchResult& r : row.results) {
    results[std::string(gemm_bench_kind_key(r.kind))] =
        r.skipped.empty() ? json{{"tflops", r.tflops}, {"median_ms", r.median_ms}}
                          : json{{"skipped", r.skipped}};
  }
  const std::optional<double> speedup = fp8_over_bf16(row);
  return {{"label", row.shape.label}, {"M", row.shape.M},
          {"N", row.shape.N},         {"K", row.shape.K},
          {"results", results},       {"fp8_over_bf16", speedup ? json(*speedup) : json(nullptr)}};
}

std::string row_text(const GemmBenchRow& row) {
  std::string line = fmt::format("| {} | {} | {} | {} |", row.shape.label.empty() ? "-" : row.shape.label,
                                 row.shape.M, row.shape.N, row.shape.K);
  for (const GemmBenchResult& r : row.results) {
    line += r.skipped.empty() ? fmt::format(" {:.1f} |", r.tflops) : std::string(" - |");
  }
  const std::optional<double> speedup = fp8_over_bf16(row);
  line += speedup ? fmt::format(" {:.2f}x |", *speedup) : std::string(" - |");
  return line;
}

json bandwidth_json(const BandwidthBenchResult& r, const BandwidthBenchSettings& settings) {
  if (!r.skipped.empty()) return {{"skipped", r.skipped}};
  return {{"bytes", r.bytes},
          {"warmup_iterations", settings.warmup_iterations},
          {"repeats", settings.repeats},
          {"copy_gbs", r.copy_gbs},
          {"copy_median_ms", r.copy_median_ms},
          {"read_gbs", r.read_gbs},
          {"read_median_ms", r.read_median_ms}};
}

std::string bandwidth_text(const BandwidthBenchResult& r, const BandwidthBenchSettings& settings) {
  if (!r.skipped.empty()) return "memory bandwidth: not measured: " + r.skipped;
  const double gib = static_cast<double>(r.bytes) / static_cast<double>(size_t{1} << 30);
  return fmt::format(
      "memory bandwidth: {:.1f} GB/s copy (device to device, {:.2f} GiB, read + write bytes), {:.1f} GB/s "
      "read (a kernel summing {:.2f} GiB); median of {} repeats after {} warm-up",
      r.copy_gbs, gib, r.read_gbs, gib, settings.repeats, settings.warmup_iterations);
}

// The linear layers grouped by kind ("attn.c_attn", the block index dropped) and by the precision of their
// three GEMMs, in the model's order: what a FLOP count of the step needs to know.
json linear_gemms_json(const std::vector<LinearPlan>& linears) {
  json groups = json::array();
  for (const LinearPlan& plan : linears) {
    std::string kind = plan.name;
    if (kind.rfind("h.", 0) == 0) kind = kind.substr(kind.find('.', 2) + 1);
    const std::string forward(gemm_mode_name(plan.forward)), input(gemm_mode_name(plan.input_gradient)),
        weight(gemm_mode_name(plan.weight_gradient));
    bool found = false;
    for (json& g : groups) {
      if (g["linear"] == kind && g["in_features"] == plan.in_features &&
          g["out_features"] == plan.out_features && g["forward"] == forward && g["input_gradient"] == input &&
          g["weight_gradient"] == weight) {
        g["layers"] = g["layers"].get<int64_t>() + 1;
        found = true;
        break;
      }
    }
    if (!found) {
      groups.push_back({{"linear", kind},
                        {"in_features", plan.in_features},
                        {"out_features", plan.out_features},
                        {"layers", 1},
                        {"forward", forward},
                        {"input_gradient", input},
                        {"weight_gradient", weight}});
    }
  }
  return groups;
}

}  // namespace

BenchCommands::BenchCommands(CLI::App& root) {
  bench_ = root.add_subcommand("bench", "Measure GEMM and training throughput on this machine");

  gemm_ = bench_->add_subcommand(
      "gemm", "TFLOP/s of the GEMMs octet runs (FP8, BF16, TF32 through cuBLASLt) and memory bandwidth");
  gemm_->add_option("--config", config_file_, "Take the shapes of this configuration's linear layers");
  gemm_->add_option("--set", overrides_, "With --config: override a key, section.key=value (repeatable)");
  gemm_->add_option("--shapes", shapes_, "Shapes M,N,K to time (D[M,N] = A[M,K] x B[N,K]^T), one or more");
  gemm_->add_option("--iterations", iterations_, "Products per timed repeat (default 20)");
  gemm_->add_option("--gemm-algorithms", gemm_algorithms_,
                    "heuristic or timed: how each shape's cuBLASLt algorithm is chosen (default: the "
                    "configuration's train.gemm_algorithms with --config, else heuristic)");
  gemm_->add_flag("--json", json_, "Print one JSON object instead of the table");
  gemm_->footer(
      "Each product is timed with CUDA events: 5 warm-up products, then 5 repeats of --iterations products;\n"
      "the median repeat gives the time per product. Operands are random in [-1, 1); FP8 and BF16 write "
      "BF16,\n"
      "TF32 writes float32. fp8/bf16 is the fastest FP8 column over BF16. Without --config or --shapes a\n"
      "fixed list of square and transformer shapes is timed. Then the device memory bandwidth: a 1 GiB\n"
      "device-to-device copy (GB/s of read + write bytes) and a kernel that only reads 1 GiB, each\n"
      "the median of 10 repeats after 3 warm-up runs.\n"
      "Exit codes: 0 done, 2 invalid arguments, or no CUDA in this build, or no GPU.\n"
      "Examples:\n"
      "  octet bench gemm --config configs/bench/gpt2-124M.toml\n"
      "  octet bench gemm --shapes 4096,4096,4096 16384,3072,768 --json");

  train_ = bench_->add_subcommand("train", "Training throughput, MFU and memory of a configuration");
  train_->add_option("CONFIG", config_file_, "TOML configuration file (docs/config.md)")->required();
  train_->add_option("--steps", steps_, "Timed optimizer steps (default 20)");
  train_->add_option("--warmup", warmup_, "Untimed steps before them (default 5)");
  train_->add_option("--phase-steps", phase_steps_,
                     "Steps of the synchronised pass that times forward, backward, optimizer and data "
                     "(default 5; 0: no pass)");
  train_->add_option("--set", overrides_, "Override a key: section.key=value (repeatable)");
  CLI::Option* random =
      train_->add_flag("--random-tokens", random_tokens_, "Train on uniform random tokens (the default)");
  train_->add_flag("--data", config_data_, "Train on the configuration's data.dir instead")->excludes(random);
  train_->add_flag("--json", json_, "Print one JSON object instead of the report");
  train_->footer(
      "Builds the backend, model and trainer as `octet train` does (telemetry off), without a run directory\n"
      "or checkpoints. MFU uses 6N + 12LCT model FLOPs per token (N: parameters without the position\n"
      "embedding) against the GPU's dense datasheet peaks.\n"
      "Exit codes: 0 done, 2 invalid arguments or configuration, 3 training could not go on.\n"
      "Examples:\n"
      "  octet bench train configs/bench/gpt2-124M.toml\n"
      "  octet bench train configs/quickstart.toml --set train.device=cpu --steps 3 --warmup 1 --json");
}

bool BenchCommands::leaf_selected() const {
  return gemm_->parsed() || train_->parsed();
}

int BenchCommands::run() const {
  return gemm_->parsed() ? run_gemm() : run_train();
}

int BenchCommands::run_gemm() const {
  // Arguments first, so that a bad one is reported as such on any machine.
  OCTET_REQUIRE(iterations_ >= 1, "--iterations must be at least 1, got {}", iterations_);
  OCTET_REQUIRE(overrides_.empty() || !config_file_.empty(), "--set needs --config");
  OCTET_REQUIRE(gemm_algorithms_.empty() || gemm_algorithms_ == "heuristic" || gemm_algorithms_ == "timed",
                "--gemm-algorithms '{}' is not valid; expected \"heuristic\" or \"timed\"", gemm_algorithms_);
  std::vector<GemmBenchShape> shapes;
  std::string source = "the default shapes";
  GemmBenchSettings settings;
  settings.iterations = iterations_;
  if (!config_file_.empty()) {
    const RunConfig config = load_run_config(config_file_, overrides_);
    settings.timed_algorithms = config.time_gemm_algorithms;
    shapes = shapes_of(config);
    source = fmt::format("the linear layers of {} ({}), B*T = {}", config_file_, config.model.describe(),
                         config.train.batch_size * config.train.seq_len);
  }
  for (const std::string& text : shapes_) shapes.push_back(parse_shape(text));
  if (!shapes_.empty())
    source = config_file_.empty() ? "the given shapes" : source + ", and the given shapes";
  if (shapes.empty()) shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  const BackendFactory& cuda = require_gpu("octet bench gemm");
  const DeviceBench& gpu = *cuda.device_bench();

  if (!gemm_algorithms_.empty()) settings.timed_algorithms = gemm_algorithms_ == "timed";
  const char* algorithms = settings.timed_algorithms ? "timed" : "heuristic";
  const BackendDevice device = cuda.device(0);
  const BandwidthBenchSettings bandwidth_settings;
  if (json_) {
    const std::vector<GemmBenchRow> rows = gpu.bench_gemms(shapes, settings, {});
    const BandwidthBenchResult bandwidth = gpu.bench_memory_bandwidth(bandwidth_settings);
    json kinds = json::array();
    for (GemmBenchKind kind : kGemmBenchKinds) kinds.push_back(std::string(gemm_bench_kind_key(kind)));
    json out_rows = json::array();
    for (const GemmBenchRow& row : rows) out_rows.push_back(row_json(row));
    const json out = {
        {"benchmark", "gemm"},
        {"octet_version", kVersion},
        {"device",
         {{"name", device.name}, {"compute_capability", fmt::format("{}.{}", device.major, device.minor)}}},
        {"shapes_from", source},
        {"warmup_iterations", settings.warmup_iterations},
        {"iterations", settings.iterations},
        {"repeats", settings.repeats},
        {"gemm_algorithms", algorithms},
        {"kinds", kinds},
        {"rows", out_rows},
        {"memory_bandwidth", bandwidth_json(bandwidth, bandwidth_settings)}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf(
      "GEMM throughput in TFLOP/s on %s (compute capability %d.%d), %s; median of %lld repeats of "
      "%lld products after %lld warm-up products; FP8 and BF16 write BF16, TF32 writes float32; cuBLASLt "
      "algorithms: %s\n\n",
      device.name.c_str(), device.major, device.minor, source.c_str(),
      static_cast<long long>(settings.repeats), static_cast<long long>(settings.iterations),
      static_cast<long long>(settings.warmup_iterations),
      settings.timed_algorithms ? "timed (the fastest of the heuristic's candidates, train.gemm_algorithms)"
                                : "the heuristic's first");
  std::string header = "| shape | M | N | K |", rule = "|---|---|---|---|";
  for (GemmBenchKind kind : kGemmBenchKinds) {
    header += fmt::format(" {} |", gemm_bench_kind_heading(kind));
    rule += "---|";
  }
  std::printf("%s fp8/bf16 |\n%s---|\n", header.c_str(), rule.c_str());
  std::fflush(stdout);
  std::set<std::string> reasons;
  gpu.bench_gemms(shapes, settings, [&reasons](const GemmBenchRow& row) {
    std::printf("%s\n", row_text(row).c_str());
    std::fflush(stdout);
    for (const GemmBenchResult& r : row.results) {
      if (!r.skipped.empty())
        reasons.insert(fmt::format("{}: {}", gemm_bench_kind_heading(r.kind), r.skipped));
    }
  });
  if (!reasons.empty()) std::printf("\nnot measured (-):\n");
  for (const std::string& reason : reasons) std::printf("  %s\n", reason.c_str());
  std::printf("\n%s\n",
              bandwidth_text(gpu.bench_memory_bandwidth(bandwidth_settings), bandwidth_settings).c_str());
  return 0;
}

int BenchCommands::run_train() const {
  const RunConfig config = load_run_config(config_file_, overrides_);
  TrainingBenchOptions options;
  options.steps = steps_;
  options.warmup_steps = warmup_;
  options.phase_steps = phase_steps_;
  options.random_tokens = !config_data_;
  std::FILE* notes = json_ ? stderr : stdout;
  options.log = [notes](std::string_view line) {
    std::fprintf(notes, "%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(notes);
  };
  const TrainingBenchResult r = benchmark_training(config, options);
  const int64_t B = config.train.batch_size, T = config.train.seq_len;
  const double memory_gib = r.device_memory_bytes
                                ? static_cast<double>(*r.device_memory_bytes) / static_cast<double>(1 << 30)
                                : 0.0;

  if (json_) {
    json phases = nullptr;
    if (r.phases) {
      phases = {{"steps", r.phases->steps},
                {"data_ms", r.phases->data_ms},
                {"forward_ms", r.phases->forward_ms},
                {"backward_ms", r.phases->backward_ms},
                {"optimizer_ms", r.phases->optimizer_ms},
                {"total_ms", r.phases->total_ms()}};
      if (r.phases->has_op_times) {
        json kinds = json::array();
        for (size_t k = 0; k < kOpKinds; ++k) {
          kinds.push_back({{"kind", op_kind_name(static_cast<OpKind>(k))},
                           {"forward_ms", r.phases->forward_ops[k]},
                           {"backward_ms", r.phases->backward_ops[k]},
                           {"optimizer_ms", r.phases->optimizer_ops[k]}});
        }
        phases["device_ms_by_kind"] = kinds;
      }
    }
    const auto or_null = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    const PrecisionSettings& precision = config.precision;
    // What the backward recomputes instead of keeping (the fp8.recompute_* keys that are on).
    json recompute = json::array();
    if (precision.recompute_mlp) recompute.push_back("mlp");
    if (precision.recompute_qkv) recompute.push_back("qkv");
    if (precision.recompute_residual) recompute.push_back("residual");
    if (precision.recompute_weight_transposes) recompute.push_back("weight_transposes");
    const json fp8 = precision.mode != MixedPrecision::fp8
                         ? json(nullptr)
                         : json{{"recipe", recipe_name(precision.recipe)},
                                {"formats", precision.all_e4m3 ? "all_e4m3" : "hybrid"},
                                {"fast_accumulation_forward", precision.fast_accumulation_forward},
                                {"fast_accumulation_backward", precision.fast_accumulation_backward},
                                {"recompute", recompute}};
    const json out = {
        {"benchmark", "train"},
        {"octet_version", kVersion},
        {"config", config_file_},
        {"device", {{"backend", r.backend}, {"name", r.device_name}, {"line", r.device_line}}},
        {"model", r.model},
        {"layers", config.model.layers},
        {"channels", config.model.channels},
        {"heads", config.model.heads},
        {"vocab_size", config.model.vocab_size},
        {"padded_vocab", config.model.padded_vocab()},
        {"mode", r.mode},
        {"weight_gradients", precision.bf16_weight_gradients ? "bf16" : "float32"},
        {"gemm_algorithms", config.time_gemm_algorithms ? "timed" : "heuristic"},
        {"fp8", fp8},
        {"linear_gemms", linear_gemms_json(r.linears)},
        {"parameters", r.parameters},
        {"flop_parameters", r.flop_parameters},
        {"batch_size", B},
        {"seq_len", T},
        {"grad_accum_steps", config.train.grad_accum_steps},
        {"tokens_per_step", r.tokens_per_step},
        {"data", r.random_tokens ? "random" : "config"},
        {"warmup_steps", r.warmup_steps},
        {"steps", r.steps},
        {"skipped_steps", r.skipped_steps},
        {"seconds", r.seconds},
        {"ms_per_step", r.ms_per_step},
        {"tokens_per_second", r.tokens_per_second},
        {"flops_formula", "6*N + 12*L*C*T"},
        {"flops_per_token", r.flops_per_token},
        {"model_tflops", r.model_tflops},
        {"peaks",
         r.peaks ? json{{"gpu", r.peaks->gpu}, {"bf16_tflops", r.peaks->bf16}, {"fp8_tflops", r.peaks->fp8}}
                 : json(nullptr)},
        {"mfu_bf16", or_null(r.mfu_bf16)},
        {"mfu_fp8", or_null(r.mfu_fp8)},
        {"mfu_note", r.mfu_note},
        {"device_memory_bytes", r.device_memory_bytes ? json(*r.device_memory_bytes) : json(nullptr)},
        {"device_memory_gib", r.device_memory_bytes ? json(memory_gib) : json(nullptr)},
        {"memory_note", r.memory_note},
        {"phases", phases},
        {"fp8_gemms_per_step", r.fp8_gemms_per_step},
        {"other_gemms_per_step", r.other_gemms_per_step},
        {"last_loss", r.last_loss}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }

  std::printf("model: %s; %s on the %s backend (%s)\n", r.model.c_str(), r.mode.c_str(), r.backend.c_str(),
              r.device_name.c_str());
  std::printf("tokens per step: %lld (batch %lld x %lld tokens x %lld micro-batches), %s\n",
              static_cast<long long>(r.tokens_per_step), static_cast<long long>(B), static_cast<long long>(T),
              static_cast<long long>(config.train.grad_accum_steps),
              r.random_tokens ? "random tokens" : "data.dir tokens");
  std::printf("steps: %lld timed after %lld warm-up, %lld skipped as non-finite\n",
              static_cast<long long>(r.steps), static_cast<long long>(r.warmup_steps),
              static_cast<long long>(r.skipped_steps));
  std::printf("tokens/s: %.0f\n", r.tokens_per_second);
  std::printf("ms/step: %.3f\n", r.ms_per_step);
  std::printf("model FLOPs/token: %.4g (6N + 12LCT, N = %lld parameters without the position embedding)\n",
              r.flops_per_token, static_cast<long long>(r.flop_parameters));
  std::printf("model TFLOP/s: %.2f\n", r.model_tflops);
  if (r.mfu_bf16 && r.mfu_fp8 && r.peaks) {
    std::printf("MFU: %.1f%% of the BF16 peak, %.1f%% of the FP8 peak (%s dense: %.0f and %.0f TFLOP/s)\n",
                *r.mfu_bf16 * 100.0, *r.mfu_fp8 * 100.0, r.peaks->gpu.c_str(), r.peaks->bf16, r.peaks->fp8);
  } else {
    std::printf("MFU: not computed: %s\n", r.mfu_note.c_str());
  }
  if (r.device_memory_bytes) {
    std::printf("device memory: %.2f GiB (%s)\n", memory_gib, r.memory_note.c_str());
  } else {
    std::printf("device memory: not measured: %s\n", r.memory_note.c_str());
  }
  std::printf("GEMMs per step: %lld FP8, %lld other\n", static_cast<long long>(r.fp8_gemms_per_step),
              static_cast<long long>(r.other_gemms_per_step));
  std::printf("loss: %.4f (last timed step)\n", static_cast<double>(r.last_loss));
  if (r.phases) {
    const StepPhaseTimes& p = *r.phases;
    const double total = p.total_ms();
    std::printf(
        "phases (a separate pass of %lld steps with the backend synchronised at every boundary, "
        "ms/step):\n",
        static_cast<long long>(p.steps));
    const std::pair<const char*, double> rows[] = {{"data", p.data_ms},
                                                   {"forward", p.forward_ms},
                                                   {"backward", p.backward_ms},
                                                   {"optimizer", p.optimizer_ms}};
    for (const auto& [name, ms] : rows) {
      std::printf("  %-10s %10.3f  %5.1f%%\n", name, ms, total > 0.0 ? ms / total * 100.0 : 0.0);
    }
    std::printf("  %-10s %10.3f  (the timed steps, unsynchronised: %.3f)\n", "total", total, r.ms_per_step);
    if (p.has_op_times) {
      std::printf("device time by kind of op (same pass, CUDA events around each op, ms/step):\n");
      std::printf("  %-44s %9s %9s %9s %9s\n", "kind", "forward", "backward", "optimizer", "total");
      double sums[4] = {0.0, 0.0, 0.0, 0.0};
      for (size_t k = 0; k < kOpKinds; ++k) {
        const double f = p.forward_ops[k], b = p.backward_ops[k], o = p.optimizer_ops[k];
        std::printf("  %-44s %9.3f %9.3f %9.3f %9.3f\n",
                    std::string(op_kind_name(static_cast<OpKind>(k))).c_str(), f, b, o, f + b + o);
        sums[0] += f;
        sums[1] += b;
        sums[2] += o;
        sums[3] += f + b + o;
      }
      std::printf("  %-44s %9.3f %9.3f %9.3f %9.3f\n", "sum", sums[0], sums[1], sums[2], sums[3]);
    }
  }
  return 0;
}

}  // namespace octet::cli
