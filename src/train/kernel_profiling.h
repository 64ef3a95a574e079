// The [profiling] steps of a training run, internal to src/train/: records the device work of
// profiling.start_step .. end_step through the backend's KernelProfiler, tags each record with its step and
// writes the trace (telemetry/kernel_trace.h) once the last of them has run. When the profiler cannot record
// (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES), the run says so once and trains on without a trace: a fallback that
// is printed, written to metrics.jsonl and telemetry's events, and counted in the run's summary.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/registry.h"
#include "octet/config/run_config.h"

namespace octet {

class StepProfiling {
 public:
  // `say` prints a line of the run's log; `fallback` records that profiling was given up at a step, why.
  struct Hooks {
    std::function<void(const std::string&)> say;
    std::function<void(int64_t step, const std::string& message)> fallback;
  };
  // Records nothing unless config.profiling.enabled and `record` (rank 0 records for the run).
  StepProfiling(const RunConfig& config, const BackendFactory& factory, std::string device, bool record,
                Hooks hooks);
  ~StepProfiling();
  StepProfiling(const StepProfiling&) = delete;
  StepProfiling& operator=(const StepProfiling&) = delete;

  // Around optimizer step `step` (1-based). after_step synchronises the backend on profiled steps.
  void before_step(int64_t step, Backend& backend);
  void after_step(int64_t step, Backend& backend);
  // The trainer begins a part of the step (TrainSettings::host_part_began): on a profiled step the part
  // before it ends here, and the trace gets it as a host record. The last part ends at after_step.
  void host_part(std::string_view part);
  // The run ends before profiling.end_step (a signal): what was recorded is written.
  void finish(Backend& backend);

  bool gave_up() const { return gave_up_; }
  // Where the trace was written; empty until it has been.
  const std::filesystem::path& written() const { return written_; }

 private:
  void write(Backend& backend);

  const ProfilingSettings settings_;
  const std::filesystem::path dir_;
  std::string device_;
  Hooks hooks_;
  std::unique_ptr<KernelProfiler> profiler_;
  std::vector<DeviceActivity> records_;
  std::optional<DeviceActivity> part_;  // the host's part under way on a profiled step
  bool recording_ = false;
  bool gave_up_ = false;
  std::filesystem::path written_;
};

}  // namespace octet
