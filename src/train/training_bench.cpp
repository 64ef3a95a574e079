// `octet bench train`'s measurements (see training_bench.h).
#include "octet/train/training_bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "octet/backend/registry.h"
#include "octet/check.h"
#include "octet/io/data_loader.h"
#include "octet/model/model.h"
#include "octet/train/layer_gain.h"
#include "octet/train/trainer.h"
#include "octet/train/training_run.h"

namespace octet {
namespace {

using Clock = std::chrono::steady_clock;

// Dense (no sparsity) BF16 and FP8 tensor-core peaks from NVIDIA's datasheets. Order matters: the first entry
// whose every word appears in the device name wins, so the specific forms come before the plain one.
struct PeakEntry {
  std::array<std::string_view, 2> words;  // an empty word matches anything
  DatasheetPeaks peaks;
};
const PeakEntry kPeaks[] = {
    {{"H100", "PCIe"}, {"H100 PCIe", 756.0, 1513.0}}, {{"H100", "NVL"}, {"H100 NVL", 835.0, 1671.0}},
    {{"H100", ""}, {"H100 SXM", 989.0, 1979.0}},      {{"H200", "NVL"}, {"H200 NVL", 835.0, 1671.0}},
    {{"H200", ""}, {"H200 SXM", 989.0, 1979.0}},
};

// Times the phases of a step: at every boundary it waits for the backend, then charges the time since the
// last boundary to the phase that was running. Does nothing unless active.
class PhaseClock {
 public:
  explicit PhaseClock(Backend& backend) : backend_(backend) {}
  void start() {
    active_ = true;
    current_ = StepPhase::done;
  }
  void stop() { active_ = false; }
  void boundary(StepPhase next) {
    if (!active_) return;
    backend_.synchronize();
    const Clock::time_point now = Clock::now();
    const OpTimes ops = backend_.take_op_times();
    if (current_ != StepPhase::done) {
      const size_t phase = static_cast<size_t>(current_);
      seconds_[phase] += std::chrono::duration<double>(now - since_).count();
      for (size_t k = 0; k < kOpKinds; ++k) op_ms_[phase][k] += ops[k];
    }
    current_ = next;
    since_ = now;
  }
  double milliseconds(StepPhase phase) const { return seconds_[static_cast<size_t>(phase)] * 1000.0; }
  OpTimes op_milliseconds(StepPhase phase) const { return op_ms_[static_cast<size_t>(phase)]; }

 private:
  Backend& backend_;
  bool active_ = false;
  StepPhase current_ = StepPhase::done;
  Clock::time_point since_;
  std::array<double, 5> seconds_{};
  std::array<OpTimes, 5> op_ms_{};
};

// Random tokens and targets: a few batches made once from the seed and served in turn, so that the data phase
// costs a copy, as a real loader's does.
class RandomBatches {
 public:
  RandomBatches(int64_t tokens_per_batch, int64_t vocab_size, uint64_t seed)
      : tokens_per_batch_(static_cast<size_t>(tokens_per_batch)) {
    std::mt19937_64 random(seed);
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab_size - 1));
    values_.resize(2 * kBatches * tokens_per_batch_);
    for (int32_t& v : values_) v = token(random);
  }
  void next(int32_t* tokens, int32_t* targets) {
    const int32_t* batch = values_.data() + 2 * next_ * tokens_per_batch_;
    std::copy_n(batch, tokens_per_batch_, tokens);
    std::copy_n(batch + tokens_per_batch_, tokens_per_batch_, targets);
    next_ = (next_ + 1) % kBatches;
  }

 private:
  static constexpr size_t kBatches = 4;
  size_t tokens_per_batch_;
  size_t next_ = 0;
  std::vector<int32_t> values_;
};

}  // namespace

std::optional<DatasheetPeaks> datasheet_peaks(std::string_view device_name) {
  for (const PeakEntry& entry : kPeaks) {
    const bool all = std::all_of(entry.words.begin(), entry.words.end(), [&](std::string_view word) {
      return device_name.find(word) != std::string_view::npos;
    });
    if (all) return entry.peaks;
  }
  return std::nullopt;
}

