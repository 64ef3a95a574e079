// Workspace (workspace.h): device scratch memory grown on demand and kept, and pinned host memory for the
// values that ops return to the host.
#include "workspace.h"

#include <algorithm>
#include <utility>

#include "octet/cuda/device.h"

namespace octet::cuda {

Workspace::~Workspace() {
  release();
}

Workspace::Workspace(Workspace&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      device_bytes_(std::exchange(other.device_bytes_, 0)),
      host_(std::exchange(other.host_, nullptr)) {}

Workspace& Workspace::operator=(Workspace&& other) noexcept {
  if (this != &other) {
    release();
    device_ = std::exchange(other.device_, nullptr);
    device_bytes_ = std::exchange(other.device_bytes_, 0);
    host_ = std::exchange(other.host_, nullptr);
  }
  return *this;
}

void Workspace::release() noexcept {
  if (device_ != nullptr) (void)cudaFree(device_);
  if (host_ != nullptr) (void)cudaFreeHost(host_);
  device_ = nullptr;
  device_bytes_ = 0;
  host_ = nullptr;
}

void* Workspace::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= device_bytes_ && device_ != nullptr) return device_;
  // Work already queued on the stream may still use the old block.
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (device_ != nullptr) OCTET_CUDA_CHECK(cudaFree(device_));
  device_ = nullptr;
  device_bytes_ = 0;
  // Half as much again, rounded to 1 MiB, so that slowly growing requests do not reallocate every time.
  const size_t mib = size_t{1} << 20;
  const size_t size = std::max<size_t>((bytes + bytes / 2 + mib - 1) / mib * mib, mib);
  OCTET_CUDA_CHECK(cudaMalloc(&device_, size));
  device_bytes_ = size;
  return device_;
}

void* Workspace::host() {
  if (host_ == nullptr) OCTET_CUDA_CHECK(cudaMallocHost(&host_, kHostBytes));
  return host_;
}

}  // namespace octet::cuda
