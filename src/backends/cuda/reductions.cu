// Reductions of a tensor to values returned to the host (reductions.h): the float64 sum of squares of the
// gradient norm, the check for Inf and NaN, and the counts of magnitudes a calibration reads. The conventions that every op follows are
// ops_common.cuh's.
#include "reductions.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_pack;
using elementwise::Pack;
using ops_internal::aligned16;
using ops_internal::at_offset;
using ops_internal::block_sum;
using ops_internal::ceil_div;
using ops_internal::check_size;
using ops_internal::for_each;
using ops_internal::kThreads;
using ops_internal::Layout;

// Blocks of the sum of squares: from n alone, so that the order of additions is the same everywhere.
constexpr int64_t kSumBlocks = 1024;

int64_t sum_blocks(int64_t n) {
  return std::clamp<int64_t>(ceil_div(n, kThreads * 8), 1, kSumBlocks);
}

// x as float32 or as bf16 bits (load_pack widens them): the same order of additions for the same n and W.
template <int W, typename T>
__global__ void __launch_bounds__(kThreads) sum_of_squares_kernel(const T* x, int64_t n, double* block_sums) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = n / W;
  double acc = 0.0;
  for (int64_t g = first; g < groups; g += stride) {
    const Pack<W> p = load_pack<W>(x + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double d = static_cast<double>(p.v[k]);
      acc = __dadd_rn(acc, __dmul_rn(d, d));
    }
  }
  for (int64_t i = groups * W + first; i < n; i += stride) {
    const double d = static_cast<double>(load_pack<1>(x + i).v[0]);
    acc = __dadd_rn(acc, __dmul_rn(d, d));
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(kThreads)
    sum_blocks_kernel(const double* block_sums, int64_t count, double* total) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc = __dadd_rn(acc, block_sums[i]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) *total = acc;
}

// Sets *flag when some element is Inf or NaN (every writer stores the same value, so no atomics).
struct FindNonFinite {
  const float* x;
  int* flag;
  template <int W>
  __device__ void apply(int64_t i) const {
    const Pack<W> p = load_pack<W>(x + i);
    bool finite = true;
#pragma unroll
    for (int k = 0; k < W; ++k) finite = finite && (__float_as_uint(p.v[k]) & 0x7F800000u) != 0x7F800000u;
    if (!finite) *flag = 1;
  }
};

template <typename T>
double sum_of_squares_of(const T* x, int64_t n, Workspace& workspace, cudaStream_t stream) {
  check_size(n, "sum_of_squares");
  if (n == 0) return 0.0;
  const int64_t blocks = sum_blocks(n);
  Layout layout;
  const size_t block_sums_at = layout.reserve(static_cast<size_t>(blocks) * sizeof(double));
  const size_t total_at = layout.reserve(sizeof(double));
  void* base = workspace.get(layout.bytes, stream);
  auto* block_sums = at_offset<double>(base, block_sums_at);
  auto* total = at_offset<double>(base, total_at);
  if (elementwise::pack_aligned(x)) {
    sum_of_squares_kernel<4, T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, block_sums);
  } else {
    sum_of_squares_kernel<1, T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, block_sums);
  }
  OCTET_CUDA_CHECK_LAUNCH("sum_of_squares_kernel");
  sum_blocks_kernel<<<1, kThreads, 0, stream>>>(block_sums, blocks, total);
  OCTET_CUDA_CHECK_LAUNCH("sum_blocks_kernel");
  auto* host = static_cast<double*>(workspace.host());
  OCTET_CUDA_CHECK(cudaMemcpyAsync(host, total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *host;
}

// The float32 bits of |x| (bf16 bits widened).
__device__ inline uint32_t magnitude_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }
__device__ inline uint32_t magnitude_bits(uint16_t v) { return (static_cast<uint32_t>(v) << 16) & 0x7FFFFFFFu; }

constexpr int kMagnitudeBins = static_cast<int>(MagnitudeCounts::kBins);
constexpr int kMagnitudeShift = 23 - MagnitudeCounts::kMantissaBits;

