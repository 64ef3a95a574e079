// Tests of the CUDA backend's device layer: discovery, properties, the error check and the memory owner.
// The first three need no GPU (they hold device_count and the error path to their promises on any machine);
// the rest skip without one.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "octet/check.h"
#include "octet/cuda/device.h"

namespace {

using octet::cuda::DeviceBuffer;
using octet::cuda::DeviceInfo;

TEST(CudaDevice, CountNeverThrows) {
  // On a machine without a driver or a GPU this is where a careless implementation throws or aborts.
  int count = -1;
  EXPECT_NO_THROW(count = octet::cuda::device_count());
  EXPECT_GE(count, 0);
  // Why CUDA sees what it sees (e.g. cudaErrorInsufficientDriver: the driver predates the CUDA runtime that
  // is linked in), for the log of a run where the GPU tests skipped unexpectedly.
  int raw_count = 0;
  const cudaError_t status = cudaGetDeviceCount(&raw_count);
  std::printf("cudaGetDeviceCount: %s, %d devices\n", cudaGetErrorName(status),
              status == cudaSuccess ? raw_count : 0);
  (void)cudaGetLastError();
}

TEST(CudaDevice, CheckThrowsNamingCallErrorFileAndLine) {
  try {
    OCTET_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "OCTET_CUDA_CHECK did not throw";
  } catch (const octet::Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.kind(), octet::ErrorKind::internal);
    EXPECT_NE(message.find("cudaErrorInvalidValue"), std::string::npos) << message;  // the call and the error
    EXPECT_NE(message.find("test_device.cpp:"), std::string::npos) << message;
  }
}

TEST(CudaDevice, Fp8TensorCoresFromComputeCapability8Point9) {
  const auto with = [](int major, int minor) {
    DeviceInfo info;
    info.compute_major = major;
    info.compute_minor = minor;
    return octet::cuda::has_fp8_tensor_cores(info);
  };
  EXPECT_FALSE(with(7, 5));
  EXPECT_FALSE(with(8, 0));
  EXPECT_FALSE(with(8, 6));
  EXPECT_TRUE(with(8, 9));
  EXPECT_TRUE(with(9, 0));
  EXPECT_TRUE(with(10, 0));
  EXPECT_TRUE(with(12, 0));
}

TEST(CudaDevice, InfoDescribesARealDevice) {
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const DeviceInfo info = octet::cuda::device_info(0);
  std::printf("device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB, FP8 tensor cores: %s\n",
              info.name.c_str(), info.compute_major, info.compute_minor, info.multiprocessors,
              static_cast<double>(info.total_memory_bytes) / (1024.0 * 1024.0 * 1024.0),
              octet::cuda::has_fp8_tensor_cores(info) ? "yes" : "no");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.compute_major, 8);  // the build targets sm_80 and sm_90a
  EXPECT_GT(info.multiprocessors, 0);
  EXPECT_GT(info.total_memory_bytes, size_t{0});
  EXPECT_THROW(octet::cuda::device_info(octet::cuda::device_count()), octet::Error);
}

TEST(CudaDevice, BufferRoundTripsAndMoves) {
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::vector<float> values = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f};
  DeviceBuffer<float> a(values.size());
  EXPECT_EQ(a.size(), values.size());
  EXPECT_EQ(a.bytes(), values.size() * sizeof(float));
  a.copy_from_host(values);
  const float* device_pointer = a.data();

  DeviceBuffer<float> b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(a.size(), size_t{0});
  EXPECT_EQ(b.data(), device_pointer);

  DeviceBuffer<float> c(3);
  c = std::move(b);  // frees c's old memory
  EXPECT_EQ(c.data(), device_pointer);
  std::vector<float> back(values.size());
  c.copy_to_host(back);
  EXPECT_EQ(back, values);

  DeviceBuffer<float> empty(0);
  EXPECT_EQ(empty.data(), nullptr);
}

TEST(CudaDevice, StreamOwnsAStream) {
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  octet::cuda::Stream s;
  EXPECT_NE(s.get(), nullptr);
  octet::cuda::Stream t(std::move(s));
  EXPECT_NE(t.get(), nullptr);
  EXPECT_NO_THROW(t.synchronize());
}

}  // namespace
