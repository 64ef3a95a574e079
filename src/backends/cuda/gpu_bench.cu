// `octet bench gemm` on the GPU (see octet/backend/gpu_bench.h): every kind of product octet runs, timed with
// CUDA events through the backend's own GemmEngine on random operands; the device memory bandwidth of a copy
// and of a read-only kernel; and the device memory in use.
#include "octet/backend/gpu_bench.h"

#include <algorithm>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/cuda/gemm.h"

namespace octet {
namespace {

using cuda::Event;
using cuda::GemmType;

// Uniform in [-1, 1) from a counter-based hash (splitmix64's finaliser): the same operands on every run.
__device__ float uniform_at(uint64_t seed, int64_t i) {
  uint64_t x = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

__global__ void fill_random_kernel(void* out, int64_t n, GemmType type, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = uniform_at(seed, i);
    switch (type) {
      case GemmType::e4m3:
        static_cast<__nv_fp8_storage_t*>(out)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        break;
      case GemmType::e5m2:
        static_cast<__nv_fp8_storage_t*>(out)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
        break;
      case GemmType::bf16:
        static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
        break;
      default:  // f32 and tf32 operands are stored as float32
        static_cast<float*>(out)[i] = v;
        break;
    }
  }
}

void fill_random(void* out, int64_t n, GemmType type, uint64_t seed, cudaStream_t stream) {
  const int64_t blocks = std::clamp<int64_t>((n + 255) / 256, 1, 4096);
  fill_random_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, n, type, seed);
  OCTET_CUDA_CHECK_LAUNCH("fill_random_kernel");
}

struct KindTypes {
  GemmType a;
  GemmType b;
  bool fast_accumulation;
};

KindTypes types_of(GemmBenchKind kind) {
  switch (kind) {
    case GemmBenchKind::e4m3:
      return {GemmType::e4m3, GemmType::e4m3, false};
    case GemmBenchKind::e4m3_fast_accumulation:
      return {GemmType::e4m3, GemmType::e4m3, true};
    case GemmBenchKind::e4m3_e5m2:
      return {GemmType::e4m3, GemmType::e5m2, false};
    case GemmBenchKind::e4m3_e5m2_fast_accumulation:
      return {GemmType::e4m3, GemmType::e5m2, true};
    case GemmBenchKind::bf16:
      return {GemmType::bf16, GemmType::bf16, false};
    case GemmBenchKind::tf32:
      return {GemmType::tf32, GemmType::tf32, false};
  }
  return {GemmType::f32, GemmType::f32, false};
}

void require_gpu() {
  OCTET_REQUIRE(cuda::device_count() > 0,
                "no CUDA GPU is visible (no driver, or no device): GPU benchmarks need one");
}

double gib(size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(size_t{1} << 30);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Milliseconds of each of `repeats` runs of `enqueue` (work on `stream`), each between its own pair of
// events.
template <typename Enqueue>
std::vector<double> time_repeats(int64_t repeats, const cuda::Stream& stream, Enqueue enqueue) {
  const Event start, stop;
  std::vector<double> ms_each;
  for (int64_t r = 0; r < repeats; ++r) {
    OCTET_CUDA_CHECK(cudaEventRecord(start.get(), stream.get()));
    enqueue();
    OCTET_CUDA_CHECK(cudaEventRecord(stop.get(), stream.get()));
    OCTET_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    ms_each.push_back(static_cast<double>(ms));
  }
  return ms_each;
}

// Reads x [n4 float4] once with 16-byte loads, four independent loads in flight per thread, and writes one
// partial sum per block: the sum keeps the loads from being optimised away, the writes are negligible.
constexpr int kReadThreads = 256;
__global__ void read_sum_kernel(const float4* x, int64_t n4, float* partial) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float sum = 0.0f;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const float4 a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
    sum += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)) + ((c.x + c.y) + (c.z + c.w)) +
           ((d.x + d.y) + (d.z + d.w));
  }
  for (; i < n4; i += stride) {
    const float4 a = x[i];
    sum += (a.x + a.y) + (a.z + a.w);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  __shared__ float warp_sums[kReadThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float block_sum = 0.0f;
    for (int w = 0; w < kReadThreads / 32; ++w) block_sum += warp_sums[w];
    partial[blockIdx.x] = block_sum;
  }
}

