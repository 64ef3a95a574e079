// What the files of the CUDA backend's element-wise, normalisation, loss and optimizer ops (ops.h, a file per
// family of kernels) share: grid and alignment helpers, the layout of a workspace block, the block sum, the
// bf16 stores, and the grid-stride loop with its element-wise maps. Every kernel built on them mirrors the
// CPU reference (src/backends/cpu/cpu_backend.cpp) operation for operation, with the round-to-nearest
// intrinsics (__fmul_rn, __fadd_rn, ...) wherever the reference rounds a product before adding it: nvcc
// would otherwise contract a * b + c into one FMA and round once where the host rounds twice. Reductions run
// in an order fixed by the shapes (never by the device or by atomics), so every op is bitwise repeatable;
// sums the reference takes in float64 are taken in float64 here too, so they differ from it only in the
// order of float64 additions.
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"

namespace octet::cuda::ops_internal {

using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::Pack;
using elementwise::store_pack;
using elementwise::warp_sum;

inline constexpr int kThreads = 256;       // block size of the flat kernels
inline constexpr size_t kAlignment = 256;  // of each region carved out of a workspace
inline constexpr size_t kDefaultSharedBytes = 48 * 1024;

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline int device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  int value = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// Blocks for a grid-stride loop over `work` items: enough to fill the device, never more than the work.
// The results of the kernels that use it do not depend on the grid size.
inline unsigned flat_grid(int64_t work) {
  thread_local int device = -1;
  thread_local int multiprocessors = 0;
  int current = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, current));
    device = current;
  }
  const int64_t limit = static_cast<int64_t>(multiprocessors) * 16;
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(work, kThreads), 1, std::max<int64_t>(limit, 1)));
}

// Offsets of the regions an op carves out of one workspace block, laid out before the block is asked for:
// a second Workspace::get could move the block under pointers taken from the first.
struct Layout {
  size_t bytes = 0;
  size_t reserve(size_t size) {
    const size_t at = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    bytes = at + size;
    return at;
  }
};

template <typename T>
T* at_offset(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

// ---------------------------------------------------------------------------------------------------------
// Device helpers (Pack, load_pack, store_pack and warp_sum are elementwise.cuh's)

// Sum over the block, returned to every thread. Every thread of the block must call it.
__device__ inline double block_sum(double v) {
  __shared__ double warp_sums[kWarp];
  const unsigned lane = threadIdx.x % kWarp;
  const unsigned warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / kWarp ? warp_sums[lane] : 0.0;
  v = warp_sum(v);
  __syncthreads();  // warp_sums may be reused by the next call
  return v;
}

// The float32 sum and the maximum over a warp, by butterfly: every lane ends with the same bits (each step
// combines the same two values on both lanes, in an order fixed by the lane numbers alone). Every lane of
// the warp must call them. fmaxf passes over a NaN lane.
__device__ __forceinline__ float warp_float_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = __fadd_rn(v, __shfl_xor_sync(elementwise::kFullMask, v, offset));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(elementwise::kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  // round_to_bf16 leaves the BF16 code in the upper half (its NaN is the canonical 0x7FFF).
  return static_cast<uint16_t>(__float_as_uint(round_to_bf16(x)) >> 16);
}

// W consecutive values stored as bf16 (bf16_bits: to nearest, ties to even), one 8-byte store when W is 4
// (the caller guarantees 8-byte alignment).
template <int W>
__device__ __forceinline__ void store_pack(uint16_t* p, const Pack<W>& x) {
  if constexpr (W == 4) {
    uint2 packed;
    packed.x = static_cast<uint32_t>(bf16_bits(x.v[0])) | (static_cast<uint32_t>(bf16_bits(x.v[1])) << 16);
    packed.y = static_cast<uint32_t>(bf16_bits(x.v[2])) | (static_cast<uint32_t>(bf16_bits(x.v[3])) << 16);
    *reinterpret_cast<uint2*>(p) = packed;
  } else {
    *p = bf16_bits(x.v[0]);
  }
}

// A grid-stride loop over n elements: op.template apply<4>(i) for the groups of four (float4 loads, used
// when every pointer is 16-byte aligned and `groups` = n / 4), then op.template apply<1>(i) for the rest.
template <typename Op>
__global__ void __launch_bounds__(kThreads) for_each_kernel(Op op, int64_t groups, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t g = first; g < groups; g += stride) op.template apply<4>(g * 4);
  for (int64_t i = groups * 4 + first; i < n; i += stride) op.template apply<1>(i);
}

// Enqueues for_each_kernel; the caller checks the launch (OCTET_CUDA_CHECK_LAUNCH names the op).
template <typename Op>
void for_each(const Op& op, int64_t n, bool vectorize, cudaStream_t stream) {
  const int64_t groups = vectorize ? n / 4 : 0;
  const int64_t work = groups + (n - groups * 4);
  for_each_kernel<<<flat_grid(work), kThreads, 0, stream>>>(op, groups, n);
}

// out = fn(in) and out = fn(a, b), element-wise, over float32 or bf16 (In = uint16_t) inputs; out is
// float32 (Map1: or bf16, Out = uint16_t, rounded once) and may alias a float32 input.
template <typename Fn, typename In = float, typename Out = float>
struct Map1 {
  Out* out;
  const In* in;
  Fn fn;
  template <int W>
  __device__ void apply(int64_t i) const {
    Pack<W> x = load_pack<W>(in + i);
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = fn(x.v[k]);
    store_pack<W>(out + i, x);
  }
};

template <typename Fn, typename In = float, typename Out = float>
struct Map2 {
  Out* out;
  const In* a;
  const In* b;
  Fn fn;
  template <int W>
  __device__ void apply(int64_t i) const {
    Pack<W> x = load_pack<W>(a + i);
    const Pack<W> y = load_pack<W>(b + i);
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = fn(x.v[k], y.v[k]);
    store_pack<W>(out + i, x);
  }
};

// The precondition of every op that takes a size.
inline void check_size(int64_t n, const char* op) {
  OCTET_CHECK(n >= 0, "{}: a non-negative size, got {}", op, n);
}

}  // namespace octet::cuda::ops_internal