// Each block counts its part of x into bins in shared memory, then adds the non-empty ones to the global
// bins. `totals` holds the zeros, the non-finite values and the amax's bits (non-negative floats order as
// their bits).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    count_magnitudes_kernel(const T* x, int64_t n, unsigned long long* bins, unsigned long long* totals) {
  __shared__ unsigned int local[kMagnitudeBins];
  __shared__ unsigned int block_zeros, block_non_finite, block_amax;
  for (int i = threadIdx.x; i < kMagnitudeBins; i += blockDim.x) local[i] = 0;
  if (threadIdx.x == 0) {
    block_zeros = 0;
    block_non_finite = 0;
    block_amax = 0;
  }
  __syncthreads();
  unsigned int zeros = 0, non_finite = 0, amax = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t m = magnitude_bits(x[i]);
    if (m == 0) {
      ++zeros;
    } else if (m >= 0x7F800000u) {
      ++non_finite;
    } else {
      atomicAdd(&local[m >> kMagnitudeShift], 1u);
      amax = max(amax, m);
    }
  }
  if (zeros != 0) atomicAdd(&block_zeros, zeros);
  if (non_finite != 0) atomicAdd(&block_non_finite, non_finite);
  if (amax != 0) atomicMax(&block_amax, amax);
  __syncthreads();
  for (int i = threadIdx.x; i < kMagnitudeBins; i += blockDim.x) {
    if (local[i] != 0) atomicAdd(&bins[i], static_cast<unsigned long long>(local[i]));
  }
  if (threadIdx.x == 0) {
    atomicAdd(&totals[0], static_cast<unsigned long long>(block_zeros));
    atomicAdd(&totals[1], static_cast<unsigned long long>(block_non_finite));
    atomicMax(&totals[2], static_cast<unsigned long long>(block_amax));
  }
}

template <typename T>
void count_magnitudes_of(MagnitudeCounts& counts, const T* x, int64_t n, Workspace& workspace,
                         cudaStream_t stream) {
  check_size(n, "count_magnitudes");
  if (n == 0) return;
  constexpr size_t kWords = MagnitudeCounts::kBins + 3;
  auto* device = static_cast<unsigned long long*>(workspace.get(kWords * sizeof(uint64_t), stream));
  OCTET_CUDA_CHECK(cudaMemsetAsync(device, 0, kWords * sizeof(uint64_t), stream));
  const int64_t blocks = std::clamp<int64_t>(ceil_div(n, kThreads * 16), 1, 1024);
  OCTET_CHECK(ceil_div(n, blocks) <= int64_t{0xFFFFFFFF},
              "count_magnitudes: at most 2^32 values a block of 1024 (32-bit shared bins), got {} values", n);
  count_magnitudes_kernel<T>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, device, device + MagnitudeCounts::kBins);
  OCTET_CUDA_CHECK_LAUNCH("count_magnitudes_kernel");
  std::vector<uint64_t> host(kWords);
  OCTET_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), device, kWords * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t b = 0; b < MagnitudeCounts::kBins; ++b) counts.bins[b] += host[b];
  counts.values += n;
  counts.zeros += static_cast<int64_t>(host[MagnitudeCounts::kBins]);
  counts.non_finite += static_cast<int64_t>(host[MagnitudeCounts::kBins + 1]);
  const float amax = std::bit_cast<float>(static_cast<uint32_t>(host[MagnitudeCounts::kBins + 2]));
  counts.amax = std::max(counts.amax, amax);
}

}  // namespace

double sum_of_squares(const float* x, int64_t n, Workspace& workspace, cudaStream_t stream) {
  return sum_of_squares_of(x, n, workspace, stream);
}

double sum_of_squares(const uint16_t* x, int64_t n, Workspace& workspace, cudaStream_t stream) {
  return sum_of_squares_of(x, n, workspace, stream);
}

bool all_finite(const float* x, int64_t n, Workspace& workspace, cudaStream_t stream) {
  check_size(n, "all_finite");
  if (n == 0) return true;
  auto* flag = static_cast<int*>(workspace.get(sizeof(int), stream));
  OCTET_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  for_each(FindNonFinite{x, flag}, n, aligned16(x), stream);
  OCTET_CUDA_CHECK_LAUNCH("all_finite");
  auto* host = static_cast<int*>(workspace.host());
  OCTET_CUDA_CHECK(cudaMemcpyAsync(host, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *host == 0;
}

void count_magnitudes(MagnitudeCounts& counts, const float* x, int64_t n, Workspace& workspace,
                      cudaStream_t stream) {
  count_magnitudes_of(counts, x, n, workspace, stream);
}

void count_magnitudes(MagnitudeCounts& counts, const uint16_t* x, int64_t n, Workspace& workspace,
                      cudaStream_t stream) {
  count_magnitudes_of(counts, x, n, workspace, stream);
}

}  // namespace octet::cuda