TrainingBenchResult benchmark_training(const RunConfig& config, const TrainingBenchOptions& options) {
  OCTET_REQUIRE(options.steps >= 1, "--steps must be at least 1, got {}", options.steps);
  OCTET_REQUIRE(options.warmup_steps >= 0, "--warmup must be at least 0, got {}", options.warmup_steps);
  OCTET_REQUIRE(options.phase_steps >= 0, "--phase-steps must be at least 0, got {}", options.phase_steps);
  const int64_t B = config.train.batch_size, T = config.train.seq_len;
  const int64_t tokens_per_batch = B * T;

  // Data first: a missing data.dir is refused before any device memory is taken.
  std::optional<io::DataLoader> loader;
  if (!options.random_tokens) {
    OCTET_REQUIRE(!config.data_dir.empty(),
                  "--data: data.dir is not set; point it at shards made by `octet data prepare`, or use "
                  "random tokens");
    loader.emplace(config.data_dir, io::DataSplit::train,
                   io::DataLoaderOptions{B, T, true, config.seed, config.model.vocab_size});
  }
  RandomBatches random_batches(options.random_tokens ? tokens_per_batch : 0, config.model.vocab_size,
                               config.seed);

  // The GPU's memory in use before anything of the run exists (this also creates the CUDA context, which
  // is then not counted). A "cuda" or "auto" device with a GPU visible is exactly when the run trains there.
  const BackendFactory* cuda = find_backend("cuda");
  const bool on_gpu = config.device != "cpu" && cuda != nullptr && cuda->device_count() > 0;
  const auto gpu_memory_in_use = [cuda]() {
    const DeviceBench* bench = cuda != nullptr ? cuda->device_bench() : nullptr;
    OCTET_CHECK(bench != nullptr, "the CUDA backend measures its device memory");
    return bench->memory_in_use(0).used_bytes;
  };
  const size_t memory_before = on_gpu ? gpu_memory_in_use() : 0;

  TrainingBackend device = make_training_backend(config);
  if (options.log) options.log(device.device_line);
  Backend& backend = *device.backend;
  PrecisionPolicy policy(config.precision, config.model, tokens_per_batch);
  if (config.precision.mode == MixedPrecision::fp8 && config.precision.auto_filter && device.cuda) {
    const int64_t moved = auto_filter_layers(policy, *cuda->device_bench(), tokens_per_batch);
    if (options.log) {
      options.log(fmt::format("fp8.auto_filter: {} layer(s) that timed slower in FP8 kept in BF16", moved));
    }
  }
  const std::unique_ptr<Model> built = make_model(config.model, backend, std::move(policy), B, T);
  Model& model = *built;
  model.init_weights(config.seed);
  model.set_telemetry(false, false);
  PhaseClock phase_clock(backend);
  TrainSettings settings = config.train;
  settings.log = options.log;
  settings.phase_began = [&phase_clock](StepPhase phase) { phase_clock.boundary(phase); };
  Trainer trainer(model, settings);

  const BatchSource data = [&](int32_t* tokens, int32_t* targets) {
    if (loader) {
      loader->next_batch({tokens, static_cast<size_t>(tokens_per_batch)},
                         {targets, static_cast<size_t>(tokens_per_batch)});
    } else {
      random_batches.next(tokens, targets);
    }
  };
  size_t memory_peak = memory_before;
  const auto sample_memory = [&]() {
    if (device.cuda) memory_peak = std::max(memory_peak, gpu_memory_in_use());
  };

  TrainingBenchResult result;
  for (int64_t i = 0; i < options.warmup_steps; ++i) {
    trainer.step(data);
    sample_memory();
  }
  backend.synchronize();
  const Clock::time_point start = Clock::now();
  StepResult last;
  for (int64_t i = 0; i < options.steps; ++i) {
    last = trainer.step(data);
    if (last.skipped) ++result.skipped_steps;
  }
  backend.synchronize();
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  sample_memory();

  if (options.phase_steps > 0) {
    backend.set_op_timing(true);
    backend.take_op_times();
    phase_clock.start();
    for (int64_t i = 0; i < options.phase_steps; ++i) trainer.step(data);
    phase_clock.stop();
    backend.set_op_timing(false);
    sample_memory();
    StepPhaseTimes phases;
    phases.steps = options.phase_steps;
    const double n = static_cast<double>(options.phase_steps);
    phases.data_ms = phase_clock.milliseconds(StepPhase::data) / n;
    phases.forward_ms = phase_clock.milliseconds(StepPhase::forward) / n;
    phases.backward_ms = phase_clock.milliseconds(StepPhase::backward) / n;
    phases.optimizer_ms = phase_clock.milliseconds(StepPhase::optimizer) / n;
    const auto per_step = [n](OpTimes t) {
      for (double& ms : t) ms /= n;
      return t;
    };
    phases.forward_ops = per_step(phase_clock.op_milliseconds(StepPhase::forward));
    phases.backward_ops = per_step(phase_clock.op_milliseconds(StepPhase::backward));
    phases.optimizer_ops = per_step(phase_clock.op_milliseconds(StepPhase::optimizer));
    for (const OpTimes* t : {&phases.forward_ops, &phases.backward_ops, &phases.optimizer_ops}) {
      for (const double ms : *t) phases.has_op_times |= ms > 0.0;
    }
    result.phases = phases;
  }

  result.device_line = device.device_line;
  result.backend = std::string(backend.name());
  result.device_name = device.cuda ? cuda->device(0).name : "CPU";
  result.model = model.describe();
  result.mode = std::string(mixed_precision_name(config.precision.mode));
  result.parameters = model.parameter_count();
  result.flop_parameters = model.flop_parameter_count();
  result.tokens_per_step = tokens_per_batch * config.train.grad_accum_steps;
  result.steps = options.steps;
  result.warmup_steps = options.warmup_steps;
  result.fp8_gemms_per_step = last.fp8_gemms;
  result.other_gemms_per_step = last.other_gemms;
  result.last_loss = last.loss;
  result.linears = model.policy().layers();
  result.random_tokens = options.random_tokens;
  result.ms_per_step = result.seconds * 1000.0 / static_cast<double>(options.steps);
  result.tokens_per_second =
      static_cast<double>(result.tokens_per_step * options.steps) / std::max(result.seconds, 1e-12);
  const double L = static_cast<double>(config.model.layers), C = static_cast<double>(config.model.channels);
  result.flops_per_token =
      6.0 * static_cast<double>(result.flop_parameters) + 12.0 * L * C * static_cast<double>(T);
  result.model_tflops = result.flops_per_token * result.tokens_per_second / 1e12;
  if (!device.cuda) {
    result.mfu_note = "the CPU backend has no datasheet peak";
    result.memory_note = "measured on the GPU only";
  } else {
    result.peaks = datasheet_peaks(result.device_name);
    if (result.peaks) {
      result.mfu_bf16 = result.model_tflops / result.peaks->bf16;
      result.mfu_fp8 = result.model_tflops / result.peaks->fp8;
    } else {
      result.mfu_note = "no datasheet peak known for " + result.device_name;
    }
    result.device_memory_bytes = memory_peak - std::min(memory_peak, memory_before);
    result.memory_note =
        "largest device memory in use (cudaMemGetInfo, whole device) after warm-up steps and timed steps, "
        "less what was in use before the backend was made";
  }
  return result;
}

}  // namespace octet
