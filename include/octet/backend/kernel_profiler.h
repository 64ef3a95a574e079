// Recording what a backend's device ran, launch by launch, without an external profiler: the backend-neutral
// side of `[profiling]` (docs/gpu.md, "Profiling"). A backend that can record (the CUDA backend, through
// CUPTI's activity API) hands out a KernelProfiler through BackendFactory::make_kernel_profiler; code above
// the backends sees only this header and never a CUDA one.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace octet {

// One piece of device work: a kernel launch, a copy or a fill, with the device's own start and end times; or
// (kind host) a part of a step as the host spent it: what the trainer did between two points of the step
// ("forward": enqueueing the forward and waiting for its loss), on the same clock.
struct DeviceActivity {
  enum class Kind : uint8_t { kernel, memcpy, memset, host };
  Kind kind = Kind::kernel;
  std::string name;  // a kernel's name, demangled where it is a C++ name; "memcpy HtoD", "memset"; a part
  uint64_t start_ns = 0;  // device timestamps (nanoseconds; one clock for the whole process)
  uint64_t end_ns = 0;
  std::array<int32_t, 3> grid{0, 0, 0};   // kernels only
  std::array<int32_t, 3> block{0, 0, 0};  // kernels only
  uint32_t stream = 0;
  uint32_t device = 0;
  uint64_t bytes = 0;  // copies and fills only
  int64_t step = 0;    // the optimizer step (1-based) it ran in; set by whoever collects it
};

// Records the device work of the process between start() and stop(). Not thread-safe: one owner calls it.
class KernelProfiler {
 public:
  virtual ~KernelProfiler() = default;
  // Begins recording the launches that follow. Throws octet::Error (training_failed) with one clear line when
  // recording cannot begin (no permission to profile, the profiling library missing or taken by another
  // profiler); the caller decides whether to go on without it.
  virtual void start() = 0;
  // Hands over every activity finished so far (step 0) and forgets them. The caller synchronises the device
  // first, so that everything it enqueued has finished.
  virtual std::vector<DeviceActivity> collect() = 0;
  // Ends recording; what was recorded stays for a last collect(). Never throws.
  virtual void stop() = 0;
  // Records lost because the profiler's buffers were full (0 in a healthy trace).
  virtual uint64_t dropped_records() const { return 0; }
  // Now, on the clock of the records' times (for the host's parts of a step).
  virtual uint64_t now_ns() const;
};

inline uint64_t KernelProfiler::now_ns() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace octet
