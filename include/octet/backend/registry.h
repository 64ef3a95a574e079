// The backends this program has, by name ("cpu", "cuda"), and what the engine needs to know of one before it
// makes it: whether it can run on this machine (its devices), how the startup line names a device, which FP8
// recipes it runs, where its attention runs, and the device measurements of `octet bench`. The engine makes
// every backend through here and names no backend's own header, so that the octet library, which holds the
// engine, links no backend library: a backend library links octet and registers itself.
//
// The CPU backend is always registered. The CUDA backend (library octet_cuda) is registered by
// register_cuda_backend() (cuda_registration.h), which a program that links octet_cuda calls before it asks
// for "cuda"; the `octet` tool does so first thing. Without it, find_backend("cuda") answers null, as in a
// build without CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/backend/gpu_bench.h"
#include "octet/backend/kernel_profiler.h"
#include "octet/dist/communicator.h"
#include "octet/numerics/scaling.h"

namespace octet {

// A device a registered backend runs on.
struct BackendDevice {
  int index = 0;
  std::string name;  // "NVIDIA H100 80GB HBM3"; "CPU"
  int major = 0;     // compute capability, on a GPU
  int minor = 0;
  bool fp8_tensor_cores = false;  // FP8 GEMMs in hardware (compute capability 8.9 or above)
  size_t memory_bytes = 0;
};

// Which kernels run attention on BF16 tensor cores (train.attention): cuDNN's fused flash attention, octet's
// own, or cuDNN where it loads and can run the shape and octet's otherwise.
enum class AttentionKernelChoice : uint8_t { automatic, cudnn, octet };

// What the engine asks of a backend it makes; a backend ignores what does not apply to it (the CPU backend
// takes none of these).
struct BackendOptions {
  int device = 0;
  // FP8 GEMMs as BF16 GEMMs on the very same FP8 codes, for a GPU without FP8 tensor cores.
  bool emulate_fp8 = false;
  // Attention's products on BF16 tensor cores (float32 accumulation and softmax); false: float32 throughout.
  bool bf16_attention = false;
  AttentionKernelChoice attention = AttentionKernelChoice::automatic;
  // Each GEMM shape's algorithm timed on its first product rather than the heuristic's first answer.
  bool time_gemm_algorithms = false;
};

// The measurements of `octet bench` on a backend's devices (gpu_bench.h says what each measures).
class DeviceBench {
 public:
  virtual ~DeviceBench() = default;
  virtual std::vector<GemmBenchRow> bench_gemms(
      const std::vector<GemmBenchShape>& shapes, const GemmBenchSettings& settings,
      const std::function<void(const GemmBenchRow&)>& on_row) const = 0;
  virtual BandwidthBenchResult bench_memory_bandwidth(const BandwidthBenchSettings& settings) const = 0;
  virtual DeviceMemoryUse memory_in_use(int device) const = 0;
};

// One registered backend: what it is and can do here, and how to make it.
class BackendFactory {
 public:
  virtual ~BackendFactory() = default;
  // The name train.device and --device give it: "cpu", "cuda".
  virtual std::string_view name() const = 0;
  // The devices it can run on on this machine; 0 where it can run on none (no driver, no GPU).
  virtual int device_count() const = 0;
  virtual BackendDevice device(int index) const = 0;
  // The device as the startup line names it: "NVIDIA H100 80GB HBM3 (CUDA device 0, compute capability 9.0)".
  virtual std::string describe_device(int index) const = 0;
  // Whether its FP8 GEMMs run with scales of this recipe.
  virtual bool supports_recipe(RecipeKind recipe) const = 0;
  // Whether a backend made with bf16_attention runs attention over C channels in NH heads on BF16 tensor
  // cores on device 0 (otherwise in float32: correct, much slower).
  virtual bool attention_on_tensor_cores(int64_t C, int64_t NH) const = 0;
  // Which kernels a backend made with bf16_attention and `choice` runs attention with, for B x T tokens over
  // C channels in NH heads, in words for the startup line. Throws octet::Error (invalid_input) where `choice`
  // cannot be had.
  virtual std::string attention_kernels(int64_t B, int64_t T, int64_t C, int64_t NH,
                                        AttentionKernelChoice choice) const = 0;
  // Throws octet::Error (invalid_input) when the backend cannot be made (no such device).
  virtual std::unique_ptr<Backend> make(const BackendOptions& options) const = 0;
  // The device measurements of `octet bench`; null where the backend has none (the CPU).
  virtual const DeviceBench* device_bench() const { return nullptr; }
  // A recorder of the device's kernels for [profiling] (kernel_profiler.h); null where the backend has none
  // (the CPU, whose ops are no kernels).
  virtual std::unique_ptr<KernelProfiler> make_kernel_profiler() const { return nullptr; }
  // The communicator over which the ranks of a run exchange this backend's tensors on `device`, made over
  // `control`, the run's processes joined (dist/socket_group.h): NCCL on the GPU. Null where `control` serves
  // as it is (the CPU backend, whose tensors lie in host memory).
  virtual std::unique_ptr<dist::Communicator> join_ranks(dist::Communicator& /*control*/, int /*device*/) const {
    return nullptr;
  }
};

// Adds `factory` under its name. A name registered already keeps its first factory, so that registering twice
// does no harm and what find_backend returned stays valid for the life of the program.
void register_backend(std::unique_ptr<const BackendFactory> factory);
// The backend registered under `name`; null when this program has none by that name.
const BackendFactory* find_backend(std::string_view name);
// Every registered backend, in the order registered (the CPU first): what the op harness holds to the CPU
// reference, so that a new backend is tested by registering it.
std::vector<const BackendFactory*> registered_backends();

}  // namespace octet
