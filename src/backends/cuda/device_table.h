// A table of plain structs on the device, uploaded again only when it changes: the segmented and
// multi-tensor ops run every step over the same segments and tensors, so most steps upload nothing.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "octet/cuda/device.h"

namespace octet::cuda {

// T: trivially copyable, with operator== (the test for "changed").
template <typename T>
class DeviceTable {
 public:
  DeviceTable() = default;
  ~DeviceTable() { cudaFree(device_); }
  DeviceTable(const DeviceTable&) = delete;
  DeviceTable& operator=(const DeviceTable&) = delete;

  // The device copy of `rows`, enqueued on `stream` where it changed. Growing waits for the stream, so a
  // table still read by enqueued work is never freed under it.
  const T* upload(std::vector<T> rows, cudaStream_t stream) {
    if (device_ != nullptr && rows == uploaded_) return device_;
    if (rows.size() > capacity_ || device_ == nullptr) {
      OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaFree(device_);
      device_ = nullptr;
      capacity_ = rows.size() > 0 ? rows.size() : 1;
      OCTET_CUDA_CHECK(cudaMalloc(&device_, capacity_ * sizeof(T)));
    }
    uploaded_ = std::move(rows);
    // From pageable memory: the copy is staged before this returns, so uploaded_ may change afterwards.
    OCTET_CUDA_CHECK(cudaMemcpyAsync(device_, uploaded_.data(), uploaded_.size() * sizeof(T),
                                     cudaMemcpyHostToDevice, stream));
    return device_;
  }
  int64_t size() const { return static_cast<int64_t>(uploaded_.size()); }

 private:
  T* device_ = nullptr;
  size_t capacity_ = 0;
  std::vector<T> uploaded_;
};

}  // namespace octet::cuda
