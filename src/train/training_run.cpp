// `octet train`'s run loop (see training_run.h).
#include "octet/train/training_run.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "octet/backend/registry.h"
#include "octet/check.h"
#include "octet/dist/socket_group.h"
#include "octet/dist/topology.h"
#include "octet/io/atomic_file.h"
#include "octet/io/data_loader.h"
#include "octet/io/tokenizer.h"
#include "octet/model/model.h"
#include "octet/model/sampling.h"
#include "octet/telemetry/recorder.h"
#include "octet/train/checkpoint.h"
#include "octet/train/data_parallel.h"
#include "octet/train/layer_gain.h"
#include "octet/train/precision_schedule.h"
#include "octet/train/run_directory.h"
#include "octet/train/telemetry_source.h"
#include "octet/version.h"
#include "kernel_profiling.h"
#include "localization_record.h"
#include "run_device.h"
#include "step_checks.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int signal) {
  g_stop_signal.store(signal);
}

std::string duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, s / 60 % 60)
                   : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// Milliseconds per phase of one step, summed over the phase's stretches (the optimizer phase opens the step,
// zeroing the gradients, and closes it). Inactive steps cost one branch per phase.
class PhaseTimer {
 public:
  void reset(bool active) {
    active_ = active;
    current_.reset();
    ms_.clear();
  }
  void begin(StepPhase phase, Backend& backend) {
    if (!active_) return;
    backend.synchronize();
    const auto now = std::chrono::steady_clock::now();
    if (current_) {
      const std::string name = phase_name(*current_);
      auto it = std::find_if(ms_.begin(), ms_.end(), [&](const auto& entry) { return entry.first == name; });
      const double ms = std::chrono::duration<double, std::milli>(now - began_).count();
      if (it == ms_.end()) {
        ms_.emplace_back(name, ms);
      } else {
        it->second += ms;
      }
    }
    current_ = phase == StepPhase::done ? std::nullopt : std::optional<StepPhase>(phase);
    began_ = now;
  }
  const std::vector<std::pair<std::string, double>>& totals() const { return ms_; }

 private:
  static std::string phase_name(StepPhase phase) {
    switch (phase) {
      case StepPhase::optimizer:
        return "optimizer";
      case StepPhase::data:
        return "data";
      case StepPhase::forward:
        return "forward";
      case StepPhase::backward:
        return "backward";
      case StepPhase::done:
        break;
    }
    return "done";
  }
  bool active_ = false;
  std::optional<StepPhase> current_;
  std::chrono::steady_clock::time_point began_;
  std::vector<std::pair<std::string, double>> ms_;
};

// A line of progress or report, flushed at once: under nohup, a scheduler or `> log` standard output is a
// file, and a line left in a buffer is a line the user does not see (and a kill -9 loses).
void say(std::FILE* out, const std::string& line) {
  if (out == nullptr) return;  // a rank other than rank 0
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

// RUN_DIR/metrics.jsonl, appended to one flushed line at a time. Once training is under way a failed write
// ends the run (training_failed), naming the file and the reason.
class MetricsFile {
 public:
  explicit MetricsFile(fs::path path) : path_(std::move(path)), file_(std::fopen(path_.c_str(), "a")) {
    OCTET_REQUIRE(file_ != nullptr, "cannot write {}: {}", path_.string(), std::strerror(errno));
  }
  ~MetricsFile() { std::fclose(file_); }
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  void write(const nlohmann::json& record) {
    const std::string line = record.dump() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
      const int error = errno;
      std::clearerr(file_);
      throw Error(ErrorKind::training_failed,
                  fmt::format("cannot write {}: {}", path_.string(), std::strerror(error)));
    }
  }

 private:
  fs::path path_;
  std::FILE* file_;
};

// SIGINT and SIGTERM ask the run to stop after its current step, for as long as this object lives.
class StopSignals {
 public:
  explicit StopSignals(bool handle) : handle_(handle) {
    if (!handle_) return;
    g_stop_signal.store(0);
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
  }
  ~StopSignals() {
    if (!handle_) return;
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool handle_;
};


// This process's place among the run's ranks.
struct RankContext {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string launcher;
  dist::DataParallelLayout layout;
  dist::SocketGroup* control = nullptr;  // the run's processes joined; null for a run of one
  bool lead() const { return rank == 0; }
};

// What every rank of a run must agree on: the octet binary (a digest of the executable's bytes) and the
// configuration with the options that choose where the run starts.
dist::Fingerprint run_fingerprint(const RunConfig& config, const TrainingRunOptions& options) {
  const auto digest = [](std::string_view bytes) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return fmt::format("{:016x}", h);
  };
  std::string binary;
  {
    std::ifstream exe("/proc/self/exe", std::ios::binary);
    binary.assign(std::istreambuf_iterator<char>(exe), std::istreambuf_iterator<char>());
  }
  const std::string start = fmt::format("resume={} resume_from={} init_from={} overwrite={}", options.resume,
                                        options.resume_from.string(), options.init_from.string(),
                                        options.overwrite);
  return {{{"octet binary", fmt::format("{} {}", kVersion, digest(binary))},
           {"configuration", digest(to_toml(config))},
           {"start options", start}}};
}

