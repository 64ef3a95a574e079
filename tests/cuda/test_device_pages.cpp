// The CUDA backend's releasable buffers (Backend::allocate_releasable, src/backends/cuda/device_pages.cpp):
// the chunks given back leave the device (its free memory grows by as much), the values outside them stay,
// and the chunks mapped back are ordinary device memory again. Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend_ops_harness.h"

namespace octet {
namespace {

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

TEST(GpuDevicePages, ChunksGivenBackLeaveTheDeviceAndComeBackWhenRestored) {
  SKIP_WITHOUT_TESTED_BACKEND();
  auto backend = testing::backend_ops::make_tested_backend();
  const size_t mib = size_t{1} << 20;
  const size_t floats = (64 * mib + 300) / sizeof(float);
  std::unique_ptr<Buffer> buffer = backend->allocate_releasable(floats * sizeof(float));
  ASSERT_EQ(buffer->bytes(), floats * sizeof(float));
  std::vector<float> host(floats);
  for (size_t i = 0; i < floats; ++i) host[i] = static_cast<float>(i % 4093);
  backend->copy_from_host(buffer->data(), host.data(), floats * sizeof(float));
  backend->synchronize();

  // [5 MiB + 12 bytes, 45 MiB + 12 bytes): the chunks wholly inside go, at least 30 MiB of the 40 for any
  // chunk of up to 4 MiB (the device's granularity, 2 MiB on Hopper).
  const size_t before = free_device_bytes();
  const size_t offset = 5 * mib + 12, bytes = 40 * mib;
  const size_t released = buffer->release(offset, bytes);
  const size_t after = free_device_bytes();
  EXPECT_GE(released, 30 * mib);
  EXPECT_LE(released, bytes);
  EXPECT_EQ(buffer->released_bytes(), released);
  EXPECT_GE(after, before + released) << "the device's free memory grows by the chunks given back";
  EXPECT_EQ(buffer->release(offset, bytes), 0u) << "pages already given back are given back once";

  // Outside the chunks given back, every value is where it was: the first and last floats of the range
  // itself, and everything before and after it.
  std::vector<float> head(offset / sizeof(float) + 1), tail(floats - (offset + bytes) / sizeof(float));
  backend->copy_to_host(head.data(), buffer->floats(), head.size() * sizeof(float));
  backend->copy_to_host(tail.data(), buffer->floats() + (offset + bytes) / sizeof(float),
                        tail.size() * sizeof(float));
  for (size_t i = 0; i < head.size(); ++i) ASSERT_EQ(head[i], host[i]) << i;
  for (size_t i = 0; i < tail.size(); ++i) {
    ASSERT_EQ(tail[i], host[(offset + bytes) / sizeof(float) + i]) << i;
  }

  buffer->restore();
  EXPECT_EQ(buffer->released_bytes(), 0u);
  EXPECT_LE(free_device_bytes() + released, after + mib) << "the chunks mapped back take memory again";
  // Mapped back: the whole buffer is written and read again.
  for (size_t i = 0; i < floats; ++i) host[i] = static_cast<float>((i * 7) % 3001);
  backend->copy_from_host(buffer->data(), host.data(), floats * sizeof(float));
  std::vector<float> back(floats);
  backend->copy_to_host(back.data(), buffer->data(), floats * sizeof(float));
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace octet
