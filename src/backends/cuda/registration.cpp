// The CUDA backend in the backend registry (see cuda_registration.h and registry.h): what the engine asks of
// it, answered by the CUDA backend's own entry points (cuda_backend.h, gpu_bench.h).
#include "octet/backend/cuda_registration.h"

#include <fmt/format.h>

#include "kernel_profiler.h"
#include "octet/backend/cuda_backend.h"
#include "octet/backend/gpu_bench.h"
#include "octet/backend/registry.h"
#include "octet/dist/nccl_group.h"

namespace octet {
namespace {

CudaBackendOptions::AttentionKernels cuda_attention_choice(AttentionKernelChoice choice) {
  using Kernels = CudaBackendOptions::AttentionKernels;
  switch (choice) {
    case AttentionKernelChoice::automatic:
      break;
    case AttentionKernelChoice::cudnn:
      return Kernels::cudnn;
    case AttentionKernelChoice::octet:
      return Kernels::octet;
  }
  return Kernels::automatic;
}

class CudaDeviceBench final : public DeviceBench {
 public:
  std::vector<GemmBenchRow> bench_gemms(
      const std::vector<GemmBenchShape>& shapes, const GemmBenchSettings& settings,
      const std::function<void(const GemmBenchRow&)>& on_row) const override {
    return octet::bench_gemms(shapes, settings, on_row);
  }
  BandwidthBenchResult bench_memory_bandwidth(const BandwidthBenchSettings& settings) const override {
    return octet::bench_memory_bandwidth(settings);
  }
  DeviceMemoryUse memory_in_use(int device) const override { return device_memory_in_use(device); }
};

class CudaBackendFactory final : public BackendFactory {
 public:
  std::string_view name() const override { return "cuda"; }
  int device_count() const override { return cuda_device_count(); }
  BackendDevice device(int index) const override {
    const CudaDeviceInfo info = cuda_device_info(index);
    BackendDevice d;
    d.index = info.index;
    d.name = info.name;
    d.major = info.major;
    d.minor = info.minor;
    d.fp8_tensor_cores = info.fp8_tensor_cores;
    d.memory_bytes = info.memory_bytes;
    return d;
  }
  std::string describe_device(int index) const override {
    const CudaDeviceInfo info = cuda_device_info(index);
    return fmt::format("{} (CUDA device {}, compute capability {}.{})", info.name, index, info.major,
                       info.minor);
  }
  // Per-tensor scales only: block and MXFP8 scaling are not on the GPU yet.
  bool supports_recipe(RecipeKind recipe) const override {
    return recipe != RecipeKind::block && recipe != RecipeKind::mxfp8;
  }
  bool attention_on_tensor_cores(int64_t C, int64_t NH) const override {
    return cuda_attention_on_tensor_cores(C, NH);
  }
  std::string attention_kernels(int64_t B, int64_t T, int64_t C, int64_t NH,
                                AttentionKernelChoice choice) const override {
    return cuda_attention_kernels(B, T, C, NH, cuda_attention_choice(choice));
  }
  std::unique_ptr<dist::Communicator> join_ranks(dist::Communicator& control, int device) const override {
    return dist::join_nccl(control, device);
  }
  std::unique_ptr<Backend> make(const BackendOptions& options) const override {
    CudaBackendOptions cuda_options;
    cuda_options.device = options.device;
    cuda_options.emulate_fp8 = options.emulate_fp8;
    cuda_options.bf16_attention = options.bf16_attention;
    cuda_options.attention = cuda_attention_choice(options.attention);
    cuda_options.time_gemm_algorithms = options.time_gemm_algorithms;
    return make_cuda_backend(cuda_options);
  }
  const DeviceBench* device_bench() const override { return &bench_; }
  std::unique_ptr<KernelProfiler> make_kernel_profiler() const override {
    return cuda::make_cupti_kernel_profiler();
  }

 private:
  CudaDeviceBench bench_;
};

}  // namespace

void register_cuda_backend() {
  register_backend(std::make_unique<CudaBackendFactory>());
}

}  // namespace octet