// Largest storage of any kind: float32 operands (TF32) and a float32 output.
size_t bytes_needed(const GemmBenchShape& s) {
  return static_cast<size_t>(s.M * s.K + s.N * s.K + s.M * s.N) * sizeof(float);
}

GemmBenchResult time_kind(cuda::GemmEngine& engine, GemmBenchKind kind, const GemmBenchShape& shape,
                          cuda::DeviceBuffer<uint8_t>& a, cuda::DeviceBuffer<uint8_t>& b,
                          cuda::DeviceBuffer<uint8_t>& d, const float* scale_inv,
                          const GemmBenchSettings& settings, const cuda::Stream& stream) {
  GemmBenchResult result;
  result.kind = kind;
  const KindTypes types = types_of(kind);
  cuda::GemmProblem p;
  p.M = shape.M;
  p.N = shape.N;
  p.K = shape.K;
  p.a_type = types.a;
  p.b_type = types.b;
  p.a = a.data();
  p.b = b.data();
  if (kind == GemmBenchKind::tf32) {
    p.d = reinterpret_cast<float*>(d.data());
  } else {
    p.d_bf16 = reinterpret_cast<__nv_bfloat16*>(d.data());
  }
  if (is_fp8_kind(kind)) {
    // As octet's FP8 GEMMs run: the dequantizing scales read from device memory.
    p.a_scale_inv = scale_inv;
    p.b_scale_inv = scale_inv;
    p.fast_accumulation = types.fast_accumulation;
  }
  result.skipped = engine.can_implement(p);
  if (!result.skipped.empty()) return result;

  fill_random(a.data(), shape.M * shape.K, types.a, 0x5EEDA, stream.get());
  fill_random(b.data(), shape.N * shape.K, types.b, 0x5EEDB, stream.get());
  for (int64_t i = 0; i < settings.warmup_iterations; ++i) engine.run(p, stream.get());

  const auto products = [&]() {
    for (int64_t i = 0; i < settings.iterations; ++i) engine.run(p, stream.get());
  };
  result.median_ms =
      median(time_repeats(settings.repeats, stream, products)) / static_cast<double>(settings.iterations);
  const double flops =
      2.0 * static_cast<double>(shape.M) * static_cast<double>(shape.N) * static_cast<double>(shape.K);
  result.tflops = result.median_ms > 0.0 ? flops / (result.median_ms * 1e-3) / 1e12 : 0.0;
  return result;
}

}  // namespace

