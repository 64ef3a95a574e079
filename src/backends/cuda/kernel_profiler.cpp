// CUPTI's activity API behind octet's KernelProfiler. CUPTI asks for buffers and hands them back full through
// two process-wide callbacks; the records are copied out at once (their name strings belong to CUPTI) into
// the one profiler that records. Kernel records come from CONCURRENT_KERNEL, which, unlike KERNEL, leaves
// kernels free to overlap as they would without a profiler.
#include "kernel_profiler.h"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cupti_activity.h>
#include <fmt/format.h>

#include "octet/check.h"

namespace octet::cuda {
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;  // CUPTI's suggestion is a few MB
constexpr size_t kBufferAlignment = 8;            // ACTIVITY_RECORD_ALIGNMENT in CUPTI's samples

// What the callbacks write into: the records of the profiler that records, and the count of lost ones.
struct Sink {
  std::mutex mutex;
  bool active = false;
  std::vector<DeviceActivity> records;
  uint64_t dropped = 0;
  bool callbacks_registered = false;
};
// Never destroyed: CUPTI may hand back buffers from its own exit handlers, after static objects are gone.
Sink& sink() {
  static Sink* const s = new Sink;
  return *s;
}

std::string result_text(CUptiResult result) {
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || text == nullptr)
    return fmt::format("{}", static_cast<int>(result));
  return text;
}

// A C++ kernel's name as written in the source ("void octet::cuda::(anonymous namespace)::cast_amax_kernel<
// false>(...)"); other names (cuBLASLt's, which are not mangled) as given.
std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && out != nullptr ? std::string(out) : std::string(name);
  std::free(out);
  return result;
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t /*size*/,
                               size_t valid_size) {
  std::vector<DeviceActivity> out;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    DeviceActivity a;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        a.kind = DeviceActivity::Kind::kernel;
        a.name = demangled(k->name);
        a.start_ns = k->start;
        a.end_ns = k->end;
        a.grid = {k->gridX, k->gridY, k->gridZ};
        a.block = {k->blockX, k->blockY, k->blockZ};
        a.stream = k->streamId;
        a.device = k->deviceId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        a.kind = DeviceActivity::Kind::memcpy;
        a.name = copy_kind(m->copyKind);
        a.start_ns = m->start;
        a.end_ns = m->end;
        a.stream = m->streamId;
        a.device = m->deviceId;
        a.bytes = m->bytes;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        a.kind = DeviceActivity::Kind::memset;
        a.name = "memset";
        a.start_ns = m->start;
        a.end_ns = m->end;
        a.stream = m->streamId;
        a.device = m->deviceId;
        a.bytes = m->bytes;
        break;
      }
      default:
        continue;
    }
    // A record whose end the device did not write (CUPTI leaves 0) tells nothing about time.
    if (a.end_ns < a.start_ns || a.start_ns == 0) continue;
    out.push_back(std::move(a));
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped);
  std::free(buffer);
  Sink& s = sink();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.dropped += dropped;
  if (!s.active) return;
  s.records.insert(s.records.end(), std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

class CuptiKernelProfiler final : public KernelProfiler {
 public:
  ~CuptiKernelProfiler() override { stop(); }

  void start() override {
    Sink& s = sink();
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (s.active)
        throw Error(ErrorKind::training_failed, "another kernel profiler of this process is recording");
      if (!s.callbacks_registered) {
        check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "registering its buffers");
        s.callbacks_registered = true;
      }
      s.records.clear();
      s.dropped = 0;
      s.active = true;
    }
    for (size_t i = 0; i < std::size(kKinds); ++i) {
      const CUptiResult r = cuptiActivityEnable(kKinds[i]);
      if (r != CUPTI_SUCCESS) {
        for (size_t j = 0; j < i; ++j) cuptiActivityDisable(kKinds[j]);
        const std::lock_guard<std::mutex> lock(s.mutex);
        s.active = false;
        check(r, "enabling its kernel records");
      }
    }
    recording_ = true;
  }

  std::vector<DeviceActivity> collect() override {
    if (recording_) cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    Sink& s = sink();
    const std::lock_guard<std::mutex> lock(s.mutex);
    std::vector<DeviceActivity> out = std::move(s.records);
    s.records.clear();
    return out;
  }

  void stop() override {
    if (!recording_) return;
    recording_ = false;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (const CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
    Sink& s = sink();
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.active = false;
  }

  uint64_t now_ns() const override {
    uint64_t now = 0;
    // CUPTI's own clock, the one its records' times are on.
    if (cuptiGetTimestamp(&now) != CUPTI_SUCCESS) return KernelProfiler::now_ns();
    return now;
  }

  uint64_t dropped_records() const override {
    Sink& s = sink();
    const std::lock_guard<std::mutex> lock(s.mutex);
    return s.dropped;
  }

 private:
  static void check(CUptiResult result, const char* doing) {
    if (result == CUPTI_SUCCESS) return;
    if (result == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES ||
        result == CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES) {
      throw Error(ErrorKind::training_failed,
                  fmt::format("CUPTI refused {} ({}): this user may not profile the GPU here; see "
                              "docs/troubleshooting.md, \"Kernel profiling is off\"",
                              doing, result_text(result)));
    }
    if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      throw Error(
          ErrorKind::training_failed,
          fmt::format("CUPTI refused {} ({}): another profiler (Nsight Systems, Nsight Compute) holds "
                      "CUPTI in this process; profile with one or the other",
                      doing, result_text(result)));
    }
    throw Error(ErrorKind::training_failed, fmt::format("CUPTI refused {}: {}", doing, result_text(result)));
  }

  bool recording_ = false;
};

}  // namespace

std::unique_ptr<KernelProfiler> make_cupti_kernel_profiler() {
  return std::make_unique<CuptiKernelProfiler>();
}

}  // namespace octet::cuda
