// The CUDA backend's view of the machine: how many GPUs there are (zero, never an error, where there is no
// driver or no device), what one of them can do, a check macro that turns CUDA errors into octet::Error, and
// move-only owners of device memory and streams. Host code only: kernels live in src/backends/cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// Number of CUDA devices this process can use; 0 when there is no driver, no device, or any other failure
// to ask (the question must be safe on a CPU-only machine, where tests and tools use it to decide to skip).
int device_count() noexcept;

struct DeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;  // compute capability, e.g. 9.0 for H100
  int compute_minor = 0;
  int multiprocessors = 0;
  size_t total_memory_bytes = 0;
};

// Properties of device `index` (throws octet::Error if it does not exist).
DeviceInfo device_info(int index = 0);

// FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper).
bool has_fp8_tensor_cores(const DeviceInfo& info);

namespace detail {
// Throws octet::Error (ErrorKind::internal) naming the failed call, CUDA's error name and string, the file
// and the line. Out of line so that this header needs neither fmt nor octet/check.h.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace octet::cuda

// `call` must return cudaSuccess; anything else throws octet::Error naming the call, the CUDA error, file and
// line.
#define OCTET_CUDA_CHECK(call)                                                                \
  do {                                                                                        \
    const cudaError_t octet_cuda_status_ = (call);                                            \
    if (octet_cuda_status_ != cudaSuccess) {                                                  \
      ::octet::cuda::detail::throw_cuda_error(octet_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)

// After every kernel launch: a launch reports a bad configuration only through cudaGetLastError.
#define OCTET_CUDA_CHECK_LAUNCH(kernel_name)                                                          \
  do {                                                                                                \
    const cudaError_t octet_cuda_status_ = cudaGetLastError();                                        \
    if (octet_cuda_status_ != cudaSuccess) {                                                          \
      ::octet::cuda::detail::throw_cuda_error(octet_cuda_status_, "launch of " kernel_name, __FILE__, \
                                              __LINE__);                                              \
    }                                                                                                 \
  } while (0)

namespace octet::cuda {

// Owns a CUDA event (timing enabled). Not copyable; the destructor never throws.
class Event {
 public:
  Event() { OCTET_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { (void)cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Owns `count` elements of device memory. Move-only; the destructor frees and never throws (an error from
// cudaFree at that point, e.g. after a device fault, cannot be acted on and must not terminate).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) {
      void* p = nullptr;
      OCTET_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
      data_ = static_cast<T*>(p);
    }
  }
  ~DeviceBuffer() { release(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  size_t size() const noexcept { return count_; }
  size_t bytes() const noexcept { return count_ * sizeof(T); }

  // Synchronous copies for setup and tests; the first min(size, host.size()) elements.
  void copy_from_host(std::span<const T> host) {
    const size_t n = host.size() < count_ ? host.size() : count_;
    if (n > 0) {
      OCTET_CUDA_CHECK(cudaMemcpy(data_, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
      // cudaMemcpy from pageable memory may return before the copy lands; work on a non-blocking stream
      // would not wait for it.
      OCTET_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  void copy_to_host(std::span<T> host) const {
    const size_t n = host.size() < count_ ? host.size() : count_;
    if (n > 0) OCTET_CUDA_CHECK(cudaMemcpy(host.data(), data_, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  // Sets every byte (sentinels before a kernel runs, zeroing).
  void fill_bytes(uint8_t value) {
    if (count_ > 0) OCTET_CUDA_CHECK(cudaMemset(data_, value, bytes()));
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
    count_ = 0;
  }

  T* data_ = nullptr;
  size_t count_ = 0;
};

// Owns a non-blocking CUDA stream. Move-only; the destructor never throws.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept;

  cudaStream_t get() const noexcept { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace octet::cuda