TrainingRunSummary train_as_rank(const RunConfig& config, const TrainingRunOptions& options,
                                 const RankContext& ranks);

}  // namespace

TrainingBackend make_training_backend(const RunConfig& config) {
  const DeviceChoice device = choose_device(config);
  return {make_backend(device, config), device.cuda, device.line};
}

namespace {

// The bytes this rank has sent for gradient sums so far (Communicator::traffic); 0 on one rank.
int64_t gradient_bytes_sent(const DataParallel& parallel) {
  if (parallel.communicator == nullptr) return 0;
  const dist::Communicator::Traffic& t = parallel.communicator->traffic();
  return t.all_reduce_bytes + t.reduce_scatter_bytes;
}

// What the gather of the updated parameters moves each step (the whole buffer's bytes; each rank receives all
// but its own part).
std::string gather_line(const GatherVolume& v) {
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const int64_t all_float32 = v.float32_bytes + v.fp8_bytes * 4;
  if (v.fp8_weights == 0) {
    return fmt::format("parameters gathered after each update in float32: {:.1f} MiB", mib(all_float32));
  }
  std::string line = fmt::format(
      "parameters gathered after each update: {} weights as FP8 codes ({:.1f} MiB) and the rest in float32 "
      "({:.1f} MiB), {:.1f} MiB in all where float32 would move {:.1f} MiB and BF16 weights {:.1f} MiB",
      v.fp8_weights, mib(v.fp8_bytes), mib(v.float32_bytes), mib(v.fp8_bytes + v.float32_bytes),
      mib(all_float32), mib(v.float32_bytes + v.fp8_bytes * 2));
  if (v.reshard) {
    line += fmt::format(
        "; fully sharded: their copies ({:.1f} MiB when all are held) given back after each block's forward "
        "and backward, the codes gathered again for each backward and each later micro-batch's forward",
        mib(v.copy_bytes));
  }
  return line;
}

// Bytes in KiB, MiB or GiB, whichever keeps the number above 1.
std::string size_text(double bytes) {
  if (bytes < 1024.0 * 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

// What FP8 weight gathers leave stale on this rank and the memory of it given back (Trainer::
// released_master_bytes); empty where nothing is stale.
std::string stale_masters_line(const Trainer& trainer, Model& model) {
  int64_t stale = 0;
  for (const Backend::Range& r : trainer.stale_master_ranges()) stale += r.count;
  if (stale == 0) return {};
  const std::string stale_part =
      fmt::format("{} of {} stale outside this rank's shard (weights gathered as FP8 codes)",
                  size_text(static_cast<double>(stale) * sizeof(float)),
                  size_text(static_cast<double>(model.parameter_count()) * sizeof(float)));
  if (!model.parameter_memory().releasable()) {
    return fmt::format("float32 masters: {}, kept: the {} backend cannot give memory back", stale_part,
                       model.backend().name());
  }
  return fmt::format("float32 masters: {}, {} of it given back (the whole pages in it)", stale_part,
                     size_text(static_cast<double>(trainer.released_master_bytes())));
}

}  // namespace

void check_ranks(const RunConfig& config, int world) {
  const dist::DataParallelLayout layout = dist::resolve_layout(config.distributed, world, 0);
  // A hybrid layout sums every gradient over every rank (data_parallel.h); a reduce-scatter over every rank
  // would leave each rank a shard of the world's sums, not its shard group's.
  OCTET_REQUIRE(
      layout.shard == 1 || layout.replicate == 1 || !config.distributed.reduce_scatter,
      "distributed.sharded_gradient_sums = \"reduce_scatter\" is not supported with a hybrid layout "
      "(distributed.dp_shard = {} with distributed.dp_replicate = {}): every rank receives every "
      "gradient's sum there; set distributed.sharded_gradient_sums = \"all_reduce\", or shard the "
      "optimizer state over every rank (distributed.dp_replicate = 1)",
      layout.shard, layout.replicate);
  OCTET_REQUIRE(world == 1 || !config.precision.auto_filter,
                "fp8.auto_filter is not supported on several ranks yet (each rank would time its GEMMs and "
                "could choose other layers); localize once with `octet localize` and train with "
                "fp8.precision_map");
  OCTET_REQUIRE(world == 1 || config.telemetry.on_alert != AlertAction::bf16_layer,
                "fp8.on_alert = \"bf16_layer\" is not supported on several ranks yet (every rank would have to "
                "move the same layer at the same step); use \"warn\" or \"stop\"");
  OCTET_REQUIRE(world == 1 || config.telemetry.on_alert != AlertAction::recalibrate,
                "fp8.on_alert = \"recalibrate\" is not supported on several ranks yet (every rank would have "
                "to install the same scales at the same step); use \"warn\" or \"stop\"");
  OCTET_REQUIRE(world == 1 || (config.telemetry.shadow_every == 0 && config.telemetry.recalibrate_every == 0),
                "fp8.shadow_every and fp8.recalibrate_every are not supported on several ranks yet (the BF16 "
                "shadow runs on rank 0's micro-batch alone); set them to 0, or train on one rank");
}

TrainingRunSummary run_training(const RunConfig& config, const TrainingRunOptions& options) {
  RankContext ranks;
  if (options.ranks) {
    ranks.rank = options.ranks->rank;
    ranks.world = options.ranks->world;
    ranks.local_rank = options.ranks->local_rank;
    ranks.launcher = options.ranks->launcher;
  }
  check_ranks(config, ranks.world);
  ranks.layout = dist::resolve_layout(config.distributed, ranks.world, ranks.rank);
  if (ranks.world == 1) return train_as_rank(config, options, ranks);
  // Several ranks join first, so that a rank started with another binary, configuration or start is refused,
  // on every rank, before any work; a rank that fails afterwards tells the others, which stop naming it.
  dist::SocketGroup control(*options.ranks, run_fingerprint(config, options), dist::rank_timeout());
  ranks.control = &control;
  try {
    return train_as_rank(config, options, ranks);
  } catch (const std::exception& e) {
    control.abort(e.what());
    throw;
  }
}

namespace {

TrainingRunSummary train_as_rank(const RunConfig& config, const TrainingRunOptions& options,
                                 const RankContext& ranks) {
  const bool lead = ranks.lead();
  // Everything that can be refused is refused before anything is written: device, data, the run directory,
  // the model's memory, the checkpoint a resumed run continues from. On several ranks, every rank checks
  // what it sees, and rank 0 writes nothing until all have passed. Every mode of a precision schedule must
  // run here (precision_schedule.h).
  const PrecisionSchedule schedule(config);
  for (const PrecisionSpan& span : schedule.spans())
    choose_device(config_in_mode(config, span.mode), ranks.local_rank);
  OCTET_REQUIRE(!config.data_dir.empty(),
                "data.dir is not set: point it at shards made by `octet data prepare`");
  const int64_t B = config.train.batch_size, T = config.train.seq_len;
  io::DataLoader train_loader(config.data_dir, io::DataSplit::train,
                              io::DataLoaderOptions{B, T, true, config.seed, config.model.vocab_size});
  io::DataLoader validation_loader(config.data_dir, io::DataSplit::validation,
                                   io::DataLoaderOptions{B, T, false, 0, config.model.vocab_size});
  const fs::path& run_dir = config.run_dir;
  check_run_directory(run_dir);
  RunDirectoryLock lock;
  if (lead) lock.lock_existing(run_dir);  // another run that lives is refused now, naming it
  const RunStart start = plan_run_start(run_dir, options.resume, options.resume_from, options.overwrite);
  // The model is built in the mode of the step the run starts at (a resumed run's checkpoint's).
  const RunConfig start_mode = schedule.config_at(start.checkpoint ? checkpoint_step(*start.checkpoint) : 0);
  const DeviceChoice device = choose_device(start_mode, ranks.local_rank);
  OCTET_REQUIRE(!config.profiling.enabled || device.backend->make_kernel_profiler() != nullptr,
                "profiling.enabled = true records the GPU's kernels through CUPTI, and this run trains on the "
                "{} backend, whose ops are no GPU kernels: train on the GPU (train.device = \"cuda\") or "
                "leave [profiling] off (docs/gpu.md, \"Profiling\")",
                device.backend->name());

  // On telemetry steps the step is split into phases (data, forward, backward, optimizer) for the phases
  // table: the backend is synchronised at each phase boundary of those steps only, so that a phase's time is
  // the device's and not just the time taken to enqueue it.
  PhaseTimer phases;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;
  // No run directory and no log for the trainer: its startup lines and precision map come below, once every
  // check has passed and telemetry has put back the layers a resumed run had moved to BF16.
  TrainSettings settings = config.train;
  const bool telemetry_here = config.telemetry.enabled && lead;  // rank 0 records for the run
  if (telemetry_here) {
    settings.phase_began = [&phases, &backend](StepPhase phase) { phases.begin(phase, *backend); };
  }
  // The host's parts of the profiled steps, beside their kernels (the profiling is made below).
  StepProfiling* profiled = nullptr;
  if (config.profiling.enabled && lead) {
    settings.host_part_began = [&profiled](std::string_view part) {
      if (profiled != nullptr) profiled->host_part(part);
    };
  }
  // The ranks exchange the backend's tensors over its own communicator (NCCL on GPUs), or over the joined
  // processes themselves (the CPU backend's tensors are host memory).
  std::unique_ptr<dist::Communicator> tensors =
      ranks.control != nullptr ? device.backend->join_ranks(*ranks.control, device.gpu) : nullptr;
  DataParallel parallel;
  parallel.communicator = tensors ? tensors.get() : ranks.control;
  parallel.shard_optimizer_state = ranks.layout.shard > 1;
  // A hybrid layout: the ranks of this rank's shard group (consecutive ranks, topology.h), split off
  // together by every rank.
  std::unique_ptr<dist::Communicator> shard_group;
  if (parallel.shard_optimizer_state && ranks.layout.replicate > 1) {
    shard_group = parallel.communicator->split(ranks.layout.replica(), ranks.layout.shard_rank());
    parallel.shard_communicator = shard_group.get();
  }
  // The trainer goes before the communicators it gathers over: a run that ends with an error may leave a
  // gather of the parameters under way, which the trainer waits for as it goes.
  struct TrainerFirst {
    std::unique_ptr<Trainer>& trainer;
    ~TrainerFirst() { trainer.reset(); }
  } trainer_first{trainer};
  parallel.reduce_type = config.distributed.gradient_reduce_type;
  parallel.reduce_scatter = config.distributed.reduce_scatter;
  parallel.fp8_weight_gather = config.distributed.fp8_weight_gather;
  parallel.reshard_after_forward = config.distributed.reshard_after_forward;
  parallel.sparse_embedding_sums = config.distributed.sparse_embedding_sums;
  parallel.bucket_elements = config.distributed.bucket_mb * (int64_t{1} << 20) / int64_t{sizeof(float)};
  // The backend, model and trainer in `mode`'s precision: at the start, and at each switch of a precision
  // schedule, which keeps the backend unless the mode asks for another (fp32's attention, emulated FP8).
  std::pair<bool, bool> backend_made_for;  // emulate_fp8, bf16_attention
  auto build = [&](const RunConfig& mode) {
    const DeviceChoice chosen = choose_device(mode, ranks.local_rank);
    const std::pair<bool, bool> wanted{chosen.emulate_fp8, mode.precision.mode != MixedPrecision::fp32};
    if (!backend || wanted != backend_made_for) {
      backend.reset();
      backend = make_backend(chosen, mode);
      backend_made_for = wanted;
    }
    PrecisionPolicy policy(mode.precision, mode.model, B * T);
    if (mode.precision.mode == MixedPrecision::fp8 && mode.precision.auto_filter) {
      const DeviceBench* bench = chosen.backend->device_bench();
      OCTET_REQUIRE(chosen.cuda && bench != nullptr,
                    "fp8.auto_filter = true needs the CUDA backend's GEMM timing, which this run's backend "
                    "does not have");
      auto_filter_layers(policy, *bench, B * T);
    }
    model = make_model(mode.model, *backend, std::move(policy), B, T);
    model->init_weights(config.seed);
    if (!telemetry_here) model->set_telemetry(false, false);
    TrainSettings mode_settings = settings;
    mode_settings.loss_scale.dynamic = mode.train.loss_scale.dynamic;
    trainer = std::make_unique<Trainer>(*model, mode_settings, parallel);
  };
  allocate_or_refuse(config, [&] { build(start_mode); });
  OCTET_REQUIRE(options.init_from.empty() || !start.checkpoint,
                "--init-from starts a new run from a checkpoint's weights; --resume and --resume-from continue "
                "one: give one of them");
  std::map<std::string, std::string> initialised_from;
  if (!options.init_from.empty()) {
    // Every page of the parameters mapped again: a sharded optimizer's trainer gave back the masters its
    // FP8 gathers leave stale, and the weights loaded now are whole.
    trainer->gather_master_weights();
    try {
      initialised_from = load_checkpoint_weights(options.init_from, *model);  // validates, then loads
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("--init-from {}: {}", options.init_from.string(), e.what()));
    }
  }
  std::optional<CheckpointLoad> load;
  if (start.checkpoint) {
    load = load_checkpoint(*start.checkpoint, *model,
                           *trainer);  // validates everything, changes nothing on disk
    if (load->progress.train_position) train_loader.seek(*load->progress.train_position);
  }

  // Every check has passed, on every rank: from here on rank 0 writes the run directory.
  if (ranks.control != nullptr) ranks.control->barrier();
  std::unique_ptr<MetricsFile> metrics;
  if (lead) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    OCTET_REQUIRE(!ec, "cannot create logging.run_dir {}: {}", run_dir.string(), ec.message());
    lock.acquire(run_dir);
    OCTET_REQUIRE(run_files_present(run_dir) == start.present,
                  "{} changed while this run was starting (another run wrote there); start again",
                  run_dir.string());
    if (start.remove_present) remove_run_files(run_dir);
    io::write_file_atomically(run_dir / "config.toml", to_toml(config));
    metrics = std::make_unique<MetricsFile>(run_dir / "metrics.jsonl");
  }

  // Rank 0 alone prints progress; every other rank says once where it trains, on standard error.
  std::FILE* out = lead ? options.out : nullptr;
  const bool interactive = lead && options.interactive;
  if (!lead) {
    std::fprintf(stderr, "rank %d of %d (%s): %s\n", ranks.rank, ranks.world, ranks.launcher.c_str(),
                 device.line.c_str());
    std::fflush(stderr);
  }
  // Said every time, so that nobody takes a CPU run for a GPU one or an emulated FP8 GEMM for a real one.
  say(out, device.line);
  if (ranks.world > 1) {
    say(out,
        fmt::format(
            "rank 0 of {} ({}): data parallel, each rank {} micro-batch(es) of the step's {}; gradients "
            "summed in {} over {}{}",
            ranks.world, ranks.launcher, config.train.grad_accum_steps,
            config.train.grad_accum_steps * ranks.world,
            config.distributed.gradient_reduce_type == dist::GradientReduceType::bf16 ? "bf16" : "float32",
            tensors ? "NCCL" : "the ranks' sockets",
            parallel.shard_optimizer_state
                ? fmt::format("; optimizer state sharded over {} (ZeRO-1), {}",
                              ranks.layout.replicate > 1
                                  ? fmt::format("each of {} groups of {} ranks (hybrid: dp_shard = {}, "
                                                "dp_replicate = {})",
                                                ranks.layout.replicate, ranks.layout.shard,
                                                ranks.layout.shard, ranks.layout.replicate)
                                  : fmt::format("{} ranks", ranks.world),
                              parallel.reduce_scatter
                                  ? "each receiving the sums of its shard's gradients (reduce-scatter)"
                                  : "each receiving every gradient's sum (all-reduce)")
                : std::string()));
  }
  if (parallel.shard_optimizer_state) say(out, gather_line(trainer->parameter_gather_volume()));
  say(out, fmt::format("octet {}: {}; {} on the {} backend; run directory {}", kVersion, model->describe(),
                       mixed_precision_name(start_mode.precision.mode), backend->name(), run_dir.string()));
  if (start.remove_present) {
    say(out, fmt::format("--overwrite: removed the previous run's {} from {}; other files there are kept",
                         fmt::join(start.present, ", "), run_dir.string()));
  }
  // Telemetry (docs/telemetry.md) opens only now: a store opened for a resumed run deletes the rows after the
  // step it resumes at. Layers that alerts of the run being resumed moved to BF16 move back to BF16 here,
  // before the startup lines and the precision map say how each layer runs.
  std::unique_ptr<TelemetryStore> telemetry_store;
  std::unique_ptr<ModelLayerSource> telemetry_layers;
  std::unique_ptr<TelemetryRecorder> telemetry;
  if (telemetry_here) {
    const std::optional<int64_t> resume_step =
        start.continues_run_directory ? std::optional<int64_t>(load->step) : std::nullopt;
    telemetry_store = std::make_unique<TelemetryStore>(run_dir / kTelemetryFile, resume_step);
    RecorderOptions recorder_options;
    recorder_options.run_directory = run_dir;
    recorder_options.log = [out, interactive](std::string_view line) {
      if (interactive) std::fputs("\n", out);
      say(out, std::string(line));
    };
    telemetry_layers = std::make_unique<ModelLayerSource>(*model);
    telemetry = std::make_unique<TelemetryRecorder>(*telemetry_layers, *telemetry_store, config.telemetry,
                                                    recorder_options);
  }
  for (const std::string& line : {schedule.describe(), model->policy().startup_line(), model->memory_line(),
                                  trainer->optimizer().groups_line()}) {
    if (!line.empty()) say(out, line);
  }
  if (lead) io::write_file_atomically(run_dir / "precision_map.json", precision_map_json(*model));
  if (!options.init_from.empty()) {
    const auto source = initialised_from.find("source");
    say(out, fmt::format("initialised from the weights of {}{} (step 0, fresh optimizer)", options.init_from.string(),
                         source == initialised_from.end() ? "" : ", imported from " + source->second));
  }
  if (load) {
    const std::string from = start.checkpoint->string();
    const std::string line =
        start.continues_run_directory
            ? fmt::format("resumed from {} at step {} (saved by octet {} in {})", from, load->step,
                          load->octet_version, mixed_precision_name(load->saved_mode))
            : fmt::format("branched from {} at step {} (saved by octet {} in {}) into {}", from, load->step,
                          load->octet_version, mixed_precision_name(load->saved_mode), run_dir.string());
    say(out, line);
    // Layers whose FP8 state the checkpoint lacks because an alert had moved them to BF16 are BF16 again.
    bool fresh_layers_in_fp8 = false;
    for (const LinearPlan& plan : model->policy().layers()) {
      for (const std::string& fresh : load->fresh_fp8_layers)
        fresh_layers_in_fp8 |= plan.name == fresh && plan.fp8();
    }
    for (const std::string& note : load->notes) {
      if (!fresh_layers_in_fp8 && note.rfind("FP8 scaling state starts fresh", 0) == 0) continue;
      say(out, note);
    }
    if (telemetry) {
      telemetry->record_event(
          {load->step, "info", std::nullopt, std::nullopt, std::nullopt, std::nullopt, line});
    }
  }
  if (telemetry) {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char started[32];
    std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &utc);
    const ScalingRecipe* recipe = model->policy().recipe();
    telemetry->start({{"name", (fs::absolute(run_dir) / "").parent_path().filename().string()},
                      {"octet_version", kVersion},
                      {"started_at", started},
                      {"mode", std::string(mixed_precision_name(start_mode.precision.mode))},
                      {"device", std::string(backend->name())},
                      {"recipe", recipe != nullptr ? recipe->describe() : "none"},
                      {"telemetry_interval", std::to_string(config.telemetry.interval)},
                      {"config", to_toml(config)}});
    // What the FP8 layers start from, for `octet report`: the calibration file and the precision map with
    // what localization measured (the map's file is read again here; the policy has checked it fits).
    bool fp8_somewhere = start_mode.precision.mode == MixedPrecision::fp8;
    for (const PrecisionPhase& phase : config.precision_phases)
      fp8_somewhere |= phase.mode == MixedPrecision::fp8;
    if (fp8_somewhere && !config.precision.calibration.empty()) {
      telemetry_store->add(RunInfoRecord{"calibration", config.precision.calibration.string()});
    }
    if (fp8_somewhere && !config.precision.precision_map.empty()) {
      const PrecisionMapFile map = read_precision_map_file(config.precision.precision_map);
      telemetry_store->add(RunInfoRecord{"precision_map_file", config.precision.precision_map.string()});
      telemetry_store->add(RunInfoRecord{"localization", localization_summary(map)});
      for (LocalizationRecord& row : localization_records(map)) telemetry_store->add(std::move(row));
    }
  }

