// What a training run's configuration says about its optimizer steps: batch shape, gradient accumulation, the
// learning-rate schedule, AdamW, loss scaling and clipping ([train], [optimizer], [scheduler], [loss_scale]).
// Plain settings, so that the run configuration (run_config.h) holds them without depending on the trainer
// that reads them (train/trainer.h): config sits below train, and train includes this header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace octet {

// The parts of an optimizer step, for profiling. Zeroing the gradients counts with the optimizer, as
// PyTorch's optimizer.zero_grad() does; the non-finite checks and the gradient norm count with it too. The
// LM head's backward counts with the forward, which runs it chunk by chunk right after each chunk's loss.
enum class StepPhase : uint8_t { optimizer, data, forward, backward, done };

struct LearningRateSchedule {
  float max_learning_rate = 6e-4f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float final_fraction = 0.1f;  // the floor, as a fraction of the maximum
  // Learning rate of step `step` (0-based): (step + 1) / warmup * max during warm-up, then
  // floor + (max - floor) * (1 + cos(pi * progress)) / 2 with progress from 0 to 1 over the remaining steps.
  float at(int64_t step) const;
};

struct LossScaleSettings {
  bool dynamic = false;  // true for fp16 mode
  float initial_scale = 65536.0f;
  int64_t growth_interval = 2000;  // clean steps before the scale doubles
  float backoff_factor = 0.5f;     // applied on overflow
  float growth_factor = 2.0f;
};

// Parameters whose names match a glob ('*' any run of characters, '?' one character), with their own
// learning-rate multiplier and, optionally, their own weight decay ([optimizer] groups). A parameter belongs
// to the first group that matches it; one that none matches trains as the optimizer's settings say.
struct ParameterGroup {
  std::string match;
  float lr_scale = 1.0f;  // the step's learning rate times this, for the group's parameters
  // Replaces AdamWSettings::weight_decay for the group's parameters that decay (matrices); none: the same.
  std::optional<float> weight_decay;
};

struct AdamWSettings {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  std::vector<ParameterGroup> groups;  // in order: the first that matches a parameter's name holds it
};

struct TrainSettings {
  int64_t batch_size = 8;        // B of a micro-batch
  int64_t seq_len = 64;          // T
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step
  LearningRateSchedule schedule;
  float grad_clip = 1.0f;  // maximum global gradient norm; 0 disables clipping
  AdamWSettings adamw;
  LossScaleSettings loss_scale;
  int64_t max_consecutive_skips = 10;  // then the run stops with a diagnostic
  // Where the run keeps its records; when set, the trainer writes precision_map.json there at start.
  std::filesystem::path run_directory;
  // Receives the lines the trainer reports (the FP8 startup line); none when unset.
  std::function<void(std::string_view)> log;
  // Called as each phase of a step begins, and with StepPhase::done when the step ends (`octet bench train`
  // synchronises the backend there to time the phases); none when unset.
  std::function<void(StepPhase)> phase_began;
  // Called as each part of a step begins on the host, by name ("step start", "data", "forward", "backward",
  // "step scaling", "loss sum", "gradient sums", "gradient norm", "update"): what [profiling] records of the
  // host beside the device's kernels; none when unset. Nothing waits for the device there.
  std::function<void(std::string_view)> host_part_began;
};

}  // namespace octet
