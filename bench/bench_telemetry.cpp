// What FP8 telemetry costs a training step on the CPU backend, measured in one process with the three
// settings interleaved step by step (off, on at the default interval, on with SQNR), so that a machine's
// slow drifts fall on all three alike. The model has the quickstart's shape (configs/quickstart.toml) and
// trains on random tokens. Prints a Markdown table of median step times. Usage: bench_telemetry [ROUNDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "octet/backend/cpu_backend.h"
#include "octet/model/model.h"
#include "octet/telemetry/recorder.h"
#include "octet/train/telemetry_source.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace octet;
  const int rounds = argc > 1 ? std::stoi(argv[1]) : 20;
  ModelConfig config;
  config.vocab_size = 50257;
  config.max_seq_len = 64;
  config.layers = 4;
  config.heads = 4;
  config.channels = 128;
  const int64_t B = 8, T = 64;
  PrecisionSettings precision;
  precision.mode = MixedPrecision::fp8;
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> built =
      make_model(config, *backend, PrecisionPolicy(precision, config, B * T), B, T);
  Model& model = *built;
  model.init_weights(1337);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "octet-bench-telemetry";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TelemetryStore store(dir / kTelemetryFile);
  TelemetrySettings settings;  // the defaults: interval 10, no SQNR
  ModelLayerSource layers(model);
  TelemetryRecorder recorder(layers, store, settings);
  TrainSettings train;
  train.batch_size = B;
  train.seq_len = T;
  train.schedule.max_learning_rate = 3e-4f;
  train.schedule.total_steps = 1 << 20;
  Trainer trainer(model, train);
  std::mt19937_64 rng(1);
  const BatchSource data = [&](int32_t* tokens, int32_t* targets) {
    for (int64_t i = 0; i < B * T; ++i) {
      tokens[i] = static_cast<int32_t>(rng() % 50257);
      targets[i] = static_cast<int32_t>(rng() % 50257);
    }
  };
  for (int i = 0; i < 3; ++i) trainer.step(data);  // warm-up

  enum Mode { off, on, sqnr };
  const char* names[] = {"off (`telemetry.enabled = false`)", "on, interval 10 (the default)",
                         "on, interval 10, `telemetry.sqnr = true`"};
  std::vector<double> ms[3];
  int64_t recorded_steps = 0;
  for (int round = 0; round < rounds; ++round) {
    const Mode order[] = {off, on, sqnr};
    for (int k = 0; k < 3; ++k) {
      const Mode m = order[(k + round) % 3];  // the order rotates from round to round
      model.set_telemetry(m != off, m == sqnr);
      const auto t0 = std::chrono::steady_clock::now();
      const StepResult r = trainer.step(data);
      if (m != off) {
        ++recorded_steps;
        // As in a run: every step's row, and the FP8 tensors every interval-th step.
        recorder.record_step(r, 0.0, 0.0, recorded_steps % settings.interval == 0);
      }
      ms[m].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  store.close();
  std::filesystem::remove_all(dir);
  const double base = median(ms[off]);
  std::printf("| telemetry | median step time (ms) | vs off |\n|---|---|---|\n");
  for (int m = 0; m < 3; ++m) {
    const double t = median(ms[m]);
    std::printf("| %s | %.1f | %+.1f%% |\n", names[m], t, 100.0 * (t / base - 1.0));
  }
  std::printf(
      "\n%d steps of each, interleaved; model of configs/quickstart.toml (B=8, T=64), random tokens.\n",
      rounds);
  return 0;
}
