// The CUDA backend's staging of small host-to-device copies (CudaBackend::copy_from_host).
// Internal to the CUDA backend: include only from its .cu files.
#pragma once

#include <array>
#include <cstddef>

#include <cuda_runtime.h>

namespace octet::cuda::backend_internal {

// Small host-to-device copies staged through pinned host memory, so that the host goes on without waiting
// for the GPU (the tokens of a step, a mixture of experts' balance gradient per block): the caller's bytes
// are copied into a slot of pinned memory, and the slot's copy to the device is enqueued on the stream. A
// slot is reused once its last copy is done (an event), slots in turn.
class StagedUploads {
 public:
  static constexpr size_t kSlotBytes = size_t{1} << 20;
  static constexpr int kSlots = 8;
  StagedUploads() = default;
  StagedUploads(const StagedUploads&) = delete;
  StagedUploads& operator=(const StagedUploads&) = delete;
  ~StagedUploads();
  // Enqueues the copy of `bytes` on `stream`; false, and nothing done, where they exceed a slot.
  bool upload(void* destination, const void* host, size_t bytes, cudaStream_t stream);

 private:
  struct Slot {
    void* pinned = nullptr;
    cudaEvent_t done = nullptr;
  };
  std::array<Slot, kSlots> slots_{};
  int next_ = 0;
};

}  // namespace octet::cuda::backend_internal
