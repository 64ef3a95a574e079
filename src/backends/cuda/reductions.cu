// Reductions of a tensor to one value returned to the host (reductions.h): the float64 sum of squares of
// the gradient norm and the check for Inf and NaN. The conventions that every op follows are
// ops_common.cuh's.
#include "reductions.h"

#include <algorithm>

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

}  // namespace octet::cuda
