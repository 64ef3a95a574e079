// One optimizer step (see trainer.h).
#include "octet/train/trainer.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/io/atomic_file.h"

namespace octet {

Trainer::Trainer(Model& model, TrainSettings settings)
    : model_(model),
      settings_(settings),
      optimizer_(model.backend(), model.parameters(), model.parameter_count(), settings.adamw),
      scaler_(settings.loss_scale) {
  OCTET_REQUIRE(settings.batch_size >= 1, "train.batch_size must be at least 1, got {}", settings.batch_size);
  OCTET_REQUIRE(settings.seq_len >= 1, "train.seq_len must be at least 1, got {}", settings.seq_len);
  OCTET_REQUIRE(settings.grad_accum_steps >= 1, "train.grad_accum_steps must be at least 1, got {}",
                settings.grad_accum_steps);
  OCTET_REQUIRE(settings.grad_clip >= 0.0f, "train.grad_clip must be 0 (off) or positive, got {}",
                settings.grad_clip);
  OCTET_REQUIRE(settings.max_consecutive_skips >= 1, "train.max_consecutive_skips must be at least 1, got {}",
                settings.max_consecutive_skips);
  for (const std::string& line : {model.policy().startup_line(), model.memory_line()}) {
    if (!line.empty() && settings_.log) settings_.log(line);
  }
  if (!settings_.run_directory.empty()) write_precision_map();
}

void Trainer::write_precision_map() {
  std::error_code ec;
  std::filesystem::create_directories(settings_.run_directory, ec);
  OCTET_REQUIRE(!ec, "cannot create the run directory {}: {}", settings_.run_directory.string(),
                ec.message());
  io::write_file_atomically(settings_.run_directory / "precision_map.json", precision_map_json(model_));
}

std::string Trainer::first_non_finite_gradient() {
  // In backward order: the LM head (tied to wte) first, then the last parameters back to the first.
  const auto& params = model_.parameters();
  const ParameterInfo& wte = model_.parameter("wte");
  if (!model_.gradient_finite(wte)) return wte.name;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (!model_.gradient_finite(*it)) return it->name;
  }
  return {};
}

StepResult Trainer::step(const BatchSource& data) {
  const int64_t B = settings_.batch_size, T = settings_.seq_len, micro = settings_.grad_accum_steps;
  StepResult r;
  r.step = step_;
  r.loss_scale = scaler_.scale();
  r.learning_rate = settings_.schedule.at(step_);
  r.tokens = B * T * micro;
  const GemmCounters before = model_.counters();
  const auto phase = [this](StepPhase p) {
    if (settings_.phase_began) settings_.phase_began(p);
  };

  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  phase(StepPhase::optimizer);
  model_.zero_grad();
  double loss_sum = 0.0;
  bool loss_finite = true;
  // The gradient of the scaled mean loss; each forward runs the LM head's backward with it, chunk by chunk.
  const float dloss = r.loss_scale / static_cast<float>(B * T * micro);
  for (int64_t m = 0; m < micro; ++m) {
    phase(StepPhase::data);
    data(tokens.data(), targets.data());
    phase(StepPhase::forward);
    const float loss = model_.forward(tokens.data(), targets.data(), B, T, dloss);
    loss_finite &= std::isfinite(loss);
    loss_sum += loss;
    phase(StepPhase::backward);
    model_.backward(dloss);
  }
  phase(StepPhase::optimizer);
  r.loss = static_cast<float>(loss_sum / static_cast<double>(micro));
  r.fp8_gemms = model_.counters().fp8_gemms - before.fp8_gemms;
  r.other_gemms = model_.counters().other_gemms - before.other_gemms;

  double sum_of_squares = 0.0;
  if (!loss_finite) {
    r.skip_reason = fmt::format("non-finite loss ({})", r.loss);
  } else {
    // A float64 sum of float32 squares is finite exactly when every gradient is: one reduction checks them
    // all, and only a non-finite sum pays for the search, tensor by tensor, for the first bad one.
    sum_of_squares = model_.gradient_sum_of_squares();
    const std::string name = std::isfinite(sum_of_squares) ? std::string() : first_non_finite_gradient();
    if (!name.empty()) {
      r.skip_reason = fmt::format("non-finite gradient in {}", name);
      if (settings_.loss_scale.dynamic) r.skip_reason += fmt::format(" at loss scale {}", r.loss_scale);
    }
  }
  if (!r.skip_reason.empty()) {
    r.skipped = true;
    r.grad_norm = NAN;
    scaler_.update(true);
    ++step_;
    if (++consecutive_skips_ >= settings_.max_consecutive_skips) {
      throw Error(
          ErrorKind::training_failed,
          fmt::format("training stopped at step {}: {} consecutive steps skipped, the last for a {}; the "
                      "loss scale is now {}. Lower the learning rate, check the data, or train in bf16 "
                      "to see whether precision is the cause",
                      r.step + 1, consecutive_skips_, r.skip_reason, scaler_.scale()));
    }
    phase(StepPhase::done);
    return r;
  }

  r.grad_norm = static_cast<float>(std::sqrt(sum_of_squares) / r.loss_scale);
  const float clip = settings_.grad_clip > 0.0f && r.grad_norm > settings_.grad_clip
                         ? settings_.grad_clip / r.grad_norm
                         : 1.0f;
  // The weight copies for the next step are remade by the update itself.
  const std::vector<Model::WeightCopySlot> copies = model_.weight_copy_slots();
  optimizer_.step(model_.params(), model_.grads(), r.learning_rate, clip / r.loss_scale, copies,
                  model_.grads_bf16());
  scaler_.update(false);
  consecutive_skips_ = 0;
  ++step_;
  phase(StepPhase::done);
  return r;
}

float Trainer::evaluate(const BatchSource& data, int64_t batches) {
  const int64_t B = settings_.batch_size, T = settings_.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  model_.set_scaling_updates(false);
  double sum = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    data(tokens.data(), targets.data());
    sum += model_.forward(tokens.data(), targets.data(), B, T);
  }
  model_.set_scaling_updates(true);
  return static_cast<float>(sum / static_cast<double>(batches));
}

}  // namespace octet