  // Training is under way: a failure to write from here on ends the run with training_failed.
  auto save = [&]() {
    TrainingProgress progress;
    progress.train_position = train_loader.position();
    progress.seed = config.seed;
    progress.config = to_toml(config);
    progress.tokenizer_dir = training_tokenizer_files(config.tokenizer, config.data_dir);
    CheckpointOptions checkpoint_options;
    checkpoint_options.keep_last = static_cast<int>(config.keep_last);
    fs::path saved;
    try {
      saved = save_checkpoint(run_dir, *model, *trainer, progress, checkpoint_options);
    } catch (const std::exception& e) {
      // What a failed save wrote is of no use: give its space back (the next save would remove it too).
      std::error_code ec;
      const fs::path partial = checkpoint_directory(run_dir, trainer->steps_done());
      fs::remove_all(partial.parent_path() / (".tmp_" + partial.filename().string()), ec);
      const std::optional<fs::path> kept = latest_checkpoint(run_dir);
      const std::string reason = dynamic_cast<const fs::filesystem_error*>(&e) != nullptr
                                     ? static_cast<const fs::filesystem_error&>(e).code().message() + " (" +
                                           static_cast<const fs::filesystem_error&>(e).path1().string() + ")"
                                     : std::string(e.what());
      throw Error(ErrorKind::training_failed,
                  fmt::format("cannot save the checkpoint of step {}: {}; {}", trainer->steps_done(), reason,
                              kept ? fmt::format("the last complete checkpoint, {}, is kept", kept->string())
                                   : std::string("no complete checkpoint was saved")));
    }
    if (interactive) std::fputs("\n", out);
    say(out, fmt::format("saved checkpoint {}", saved.string()));
  };

