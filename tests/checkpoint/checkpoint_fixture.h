// Shared pieces of the checkpoint tests: a temporary directory, a token shard with a learnable pattern, and
// a training run (backend, model, trainer, data loader) that can be built afresh as a relaunch would.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model_fixture.h"
#include "octet/io/data_loader.h"
#include "octet/io/token_shard.h"
#include "octet/train/checkpoint.h"

namespace octet::testing {

class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("octet-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A shard of `count` tokens in runs of the learnable successor x -> (7x + 3) mod V, restarted at random.
inline std::filesystem::path write_pattern_shard(const std::filesystem::path& dir, int64_t V,
                                                 int64_t count = 4096) {
  std::mt19937_64 rng(17);
  std::vector<int32_t> tokens;
  int32_t x = 0;
  for (int64_t i = 0; i < count; ++i) {
    x = i % 37 == 0 ? static_cast<int32_t>(rng() % static_cast<uint64_t>(V))
                    : static_cast<int32_t>((x * 7 + 3) % V);
    tokens.push_back(x);
  }
  const std::filesystem::path path = dir / "train_000000.bin";
  io::write_token_shard(path, tokens, io::TokenWidth::uint16);
  return path;
}

inline TrainSettings checkpoint_settings() {
  TrainSettings s;
  s.batch_size = 2;
  s.seq_len = 16;
  s.schedule.max_learning_rate = 3e-3f;
  s.schedule.warmup_steps = 3;
  s.schedule.total_steps = 20;
  return s;
}

// Everything a training process holds; a new TrainingProcess is a relaunch.
struct TrainingProcess {
  TrainingProcess(const ModelConfig& config, MixedPrecision precision, const std::filesystem::path& shard,
                  const TrainSettings& settings = checkpoint_settings())
      : backend(make_cpu_backend()),
        model(make_model(config, *backend, PrecisionPolicy(mode(precision), config, 32), 2, 16)),
        trainer(nullptr),
        loader({shard}, loader_options(config)) {
    model->init_weights(11);
    trainer = std::make_unique<Trainer>(*model, settings);
  }
  static io::DataLoaderOptions loader_options(const ModelConfig& config) {
    io::DataLoaderOptions o;
    o.batch_size = 2;
    o.sequence_length = 16;
    o.seed = 5;
    o.vocab_size = config.vocab_size;
    return o;
  }
  BatchSource data() {
    return [this](int32_t* tokens, int32_t* targets) {
      loader.next_batch(std::span<int32_t>(tokens, 32), std::span<int32_t>(targets, 32));
    };
  }
  std::vector<float> train(int steps) {
    std::vector<float> losses;
    const BatchSource source = data();
    for (int i = 0; i < steps; ++i) {
      const StepResult r = trainer->step(source);
      EXPECT_FALSE(r.skipped) << r.skip_reason;
      losses.push_back(r.loss);
    }
    return losses;
  }
  TrainingProgress progress() const {
    TrainingProgress p;
    p.train_position = loader.position();
    p.seed = 11;
    p.config = R"({"model": "tiny", "train": {"steps": 20}})";
    return p;
  }
  std::vector<float> params() const {
    return std::vector<float>(model->params(), model->params() + model->parameter_count());
  }

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Trainer> trainer;
  io::DataLoader loader;
};

}  // namespace octet::testing
