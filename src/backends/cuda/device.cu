// Device discovery and CUDA error reporting for the CUDA backend (see octet/cuda/device.h).
#include "octet/cuda/device.h"

#include <string>

#include "octet/check.h"

namespace octet::cuda {

namespace detail {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Clears the error of a failed launch so that it is not reported again by the next, unrelated check.
  // (A sticky error such as an illegal address stays; every later call reports it, which is right.)
  (void)cudaGetLastError();
  std::string message = "CUDA call failed: ";
  message += call;
  message += ": ";
  message += cudaGetErrorName(status);
  message += " (";
  message += cudaGetErrorString(status);
  message += ")";
  if (status == cudaErrorMemoryAllocation) {
    // Not a fault of octet's: the model, batch and precision need more device memory than is free.
    message +=
        ": the run needs more GPU memory than is free; lower train.batch_size (raise train.grad_accum_steps "
        "to keep the batch), train in fp8 mode, or set the fp8.recompute_* keys to true "
        "(docs/troubleshooting.md)";
    throw_error(ErrorKind::invalid_input, file, line, message);
  }
  throw_error(ErrorKind::internal, file, line, message);
}

}  // namespace detail

int device_count() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // No driver (cudaErrorInsufficientDriver), no device (cudaErrorNoDevice), or a broken installation: all
    // mean "no GPU to use". Clear the error so that a later cudaGetLastError does not see it.
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

DeviceInfo device_info(int index) {
  cudaDeviceProp properties{};
  OCTET_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  DeviceInfo info;
  info.index = index;
  info.name = properties.name;
  info.compute_major = properties.major;
  info.compute_minor = properties.minor;
  info.multiprocessors = properties.multiProcessorCount;
  info.total_memory_bytes = properties.totalGlobalMem;
  return info;
}

bool has_fp8_tensor_cores(const DeviceInfo& info) {
  return info.compute_major > 8 || (info.compute_major == 8 && info.compute_minor >= 9);
}

Stream::Stream() {
  OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const {
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace octet::cuda