  // Every rank reads the whole stream and keeps its own micro-batches of each step (data_parallel.h), so the
  // loader's position is the same on every rank.
  const BatchSource train_data = rank_batches(
      [&](int32_t* tokens, int32_t* targets) {
        train_loader.next_batch({tokens, static_cast<size_t>(B * T)}, {targets, static_cast<size_t>(B * T)});
      },
      ranks.rank, ranks.world, config.train.grad_accum_steps, B, T);
  const BatchSource validation_data = [&](int32_t* tokens, int32_t* targets) {
    validation_loader.next_batch({tokens, static_cast<size_t>(B * T)}, {targets, static_cast<size_t>(B * T)});
  };
  // Rank 0 validates for the run (every rank holds the same weights). Fully sharded weights are gathered by
  // every forward, so there every rank runs the validation's forwards with it, and rank 0 reports.
  auto validate = [&](int64_t step) {
    if (!lead && !trainer->forwards_gather()) return 0.0f;
    validation_loader.reset();
    const float loss = trainer->evaluate(validation_data, config.eval_batches);
    if (!lead) return loss;
    if (interactive) std::fputs("\n", out);
    say(out, fmt::format("step {}: validation loss {:.4f} (perplexity {:.2f})", step, loss, std::exp(loss)));
    metrics->write(nlohmann::json{{"step", step}, {"val_loss", loss}});
    if (telemetry) telemetry->record_validation(step, loss);
    return loss;
  };

