// The CUDA backend's entry points in a build without CUDA: there is no GPU to find, and asking for the
// backend says why.
#include "octet/backend/cuda_backend.h"
#include "octet/backend/gpu_bench.h"
#include "octet/check.h"

namespace octet {

bool cuda_backend_built() {
  return false;
}

int cuda_device_count() {
  return 0;
}

CudaDeviceInfo cuda_device_info(int) {
  OCTET_REQUIRE(false,
                "this octet was built without CUDA (configure with nvcc available, OCTET_CUDA=AUTO|ON)");
  return {};
}

bool cuda_attention_on_tensor_cores(int64_t, int64_t) {
  return false;
}

std::string cuda_attention_kernels(int64_t, int64_t, int64_t, int64_t, CudaBackendOptions::AttentionKernels) {
  return "octet's float32 attention (built without CUDA)";
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  OCTET_REQUIRE(false,
                "train.device = \"cuda\": this octet was built without CUDA (configure with nvcc available, "
                "OCTET_CUDA=AUTO|ON)");
  return nullptr;
}

std::vector<GemmBenchRow> bench_gemms(const std::vector<GemmBenchShape>&, const GemmBenchSettings&,
                                      const std::function<void(const GemmBenchRow&)>&) {
  OCTET_REQUIRE(false,
                "GPU benchmarks: this octet was built without CUDA (configure with nvcc available, "
                "OCTET_CUDA=AUTO|ON)");
  return {};
}

BandwidthBenchResult bench_memory_bandwidth(const BandwidthBenchSettings&) {
  OCTET_REQUIRE(false,
                "GPU benchmarks: this octet was built without CUDA (configure with nvcc available, "
                "OCTET_CUDA=AUTO|ON)");
  return {};
}

DeviceMemoryUse device_memory_in_use(int) {
  OCTET_REQUIRE(false,
                "device memory: this octet was built without CUDA (configure with nvcc available, "
                "OCTET_CUDA=AUTO|ON)");
  return {};
}

}  // namespace octet
