// The device scratch memory that the CUDA backend's ops (ops.h) take: one Workspace per stream.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// Device scratch memory for the ops that need it, grown on demand and kept for reuse, plus a few bytes of
// pinned host memory for the values that ops return to the host. Use one Workspace per stream. Move-only;
// the destructor frees and never throws.
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&& other) noexcept;
  Workspace& operator=(Workspace&& other) noexcept;

  // At least `bytes` of device memory, 256-byte aligned. Growing waits for the work queued on `stream`,
  // which may still use the old block. The pointer stays valid until the next call.
  void* get(size_t bytes, cudaStream_t stream);
  // kHostBytes of pinned host memory, for copies back from the device.
  static constexpr size_t kHostBytes = 64;
  void* host();

 private:
  void release() noexcept;

  void* device_ = nullptr;
  size_t device_bytes_ = 0;
  void* host_ = nullptr;
};

}  // namespace octet::cuda