  // fp8.shadow_every, fp8.recalibrate_every, fp8.on_alert = "recalibrate" (step_checks.h).
  StepChecks checks(config);
  const StopSignals signals(options.handle_signals);
  TrainingRunSummary summary;
  StepProfiling::Hooks profiling_hooks;
  profiling_hooks.say = [&](const std::string& line) {
    if (interactive) std::fputs("\n", out);
    say(out, line);
  };
  profiling_hooks.fallback = [&](int64_t step, const std::string& message) {
    summary.profiling_fell_back = true;
    if (metrics) {
      metrics->write(nlohmann::json{{"step", step}, {"event", "profiling_off"}, {"message", message}});
    }
    if (telemetry) {
      telemetry->record_event(
          {step, "profiling_off", std::nullopt, std::nullopt, std::nullopt, std::nullopt, message});
    }
  };
  const std::string profiled_device =
      config.profiling.enabled ? device.backend->describe_device(device.gpu) : std::string();
  StepProfiling profiling(config, *device.backend, profiled_device, lead, std::move(profiling_hooks));
  profiled = &profiling;
  try {
    const auto began = std::chrono::steady_clock::now();
    const int64_t first_step = trainer->steps_done();
    for (int64_t step = trainer->steps_done(); step < config.steps; ++step) {
      // A precision schedule's switch: said, recorded, and the precision map rewritten
      // (precision_schedule.h).
      if (const std::optional<PrecisionSwitch> change =
              schedule.switch_before(step, model->policy().mode())) {
        checks.model_replaced();
        switch_precision({backend, model, trainer}, [&] { build(schedule.config_at(step)); });
        if (interactive) std::fputs("\n", out);
        for (const std::string& line : {change->line(), model->policy().startup_line()}) {
          if (!line.empty()) say(out, line);
        }
        if (lead) io::write_file_atomically(run_dir / "precision_map.json", precision_map_json(*model));
        if (metrics) {
          metrics->write(nlohmann::json{{"step", step},
                                        {"event", "precision_switch"},
                                        {"from", mixed_precision_name(change->from)},
                                        {"to", mixed_precision_name(change->to)}});
        }
        if (telemetry) {
          telemetry_layers->rebind(*model);
          telemetry->precision_changed(step, mixed_precision_name(change->from),
                                       mixed_precision_name(change->to));
        }
      }
      profiling.before_step(step + 1, *backend);
      const auto t0 = std::chrono::steady_clock::now();
      phases.reset(telemetry != nullptr && telemetry->is_telemetry_step(step + 1, config.steps));
      checks.before_step(*trainer, *model, step + 1);
      const int64_t sent_before = gradient_bytes_sent(parallel);
      const StepResult r = trainer->step(train_data);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (step == first_step) {
        const std::string line = stale_masters_line(*trainer, *model);
        if (!line.empty()) say(out, line);
      }
      profiling.after_step(step + 1, *backend);
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
      const double tokens_per_second = static_cast<double>(r.tokens) / seconds;
      // A mixture-of-experts model's router balance over the step's last micro-batch (1: balanced).
      const std::optional<double> balance = model->router_balance();
      nlohmann::json row{{"step", step + 1},
                         {"mode", mixed_precision_name(model->policy().mode())},
                         {"loss", r.loss},
                         {"lr", r.learning_rate},
                         {"grad_norm", r.skipped ? 0.0f : r.grad_norm},
                         {"loss_scale", r.loss_scale},
                         {"skipped", r.skipped},
                         {"skip_reason", r.skip_reason},
                         {"fp8_gemms", r.fp8_gemms},
                         {"other_gemms", r.other_gemms},
                         {"tokens", r.tokens},
                         {"tokens_per_second", tokens_per_second},
                         {"ms", seconds * 1000.0}};
      if (balance) row["router_balance"] = *balance;
      // What rank 0 sent for the step's gradient sums, as a ring would send it (Communicator::traffic).
      if (ranks.world > 1) row["gradient_bytes_sent"] = gradient_bytes_sent(parallel) - sent_before;
      if (metrics) metrics->write(row);
      const int64_t done = step + 1;
      const double eta =
          elapsed / static_cast<double>(done - first_step) * static_cast<double>(config.steps - done);
      const std::string line = fmt::format(
          "step {}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f}{} | {:.0f} tok/s | ETA {}{}", done,
          config.steps, r.loss, r.learning_rate, r.grad_norm,
          balance ? fmt::format(" | router balance {:.3f}", *balance) : std::string(), tokens_per_second,
          duration(eta),
          r.skipped ? fmt::format(" | skipped: {}", r.skip_reason) : std::string());
      if (interactive) {
        std::fprintf(out, "\r\033[K%s", line.c_str());
        std::fflush(out);
      } else if (done % config.log_every == 0 || done == config.steps || r.skipped) {
        say(out, line);
      }
      if (telemetry) {
        telemetry->record_step(r, seconds * 1000.0, tokens_per_second,
                               telemetry->is_telemetry_step(done, config.steps));
        for (const auto& [phase, ms] : phases.totals()) telemetry_store->add(PhaseRecord{done, phase, ms});
        for (const std::string& checked : checks.after_step(*trainer, *model, done, r.skipped, *telemetry)) {
          if (interactive) std::fputs("\n", out);
          say(out, checked);
        }
      }
      // Whether the run stops after this step, as rank 0 decides for every rank: a signal, or an FP8 alert
      // with fp8.on_alert = "stop".
      int32_t stop[2] = {g_stop_signal.load(), telemetry && telemetry->stop_requested() ? 1 : 0};
      if (ranks.control != nullptr) ranks.control->broadcast(std::as_writable_bytes(std::span<int32_t>(stop)), 0);
      if (stop[1] != 0) {
        save();
        if (telemetry_store) telemetry_store->close();
        throw Error(ErrorKind::training_failed,
                    telemetry ? telemetry->stop_message() : std::string("rank 0 stopped the run (an FP8 alert)"));
      }
      summary.last_loss = r.loss;
      if (config.eval_every > 0 && done % config.eval_every == 0 && done != config.steps) validate(done);
      if (stop[0] != 0) {
        summary.interrupted = true;
        summary.stop_signal = stop[0];
        if (interactive) std::fputs("\n", out);
        say(out, fmt::format("stopped by signal {} after step {}", summary.stop_signal, done));
        profiling.finish(*backend);
        save();
        break;
      }
      if (config.checkpoint_every > 0 && done % config.checkpoint_every == 0 && done != config.steps) save();
    }
    summary.steps_done = trainer->steps_done();
    summary.kernel_trace_dir = profiling.written();
    if (!summary.interrupted) {
      summary.last_validation_loss = validate(summary.steps_done);
      save();
    }
    if (telemetry) {
      telemetry_store->close();  // everything queued is written
      if (telemetry->alerts_raised() > 0) {
        say(out, fmt::format("{} FP8 alert(s) in this run: see `octet inspect {}`",
                             telemetry->alerts_raised(), run_dir.string()));
      }
    }
  } catch (const Error& e) {
    // A write that fails once training is under way (a full disk, a file taken away) is no invalid input.
    if (e.kind() != ErrorKind::invalid_input) throw;
    if (interactive) std::fputs("\n", out);
    throw Error(ErrorKind::training_failed, e.what());
  } catch (const fs::filesystem_error& e) {
    if (interactive) std::fputs("\n", out);
    throw Error(ErrorKind::training_failed, fmt::format("{}: {}", e.path1().string(), e.code().message()));
  }
  return summary;
}

}  // namespace
}  // namespace octet