std::vector<GemmBenchRow> bench_gemms(const std::vector<GemmBenchShape>& shapes,
                                      const GemmBenchSettings& settings,
                                      const std::function<void(const GemmBenchRow&)>& on_row) {
  for (const GemmBenchShape& s : shapes) {
    OCTET_REQUIRE(s.M >= 1 && s.N >= 1 && s.K >= 1,
                  "a GEMM shape needs M, N and K of at least 1, got {},{},{}", s.M, s.N, s.K);
  }
  OCTET_REQUIRE(
      settings.iterations >= 1 && settings.repeats >= 1 && settings.warmup_iterations >= 0,
      "GEMM benchmark settings: iterations and repeats at least 1, warm-up at least 0; got {}, {}, {}",
      settings.iterations, settings.repeats, settings.warmup_iterations);
  require_gpu();
  OCTET_CUDA_CHECK(cudaSetDevice(0));
  cuda::GemmEngine engine(settings.timed_algorithms ? cuda::GemmAlgorithmChoice::timed
                                                    : cuda::GemmAlgorithmChoice::heuristic);
  const cuda::Stream stream;
  cuda::DeviceBuffer<float> scale_inv(4);
  const float one[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  scale_inv.copy_from_host(one);
  OCTET_CUDA_CHECK(
      cudaDeviceSynchronize());  // a pageable copy may still be in flight; the stream is non-blocking

  std::vector<GemmBenchRow> rows;
  for (const GemmBenchShape& shape : shapes) {
    GemmBenchRow row;
    row.shape = shape;
    size_t free_bytes = 0, total_bytes = 0;
    OCTET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const size_t needed = bytes_needed(shape);
    // Leave room for the engine's plans and the allocator's rounding.
    const bool fits = needed + (size_t{256} << 20) < free_bytes;
    cuda::DeviceBuffer<uint8_t> a, b, d;
    if (fits) {
      a = cuda::DeviceBuffer<uint8_t>(static_cast<size_t>(shape.M * shape.K) * sizeof(float));
      b = cuda::DeviceBuffer<uint8_t>(static_cast<size_t>(shape.N * shape.K) * sizeof(float));
      d = cuda::DeviceBuffer<uint8_t>(static_cast<size_t>(shape.M * shape.N) * sizeof(float));
    }
    for (GemmBenchKind kind : kGemmBenchKinds) {
      if (!fits) {
        GemmBenchResult skipped;
        skipped.kind = kind;
        skipped.skipped = fmt::format("the operands need {:.1f} GiB of device memory, {:.1f} GiB are free",
                                      gib(needed), gib(free_bytes));
        row.results.push_back(std::move(skipped));
        continue;
      }
      row.results.push_back(time_kind(engine, kind, shape, a, b, d, scale_inv.data(), settings, stream));
    }
    if (on_row) on_row(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

BandwidthBenchResult bench_memory_bandwidth(const BandwidthBenchSettings& settings) {
  constexpr size_t kMiB = size_t{1} << 20;
  OCTET_REQUIRE(settings.repeats >= 1 && settings.warmup_iterations >= 0 && settings.bytes >= kMiB,
                "bandwidth benchmark settings: repeats at least 1, warm-up at least 0, buffers of at least "
                "1 MiB; got {}, {}, {} bytes",
                settings.repeats, settings.warmup_iterations, settings.bytes);
  require_gpu();
  OCTET_CUDA_CHECK(cudaSetDevice(0));
  BandwidthBenchResult result;
  size_t free_bytes = 0, total_bytes = 0;
  OCTET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Two buffers, with room left for the allocator's rounding; whole MiB, so that float4 loads cover them.
  const size_t room = free_bytes > (size_t{256} << 20) ? free_bytes - (size_t{256} << 20) : 0;
  const size_t bytes = std::min(settings.bytes, room / 2) / kMiB * kMiB;
  if (bytes < kMiB) {
    result.skipped = fmt::format(
        "two buffers of at least 1 MiB need more than {:.2f} GiB of free device memory", gib(free_bytes));
    return result;
  }
  result.bytes = bytes;
  const cuda::Stream stream;
  const int64_t floats = static_cast<int64_t>(bytes / sizeof(float));
  cuda::DeviceBuffer<float> source(static_cast<size_t>(floats)), destination(static_cast<size_t>(floats));
  // Every page touched before timing; values in [-1, 1) so that the sum stays finite.
  fill_random(source.data(), floats, GemmType::f32, 0x5EEDC, stream.get());
  OCTET_CUDA_CHECK(cudaMemsetAsync(destination.data(), 0, bytes, stream.get()));

  const auto copy = [&]() {
    OCTET_CUDA_CHECK(
        cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  };
  const cuda::DeviceInfo info = cuda::device_info(0);
  // Enough resident blocks to fill every multiprocessor (2048 threads each on recent GPUs).
  const int blocks = std::max(1, info.multiprocessors) * (2048 / kReadThreads);
  cuda::DeviceBuffer<float> partial(static_cast<size_t>(blocks));
  const auto read = [&]() {
    read_sum_kernel<<<static_cast<unsigned>(blocks), kReadThreads, 0, stream.get()>>>(
        reinterpret_cast<const float4*>(source.data()), floats / 4, partial.data());
    OCTET_CUDA_CHECK_LAUNCH("read_sum_kernel");
  };
  for (int64_t i = 0; i < settings.warmup_iterations; ++i) {
    copy();
    read();
  }
  const double bytes_d = static_cast<double>(bytes);
  result.copy_median_ms = median(time_repeats(settings.repeats, stream, copy));
  result.read_median_ms = median(time_repeats(settings.repeats, stream, read));
  result.copy_gbs = result.copy_median_ms > 0.0 ? 2.0 * bytes_d / (result.copy_median_ms * 1e-3) / 1e9 : 0.0;
  result.read_gbs = result.read_median_ms > 0.0 ? bytes_d / (result.read_median_ms * 1e-3) / 1e9 : 0.0;
  return result;
}

DeviceMemoryUse device_memory_in_use(int device) {
  require_gpu();
  OCTET_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  OCTET_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {total_bytes - free_bytes, total_bytes};
}

}  // namespace octet
