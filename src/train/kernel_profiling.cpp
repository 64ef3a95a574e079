// See kernel_profiling.h.
#include "kernel_profiling.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/telemetry/kernel_trace.h"

namespace octet {

StepProfiling::StepProfiling(const RunConfig& config, const BackendFactory& factory, std::string device,
                             bool record, Hooks hooks)
    : settings_(config.profiling),
      dir_(profiling_trace_dir(config)),
      device_(std::move(device)),
      hooks_(std::move(hooks)) {
  if (!settings_.enabled || !record) return;
  profiler_ = factory.make_kernel_profiler();
  // train_as_rank refuses [profiling] on a backend without a profiler before anything is written.
  OCTET_CHECK(profiler_ != nullptr, "the {} backend has no kernel profiler", factory.name());
}

StepProfiling::~StepProfiling() {
  if (profiler_) profiler_->stop();
}

void StepProfiling::before_step(int64_t step, Backend& backend) {
  if (!profiler_ || recording_ || gave_up_ || !written_.empty()) return;
  // A resumed run that starts inside the range profiles the steps it runs.
  if (step < settings_.start_step || step > settings_.end_step) return;
  backend.synchronize();  // the previous step's work is not this step's
  try {
    profiler_->start();
  } catch (const Error& e) {
    gave_up_ = true;
    const std::string message =
        fmt::format("kernel profiling is off for this run, which trains on without a trace: {}", e.what());
    hooks_.say(fmt::format("warning: {}", message));
    hooks_.fallback(step, message);
    return;
  }
  recording_ = true;
  (void)profiler_->collect();  // anything CUPTI delivers from before the step is not the step's
  hooks_.say(fmt::format("profiling the device's kernels of steps {} to {} into {}", step, settings_.end_step,
                         dir_.string()));
}

void StepProfiling::host_part(std::string_view part) {
  if (!recording_) return;
  const uint64_t now = profiler_->now_ns();
  if (part_) {
    part_->end_ns = std::max(now, part_->start_ns);
    records_.push_back(std::move(*part_));
  }
  part_ = DeviceActivity{.kind = DeviceActivity::Kind::host, .name = std::string(part), .start_ns = now};
}

void StepProfiling::after_step(int64_t step, Backend& backend) {
  if (!recording_) return;
  // The step's last part ends as the trainer returns, before the wait for the device below.
  if (part_) {
    part_->end_ns = std::max(profiler_->now_ns(), part_->start_ns);
    part_->step = step;
    records_.push_back(std::move(*part_));
    part_.reset();
  }
  for (DeviceActivity& a : records_) {
    if (a.kind == DeviceActivity::Kind::host && a.step == 0) a.step = step;
  }
  backend.synchronize();
  for (DeviceActivity& a : profiler_->collect()) {
    a.step = step;
    records_.push_back(std::move(a));
  }
  if (step >= settings_.end_step) write(backend);
}

void StepProfiling::finish(Backend& backend) {
  if (recording_) write(backend);
}

void StepProfiling::write(Backend& backend) {
  backend.synchronize();
  profiler_->stop();
  recording_ = false;
  // What stop() flushed finished before it, so within the last step.
  const int64_t last = records_.empty() ? settings_.start_step : records_.back().step;
  for (DeviceActivity& a : profiler_->collect()) {
    a.step = last;
    records_.push_back(std::move(a));
  }
  std::stable_sort(records_.begin(), records_.end(), [](const DeviceActivity& a, const DeviceActivity& b) {
    return a.step != b.step ? a.step < b.step : a.start_ns < b.start_ns;
  });
  KernelTrace trace;
  trace.device = device_;
  trace.dropped_records = profiler_->dropped_records();
  trace.activities = std::move(records_);
  records_.clear();
  write_kernel_trace(dir_, trace);
  written_ = dir_;
  const KernelSummary summary = summarize_kernels(trace);
  const double share = summary.total_ns > 0 ? 100.0 * static_cast<double>(summary.fp8_gemm_ns) /
                                                  static_cast<double>(summary.total_ns)
                                            : 0.0;
  hooks_.say(fmt::format(
      "kernel trace of steps {} to {}: {} launches, {:.3f} ms of device time; FP8 GEMM "
      "kernels: {} launches, {:.1f}% of it; {}{}",
      summary.first_step, summary.last_step, summary.launches, static_cast<double>(summary.total_ns) / 1e6,
      summary.fp8_gemm_launches, share, (dir_ / "kernels.jsonl").string(),
      summary.dropped_records > 0
          ? fmt::format(" ({} records lost: the trace is incomplete)", summary.dropped_records)
          : std::string()));
}

}  // namespace octet
