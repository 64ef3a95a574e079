// The CUDA backend's element-wise, normalisation, loss and optimizer kernels (see ops.h) and their
// launchers. Each kernel mirrors the CPU reference (src/backends/cpu/cpu_backend.cpp) operation for
// operation, with the round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...) wherever the reference rounds
// a product before adding it: nvcc would otherwise contract a * b + c into one FMA and round once where the
// host rounds twice. Reductions run in an order fixed by the shapes (never by the device or by atomics), so
// every op is bitwise repeatable; sums the reference takes in float64 are taken in float64 here too, so they
// differ from it only in the order of float64 additions.
#include "ops.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include <cub/device/device_radix_sort.cuh>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"

namespace octet::cuda {
namespace {

using elementwise::kFullMask;
using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::Pack;
using elementwise::store_pack;
using elementwise::warp_sum;

constexpr int kThreads = 256;       // block size of the flat kernels
constexpr size_t kAlignment = 256;  // of each region carved out of a workspace
constexpr size_t kDefaultSharedBytes = 48 * 1024;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  int value = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// Blocks for a grid-stride loop over `work` items: enough to fill the device, never more than the work.
// The results of the kernels that use it do not depend on the grid size.
unsigned flat_grid(int64_t work) {
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
__device__ double block_sum(double v) {
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

struct Add {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct Multiply {
  float factor;
  __device__ float operator()(float x) const { return __fmul_rn(x, factor); }
};
struct RoundBf16 {
  __device__ float operator()(float x) const { return round_to_bf16(x); }
};
struct RoundF16 {
  __device__ float operator()(float x) const { return round_to_f16(x); }
};

// ---------------------------------------------------------------------------------------------------------
// GELU: the reference's expressions, evaluated left to right as C++ groups them. The forward value and the
// gradient are elementwise.cuh's, shared with the fused GELU casts.

struct Gelu {
  __device__ float operator()(float x) const { return elementwise::gelu(x); }
};

// gelu'(x) * dout
struct GeluGradient {
  __device__ float operator()(float x, float dout) const { return elementwise::gelu_gradient(x, dout); }
};

// ---------------------------------------------------------------------------------------------------------
// Embeddings

struct EncoderForward {
  float* out;
  const int32_t* tokens;
  const float* wte;
  const float* wpe;
  int64_t T;
  int64_t C;
  // With W = 4, C is a multiple of 4, so the group lies in one row.
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t row = i / C;
    const int64_t c = i - row * C;
    const int64_t t = row % T;
    const Pack<W> e = load_pack<W>(wte + static_cast<int64_t>(tokens[row]) * C + c);
    Pack<W> p = load_pack<W>(wpe + t * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) p.v[k] = __fadd_rn(e.v[k], p.v[k]);
    store_pack<W>(out + i, p);
  }
};

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ...: the reference's order. Element i of dwpe [T*C] gathers
// element b*T*C + i of dout, so groups of four stay aligned when T*C is a multiple of 4.
struct EncoderBackwardPosition {
  float* dwpe;
  const float* dout;
  int64_t B;
  int64_t TC;
  template <int W>
  __device__ void apply(int64_t i) const {
    Pack<W> acc = load_pack<W>(dwpe + i);
    for (int64_t b = 0; b < B; ++b) {
      const Pack<W> d = load_pack<W>(dout + b * TC + i);
#pragma unroll
      for (int k = 0; k < W; ++k) acc.v[k] = __fadd_rn(acc.v[k], d.v[k]);
    }
    store_pack<W>(dwpe + i, acc);
  }
};

__global__ void iota_kernel(int32_t* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = i;
}

// One block per sorted position; the block at the start of a token's run adds the run's rows of dout into
// that token's row of dwte in position order, i.e. in the reference's (b, t) order (the sort is stable).
// blockIdx.y picks a chunk of channels.
template <int W>
__global__ void encoder_backward_token_kernel(float* dwte, const float* dout, const int32_t* sorted_tokens,
                                              const int32_t* sorted_positions, int n, int64_t C) {
  const int first = static_cast<int>(blockIdx.x);
  const int32_t token = sorted_tokens[first];
  if (first > 0 && sorted_tokens[first - 1] == token) return;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  if (c >= C) return;
  // The run's end by binary search, so that the loop below has a known trip count and its loads can be
  // issued ahead of the (ordered) additions: a frequent token's run can be thousands of positions long.
  int low = first + 1;
  int high = n;
  while (low < high) {
    const int middle = low + (high - low) / 2;
    if (sorted_tokens[middle] == token) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  const int end = low;
  float* e = dwte + static_cast<int64_t>(token) * C + c;
  Pack<W> acc = load_pack<W>(e);
#pragma unroll 8
  for (int j = first; j < end; ++j) {
    const Pack<W> d = load_pack<W>(dout + static_cast<int64_t>(sorted_positions[j]) * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) acc.v[k] = __fadd_rn(acc.v[k], d.v[k]);
  }
  store_pack<W>(e, acc);
}

// ---------------------------------------------------------------------------------------------------------
// Column sums over rows: out[c] += sum over r of x[r * ld + c], in an order that depends on the shape only.
// Stage one: blocks of kColumnTile x kColumnLanes threads, each thread owning the columns of one 16-byte
// load (4 float32 or 8 bf16 values; one vector load per row where the layout allows, scalar loads otherwise:
// the same sums), one block per (tile of columns, split of the rows). Row lane y sums rows begin + y,
// begin + y + kColumnLanes, ... in order, and the lanes are added in order. With one split the block adds
// straight into out; otherwise stage two adds each column's split totals: its lane y sums splits y,
// y + kColumnLanes, ... in order, and the lanes are added in order. The splits come from the shape alone
// (plan_column_sum), so that the order is the same for float32 and bf16 inputs and for any alignment. With
// Copy (float32 inputs), each element read is also written to copy (same layout) rounded to bf16, which
// changes nothing in the sums. Few rows (at most kColumnShortRows: the tile sums of the fused casts, the
// block sums of LayerNorm's backward) take one launch instead of two: a thread per column and row lane,
// kColumnShortLanes lanes, lane y summing rows y, y + kColumnShortLanes, ... in order and the lanes added in
// order into out (column_lanes_kernel, which is stage two's kernel too, over the split totals).

constexpr int kColumnTile = 32;                // threads across a block
constexpr int kColumnLanes = 8;                // threads down a block
constexpr int kColumnUnroll = 4;               // rows per thread in flight
constexpr int64_t kColumnTargetBlocks = 1024;  // of float32 values; half as many of bf16
constexpr int64_t kColumnMaxSplits = 128;
constexpr int64_t kColumnPlanTile = 128;  // columns per block of float32 values, in the plan for every type
constexpr int kColumnShortLanes = 32;     // threads down a block, few rows
constexpr int64_t kColumnShortRows = 32 * kColumnShortLanes;  // at most 32 rows per thread

// Columns per thread: one 16-byte load.
template <typename T>
__host__ __device__ constexpr int column_width() {
  return static_cast<int>(16 / sizeof(T));
}
constexpr int kColumnMaxBlockColumns = kColumnTile * column_width<uint16_t>();

struct ColumnSumPlan {
  bool short_rows = false;  // one launch of column_lanes_kernel; rows_per_split and splits unused
  int64_t rows_per_split = 0;
  int64_t splits = 0;
  size_t scratch_floats(int64_t cols) const {
    return !short_rows && splits > 1 ? static_cast<size_t>(splits * cols) : 0;
  }
};

// Depends on the shape only, so the order of additions is the same on every device and for every layout
// of the same shape (float32 or bf16, aligned or not).
ColumnSumPlan plan_column_sum(int64_t rows, int64_t cols) {
  const int64_t tiles = ceil_div(cols, kColumnPlanTile);
  int64_t splits = std::clamp<int64_t>(ceil_div(kColumnTargetBlocks, tiles), 1, kColumnMaxSplits);
  splits = std::max<int64_t>(1, std::min(splits, ceil_div(rows, kColumnUnroll * kColumnLanes)));
  ColumnSumPlan plan;
  plan.short_rows = rows <= kColumnShortRows;
  plan.rows_per_split = ceil_div(rows, splits);
  plan.splits = ceil_div(rows, plan.rows_per_split);
  return plan;
}

// A float32 value, or a bf16 one (its bits) widened: the sums of bf16 values are those of their float32
// values.
__device__ __forceinline__ float column_value(const float* x, int64_t i) {
  return x[i];
}
__device__ __forceinline__ float column_value(const uint16_t* x, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

// The values of a thread's columns in one row (zeros past the last column).
template <bool Vector, typename T>
__device__ __forceinline__ Pack<column_width<T>()> column_load(const T* x, int64_t i, int64_t columns_left) {
  constexpr int W = column_width<T>();
  Pack<W> p;
  if constexpr (Vector && W == 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(x + i);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      p.v[2 * k] = __uint_as_float(words[k] << 16);
      p.v[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
  } else if constexpr (Vector) {
    p = load_pack<W>(x + i);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) p.v[k] = k < columns_left ? column_value(x, i + k) : 0.0f;
  }
  return p;
}
// The bf16 copy of a float32 thread's values.
template <bool Vector>
__device__ __forceinline__ void column_copy(uint16_t* copy, int64_t i, const Pack<4>& p,
                                            int64_t columns_left) {
  if constexpr (Vector) {
    store_pack<4>(copy + i, p);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < columns_left) copy[i + k] = bf16_bits(p.v[k]);
    }
  }
}

template <bool Direct, bool Copy, bool Vector, typename T>
__global__ void __launch_bounds__(kColumnTile* kColumnLanes)
    column_sum_kernel(const T* x, int64_t ld, int64_t rows, int64_t cols, int64_t rows_per_split, float* out,
                      uint16_t* copy) {
  constexpr int W = column_width<T>();
  constexpr int kBlockColumns = kColumnTile * W;
  static_assert(!Copy || W == 4, "the bf16 copy is of float32 values");
  __shared__ float lane_sums[kColumnLanes][kBlockColumns];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x) * W;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t end = rows < begin + rows_per_split ? rows : begin + rows_per_split;
  const int64_t left = cols - c;
  Pack<W> acc{};
  if (left > 0) {
    int64_t r = begin + threadIdx.y;
    for (; r + (kColumnUnroll - 1) * kColumnLanes < end; r += kColumnUnroll * kColumnLanes) {
      Pack<W> v[kColumnUnroll];
#pragma unroll
      for (int u = 0; u < kColumnUnroll; ++u)
        v[u] = column_load<Vector>(x, (r + u * kColumnLanes) * ld + c, left);
#pragma unroll
      for (int u = 0; u < kColumnUnroll; ++u) {
        if constexpr (Copy) column_copy<Vector>(copy, (r + u * kColumnLanes) * ld + c, v[u], left);
#pragma unroll
        for (int k = 0; k < W; ++k) acc.v[k] = __fadd_rn(acc.v[k], v[u].v[k]);
      }
    }
    for (; r < end; r += kColumnLanes) {
      const Pack<W> v = column_load<Vector>(x, r * ld + c, left);
      if constexpr (Copy) column_copy<Vector>(copy, r * ld + c, v, left);
#pragma unroll
      for (int k = 0; k < W; ++k) acc.v[k] = __fadd_rn(acc.v[k], v.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) lane_sums[threadIdx.y][threadIdx.x * W + k] = acc.v[k];
  __syncthreads();
  const int j = static_cast<int>(threadIdx.y * kColumnTile + threadIdx.x);  // this block's column j
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kBlockColumns + j;
  if (j >= kBlockColumns || column >= cols) return;
  float total = lane_sums[0][j];
#pragma unroll
  for (int k = 1; k < kColumnLanes; ++k) total = __fadd_rn(total, lane_sums[k][j]);
  if constexpr (Direct) {
    out[column] = __fadd_rn(out[column], total);
  } else {
    out[blockIdx.y * cols + column] = total;
  }
}
static_assert(kColumnMaxBlockColumns <= kColumnTile * kColumnLanes, "one thread per column in the combine");

// out[c] += the sum of x[r * ld + c] over rows r, by Lanes row lanes of kColumnTile columns: lane y sums rows
// y, y + Lanes, ... in order (the loads of several rows in flight), then the lanes are added in order. With
// Copy (float32 x), each value read is also written to copy rounded to bf16.
template <int Lanes, bool Copy, typename T>
__global__ void __launch_bounds__(kColumnTile* Lanes)
    column_lanes_kernel(const T* x, int64_t ld, int64_t rows, int64_t cols, float* out, uint16_t* copy) {
  __shared__ float lane_sums[Lanes][kColumnTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  float acc = 0.0f;
  if (c < cols) {
    // Unrolled so that the loads are in flight together; the additions stay in row order.
#pragma unroll 8
    for (int64_t r = threadIdx.y; r < rows; r += Lanes) {
      const float v = column_value(x, r * ld + c);
      if constexpr (Copy) copy[r * ld + c] = bf16_bits(v);
      acc = __fadd_rn(acc, v);
    }
  }
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float total = lane_sums[0][threadIdx.x];
#pragma unroll
  for (int k = 1; k < Lanes; ++k) total = __fadd_rn(total, lane_sums[k][threadIdx.x]);
  out[c] = __fadd_rn(out[c], total);
}

// scratch: plan.scratch_floats(cols) floats. copy: null, or [rows, ld] bf16 for x's values.
template <typename T>
void column_sum(const T* x, int64_t ld, int64_t rows, int64_t cols, float* out, const ColumnSumPlan& plan,
                float* scratch, cudaStream_t stream, uint16_t* copy = nullptr) {
  if (rows == 0 || cols == 0) return;
  const auto column_tiles = static_cast<unsigned>(ceil_div(cols, kColumnTile));
  if (plan.short_rows) {
    const dim3 lanes(kColumnTile, kColumnShortLanes);
    if constexpr (std::is_same_v<T, float>) {
      if (copy != nullptr) {
        column_lanes_kernel<kColumnShortLanes, true>
            <<<column_tiles, lanes, 0, stream>>>(x, ld, rows, cols, out, copy);
        OCTET_CUDA_CHECK_LAUNCH("column_lanes_kernel");
        return;
      }
    } else {
      OCTET_CHECK(copy == nullptr, "column_sum: a bf16 copy is of float32 values");
    }
    column_lanes_kernel<kColumnShortLanes, false>
        <<<column_tiles, lanes, 0, stream>>>(x, ld, rows, cols, out, nullptr);
    OCTET_CUDA_CHECK_LAUNCH("column_lanes_kernel");
    return;
  }
  const dim3 block(kColumnTile, kColumnLanes);
  constexpr int W = column_width<T>();
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kColumnTile * W)), static_cast<unsigned>(plan.splits));
  const bool vector = cols % W == 0 && ld % W == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      (copy == nullptr || elementwise::pack_aligned(copy));
  float* target = plan.splits == 1 ? out : scratch;
  auto launch = [&](auto direct, auto with_copy, auto vectorised) {
    column_sum_kernel<decltype(direct)::value, decltype(with_copy)::value, decltype(vectorised)::value>
        <<<grid, block, 0, stream>>>(x, ld, rows, cols, plan.rows_per_split, target, copy);
    OCTET_CUDA_CHECK_LAUNCH("column_sum_kernel");
  };
  auto with_layout = [&](auto direct, auto with_copy) {
    vector ? launch(direct, with_copy, std::true_type{}) : launch(direct, with_copy, std::false_type{});
  };
  auto with_copy = [&](auto direct) {
    if constexpr (std::is_same_v<T, float>) {
      if (copy != nullptr) return with_layout(direct, std::true_type{});
    } else {
      OCTET_CHECK(copy == nullptr, "column_sum: a bf16 copy is of float32 values");
    }
    with_layout(direct, std::false_type{});
  };
  if (plan.splits == 1) {
    with_copy(std::true_type{});
    return;
  }
  with_copy(std::false_type{});
  column_lanes_kernel<kColumnLanes, false, float>
      <<<column_tiles, block, 0, stream>>>(scratch, cols, plan.splits, cols, out, nullptr);
  OCTET_CUDA_CHECK_LAUNCH("column_lanes_kernel");
}

// ---------------------------------------------------------------------------------------------------------
// LayerNorm: one warp per row. The row's statistics are float64 sums, as in the reference; the row is read
// once per pass and stays in L1 between passes. The forward arithmetic is elementwise.cuh's, shared with the
// fused LayerNorm cast.

constexpr int kLayernormForwardWarps = kThreads / kWarp;
constexpr int kLayernormBackwardWarps = 4;       // per block, each with its own dweight/dbias partials
constexpr int kLayernormBackwardHeldBlocks = 4;  // the held-row kernel's blocks a multiprocessor must hold

// Out: float, or uint16_t for bf16 (the float32 value rounded once).
template <int W, typename Out>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(Out* out, float* mean, float* rstd, const float* inp, const float* weight,
                             const float* bias, int64_t N, int64_t C) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kLayernormForwardWarps + threadIdx.x / kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const elementwise::RowStatistics r = elementwise::layernorm_statistics<W>(x, C, lane);
  Out* o = out + row * C;
  for (int64_t i = lane * W; i < C; i += kWarp * W)
    store_pack<W>(o + i, elementwise::layernorm_normalise<W>(x, weight, bias, i, r));
  if (lane == 0) {
    mean[row] = r.mean;
    rstd[row] = r.rstd;
  }
}

// The steps of LayerNorm's backward shared by its streaming and held-row kernels, on W elements of a row
// (dp, xp, wp: dout, inp and weight there). The first pass adds their dnorm and dnorm * norm terms into the
// lane's float64 sums; the second updates dinp there (di) and the warp's dweight and dbias partials.
template <int W>
__device__ __forceinline__ void layernorm_backward_sums(const Pack<W>& dp, const Pack<W>& xp,
                                                        const Pack<W>& wp, float m, float s,
                                                        double& dnorm_sum, double& dnorm_norm_sum) {
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float norm = __fmul_rn(__fsub_rn(xp.v[k], m), s);
    const float dnorm = __fmul_rn(wp.v[k], dp.v[k]);
    dnorm_sum = __dadd_rn(dnorm_sum, static_cast<double>(dnorm));
    dnorm_norm_sum =
        __dadd_rn(dnorm_norm_sum, __dmul_rn(static_cast<double>(dnorm), static_cast<double>(norm)));
  }
}
template <int W>
__device__ __forceinline__ void layernorm_backward_update(const Pack<W>& dp, const Pack<W>& xp,
                                                          const Pack<W>& wp, float m, float s, float a,
                                                          float b, float* di, float* dweight_acc,
                                                          float* dbias_acc) {
  Pack<W> gp = load_pack<W>(di);
  Pack<W> bias_acc = load_pack<W>(dbias_acc);
  Pack<W> weight_acc = load_pack<W>(dweight_acc);
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float norm = __fmul_rn(__fsub_rn(xp.v[k], m), s);
    const float dnorm = __fmul_rn(wp.v[k], dp.v[k]);
    bias_acc.v[k] = __fadd_rn(bias_acc.v[k], dp.v[k]);
    weight_acc.v[k] = __fadd_rn(weight_acc.v[k], __fmul_rn(norm, dp.v[k]));
    const float centred = __fsub_rn(__fsub_rn(dnorm, a), __fmul_rn(norm, b));
    gp.v[k] = __fadd_rn(gp.v[k], __fmul_rn(centred, s));
  }
  store_pack<W>(di, gp);
  store_pack<W>(dbias_acc, bias_acc);
  store_pack<W>(dweight_acc, weight_acc);
}
// The block's partials: its warps' [2][C] partials in shared memory, added in warp order, to
// partials[blockIdx.x]. Every thread of the block must call it.
__device__ __forceinline__ void write_block_partials(float* partials, const float* warp_partials, int warps,
                                                     int64_t C) {
  __syncthreads();
  float* block_partials = partials + static_cast<int64_t>(blockIdx.x) * 2 * C;
  for (int64_t i = threadIdx.x; i < 2 * C; i += blockDim.x) {
    float total = warp_partials[i];
    for (int w = 1; w < warps; ++w) total = __fadd_rn(total, warp_partials[w * 2 * C + i]);
    block_partials[i] = total;
  }
}

// A warp's place in a LayerNorm backward block: the block's warps, this warp and lane, and this warp's own
// partials in shared memory (dweight's [C], then dbias's [C]), which this zeroes for the whole block: every
// thread of the block must call it.
struct LayernormBackwardWarp {
  int warps;
  int warp;
  int lane;
  float* dweight_acc;
  float* dbias_acc;
};
__device__ __forceinline__ LayernormBackwardWarp layernorm_backward_warp(float* warp_partials, int64_t C) {
  const int warps = static_cast<int>(blockDim.x / kWarp);
  const int warp = static_cast<int>(threadIdx.x / kWarp);
  for (int64_t i = threadIdx.x; i < warps * 2 * C; i += blockDim.x) warp_partials[i] = 0.0f;
  __syncthreads();
  float* dweight_acc = warp_partials + warp * 2 * C;
  return {warps, warp, static_cast<int>(threadIdx.x % kWarp), dweight_acc, dweight_acc + C};
}

// Accumulates dinp row by row; each warp adds its rows' dweight and dbias terms into its own partials in
// shared memory ([warps][2][C]: dweight, then dbias), each lane always touching the same columns. The block
// then adds its warps' partials in order and writes them to partials [gridDim.x][2][C].
template <int W, typename Dout>
__global__ void __launch_bounds__(kLayernormBackwardWarps* kWarp)
    layernorm_backward_kernel(float* dinp, float* partials, const Dout* dout, const float* inp,
                              const float* weight, const float* mean, const float* rstd, int64_t N,
                              int64_t C) {
  extern __shared__ float warp_partials[];
  const auto [warps, warp, lane, dweight_acc, dbias_acc] = layernorm_backward_warp(warp_partials, C);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const Dout* d = dout + row * C;
    const float* x = inp + row * C;
    const float m = mean[row];
    const float s = rstd[row];
    double dnorm_sum = 0.0;
    double dnorm_norm_sum = 0.0;
    float* di = dinp + row * C;
    // Four iterations' loads in flight (no store in this loop to order them after); the second loop's dinp,
    // which nothing has read yet, fetched into L2 meanwhile.
#pragma unroll 4
    for (int64_t i = lane * W; i < C; i += kWarp * W) {
      asm volatile("prefetch.global.L2 [%0];" : : "l"(di + i));
      layernorm_backward_sums<W>(load_pack<W>(d + i), load_pack<W>(x + i), load_pack<W>(weight + i), m, s,
                                 dnorm_sum, dnorm_norm_sum);
    }
    const float a = static_cast<float>(warp_sum(dnorm_sum) / static_cast<double>(C));
    const float b = static_cast<float>(warp_sum(dnorm_norm_sum) / static_cast<double>(C));
    for (int64_t i = lane * W; i < C; i += kWarp * W) {
      layernorm_backward_update<W>(load_pack<W>(d + i), load_pack<W>(x + i), load_pack<W>(weight + i), m, s,
                                   a, b, di + i, dweight_acc + i, dbias_acc + i);
    }
  }
  write_block_partials(partials, warp_partials, warps, C);
}

// Where layernorm_backward_held_kernel's lane holds pack k of a row: elements 4 lane + 128 k .. + 3.
__device__ __forceinline__ int64_t held_at(int lane, int k) {
  return 4 * lane + 4 * kWarp * k;
}

// layernorm_backward_kernel with each row held in registers (W = 4, C <= 128 x Packs): a lane issues all its
// loads of dout and inp for a row at once, and the second pass reads them from registers rather than from
// L1/L2 (at GPT-2 1.5B's C = 1600 the streaming kernel ran at 2.0 TB/s, waiting on DRAM). The same values in
// the same order, so the same bits.
template <int Packs, typename Dout>
__global__ void __launch_bounds__(kLayernormBackwardWarps* kWarp, kLayernormBackwardHeldBlocks)
    layernorm_backward_held_kernel(float* dinp, float* partials, const Dout* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd, int64_t N,
                                   int64_t C) {
  extern __shared__ float warp_partials[];
  const auto [warps, warp, lane, dweight_acc, dbias_acc] = layernorm_backward_warp(warp_partials, C);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const Dout* d = dout + row * C;
    const float* x = inp + row * C;
    float* di = dinp + row * C;
    // Lane l holds the packs at elements 4l + 128k, k < Packs, of those below C.
    elementwise::Raw<4, Dout> held_dout[Packs];
    Pack<4> held_inp[Packs];
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i < C) {
        asm volatile("prefetch.global.L2 [%0];" : : "l"(di + i));
        held_dout[k] = elementwise::load_raw<4>(d + i);
      }
    }
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i < C) held_inp[k] = load_pack<4>(x + i);
    }
    const float m = mean[row];
    const float s = rstd[row];
    double dnorm_sum = 0.0;
    double dnorm_norm_sum = 0.0;
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i >= C) continue;
      layernorm_backward_sums<4>(elementwise::widen(held_dout[k]), held_inp[k], load_pack<4>(weight + i), m,
                                 s, dnorm_sum, dnorm_norm_sum);
    }
    const float a = static_cast<float>(warp_sum(dnorm_sum) / static_cast<double>(C));
    const float b = static_cast<float>(warp_sum(dnorm_norm_sum) / static_cast<double>(C));
#pragma unroll
    for (int k = 0; k < Packs; ++k) {
      const int64_t i = held_at(lane, k);
      if (i >= C) continue;
      layernorm_backward_update<4>(elementwise::widen(held_dout[k]), held_inp[k], load_pack<4>(weight + i), m,
                                   s, a, b, di + i, dweight_acc + i, dbias_acc + i);
    }
  }
  write_block_partials(partials, warp_partials, warps, C);
}

// ---------------------------------------------------------------------------------------------------------
// Softmax cross-entropy: one block per row, in the CPU reference's order of work: the row's maximum, then
// the float64 sum of exp(x - maximum), then the gradient. When the row fits in shared memory (Cached), the
// first read keeps it there for the other two passes, so the logits cross DRAM once each way: rows of a
// GPT-2 vocabulary, hundreds of them in flight, do not stay in L2 between passes. Each thread reads back only
// what it stored itself, so the cache needs no barrier of its own. Rows that fit in shared memory in their
// own type, in whole 16-byte copies, take the staged kernel further down instead, which gives the same bits.
// (A running maximum with a rescaled sum would read the row once for the loss, but costs a comparison and a
// branch on every logit of a kernel bound by its instructions; docs/benchmarks.md, log entry 13.)

constexpr int kSoftmaxThreads = 1024;

// The maximum over the block (block_sum's pattern), returned to every thread. It ignores NaN (fmaxf), as the
// reference's comparison does; a NaN logit still makes the row's sum NaN.
__device__ float block_max(float m) {
  __shared__ float maxima[kWarp];
  const unsigned lane = threadIdx.x % kWarp;
  const unsigned warp = threadIdx.x / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  if (lane == 0) maxima[warp] = m;
  __syncthreads();
  m = lane < blockDim.x / kWarp ? maxima[lane] : -INFINITY;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
  __syncthreads();  // maxima may be reused by the next call
  return m;
}

// What exponentials are taken against: the row's maximum, or 0 for a row without one (all -Inf), whose
// exponentials are then all 0 rather than exp(-Inf - -Inf), NaN.
__device__ __forceinline__ float exponent_shift(float max) {
  return max == -INFINITY ? 0.0f : max;
}

// One logit's term of the row's sum.
__device__ __forceinline__ double exp_term(float x, float shift) {
  return static_cast<double>(expf(__fsub_rn(x, shift)));
}

// Logits stored as float32 or as BF16 (the head GEMM's own output type, holding the same values): W of them
// at a time, as float32. BF16 loads are exact; BF16 stores round to nearest even.
template <int W>
__device__ __forceinline__ Pack<W> load_logits(const float* p) {
  return load_pack<W>(p);
}
template <int W>
__device__ __forceinline__ Pack<W> load_logits(const __nv_bfloat16* p) {
  if constexpr (W == 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    Pack<8> x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[k]));
      x.v[2 * k] = pair.x;
      x.v[2 * k + 1] = pair.y;
    }
    return x;
  } else if constexpr (W == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&q.y));
    return {{lo.x, lo.y, hi.x, hi.y}};
  } else {
    return {{__bfloat162float(*p)}};
  }
}
template <int W>
__device__ __forceinline__ void store_logits(float* p, const Pack<W>& x) {
  store_pack<W>(p, x);
}
template <int W>
__device__ __forceinline__ void store_logits(__nv_bfloat16* p, const Pack<W>& x) {
  if constexpr (W == 8) {
    uint32_t words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(x.v[2 * k], x.v[2 * k + 1]);
      words[k] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
  } else if constexpr (W == 4) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.v[0], x.v[1]);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(x.v[2], x.v[3]);
    uint2 q;
    q.x = *reinterpret_cast<const uint32_t*>(&lo);
    q.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = q;
  } else {
    *p = __float2bfloat16_rn(x.v[0]);
  }
}

// The loss of a row from its maximum, its sum and its target's logit.
__device__ __forceinline__ float row_loss(float max, double sum, float target_logit) {
  const float log_sum = static_cast<float>(log(sum));
  return __fsub_rn(log_sum, __fsub_rn(target_logit, max));
}

// dloss * (softmax - onehot(target)) of one logit x, from the row's maximum and 1 / sum.
__device__ __forceinline__ float logit_gradient(float x, float max, float inverse_sum, float dloss,
                                                bool is_target) {
  const float g = __fmul_rn(__fmul_rn(expf(__fsub_rn(x, max)), inverse_sum), dloss);
  return is_target ? __fsub_rn(g, dloss) : g;
}

// One block per row. The reductions and the arithmetic do not depend on the logits' storage type, so a BF16
// row gives the same loss, and the same gradient rounded to BF16, as the float32 row of the same values.
template <typename Logit, int W, bool Cached>
__global__ void __launch_bounds__(kSoftmaxThreads)
    softmax_cross_entropy_kernel(float* losses, Logit* logits, const int32_t* targets, int64_t V, int64_t Vp,
                                 float dloss) {
  extern __shared__ float cached_row[];  // [V] when Cached
  const int64_t n = blockIdx.x;
  Logit* row = logits + n * Vp;
  const int64_t target = targets[n];
  // Read before the block reduction's barriers, so before any thread overwrites the row.
  const float target_logit = threadIdx.x == 0 ? load_logits<1>(row + target).v[0] : 0.0f;
  const int64_t groups = V / W;
  float m = -INFINITY;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = load_logits<W>(row + g * W);
    if constexpr (Cached) store_pack<W>(cached_row + g * W, p);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, p.v[k]);
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    const float x = load_logits<1>(row + v).v[0];
    if constexpr (Cached) cached_row[v] = x;
    m = fmaxf(m, x);
  }
  const float max = block_max(m);
  const float shift = exponent_shift(max);
  double s = 0.0;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = Cached ? load_pack<W>(cached_row + g * W) : load_logits<W>(row + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) s = __dadd_rn(s, exp_term(p.v[k], shift));
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    s = __dadd_rn(s, exp_term(Cached ? cached_row[v] : load_logits<1>(row + v).v[0], shift));
  }
  const double sum = block_sum(s);
  if (threadIdx.x == 0) losses[n] = row_loss(max, sum, target_logit);
  if (dloss == 0.0f) return;
  const float inverse_sum = static_cast<float>(1.0 / sum);
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    Pack<W> p = Cached ? load_pack<W>(cached_row + g * W) : load_logits<W>(row + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) p.v[k] = logit_gradient(p.v[k], max, inverse_sum, dloss, g * W + k == target);
    store_logits<W>(row + g * W, p);
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    const float x = Cached ? cached_row[v] : load_logits<1>(row + v).v[0];
    store_logits<1>(row + v, Pack<1>{{logit_gradient(x, max, inverse_sum, dloss, v == target)}});
  }
  for (int64_t v = V + threadIdx.x; v < Vp; v += kSoftmaxThreads) store_logits<1>(row + v, Pack<1>{{0.0f}});
}

// The same row staged whole in shared memory in its own type, for rows of a multiple of 16 bytes starting
// 16-byte aligned: a BF16 row of GPT-2's padded vocabulary takes 98 KiB, so two blocks share a multiprocessor
// and one block's arithmetic hides the other's memory traffic. The row arrives by 16-byte cp.async copies,
// all of them in flight at once (the kernel above loads as it reduces, a few loads per thread at a time);
// the gradient leaves in 16-byte stores, padded columns included. The reduction takes the same elements in
// the same order on the same threads as softmax_cross_entropy_kernel<Logit, 4, ...> (which the launcher would
// pick for these rows), and the arithmetic is the same, so the losses and gradients are its bits exactly.
constexpr int kCopyBytes = 16;

__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(shared))),
               "l"(global));
}

template <typename Logit>
__global__ void __launch_bounds__(kSoftmaxThreads, 2)
    softmax_cross_entropy_staged_kernel(float* losses, Logit* logits, const int32_t* targets, int64_t V,
                                        int64_t Vp, float dloss) {
  constexpr int kPerCopy = kCopyBytes / static_cast<int>(sizeof(Logit));  // 4 float32, 8 BF16
  constexpr int W = 4;                                                    // the reduction's groups
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  Logit* staged = reinterpret_cast<Logit*>(staged_bytes);  // [Vp]
  const int64_t n = blockIdx.x;
  Logit* row = logits + n * Vp;
  const int64_t copies = Vp / kPerCopy;
  for (int64_t j = threadIdx.x; j < copies; j += kSoftmaxThreads) {
    copy_async_16(staged + j * kPerCopy, row + j * kPerCopy);
  }
  asm volatile("cp.async.commit_group;\n" ::);
  const int64_t target = targets[n];
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  // Every read of the row from here on is from shared memory, so the gradient may overwrite it in place.
  const int64_t groups = V / W;
  float m = -INFINITY;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = load_logits<W>(staged + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) m = fmaxf(m, p.v[k]);
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    m = fmaxf(m, load_logits<1>(staged + v).v[0]);
  }
  const float max = block_max(m);
  const float shift = exponent_shift(max);
  double s = 0.0;
  for (int64_t g = threadIdx.x; g < groups; g += kSoftmaxThreads) {
    const Pack<W> p = load_logits<W>(staged + g * W);
#pragma unroll
    for (int k = 0; k < W; ++k) s = __dadd_rn(s, exp_term(p.v[k], shift));
  }
  for (int64_t v = groups * W + threadIdx.x; v < V; v += kSoftmaxThreads) {
    s = __dadd_rn(s, exp_term(load_logits<1>(staged + v).v[0], shift));
  }
  const double sum = block_sum(s);
  if (threadIdx.x == 0) losses[n] = row_loss(max, sum, load_logits<1>(staged + target).v[0]);
  if (dloss == 0.0f) return;
  const float inverse_sum = static_cast<float>(1.0 / sum);
  // 32-bit positions (a row is far shorter than 2^31 logits); only the copy holding the target, and the last
  // copies where the padding starts, take the per-logit checks.
  const auto columns = static_cast<int>(V);
  const auto target_column = static_cast<int>(target);
  for (int j = static_cast<int>(threadIdx.x); j < static_cast<int>(copies); j += kSoftmaxThreads) {
    const int v0 = j * kPerCopy;
    Pack<kPerCopy> p = load_logits<kPerCopy>(staged + v0);
    if (v0 + kPerCopy <= columns && static_cast<unsigned>(target_column - v0) >= kPerCopy) {
#pragma unroll
      for (int k = 0; k < kPerCopy; ++k) p.v[k] = logit_gradient(p.v[k], max, inverse_sum, dloss, false);
    } else {
#pragma unroll
      for (int k = 0; k < kPerCopy; ++k) {
        p.v[k] = v0 + k < columns ? logit_gradient(p.v[k], max, inverse_sum, dloss, v0 + k == target_column)
                                  : 0.0f;
      }
    }
    store_logits<kPerCopy>(row + v0, p);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Gradient utilities

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

// The reference's AdamW step (elementwise.cuh's, shared with the fused AdamW cast).
struct AdamW {
  float* params;
  float* m;
  float* v;
  elementwise::Gradient grads;
  elementwise::AdamWConstants constants;
  template <int W>
  __device__ void apply(int64_t i) const {
    elementwise::adamw_pack<W>(constants, params, m, v, grads, i);
  }
};

// The same step, also writing the updated params rounded to bf16 (a BF16 layer's weight copy).
struct AdamWConvert {
  float* params;
  float* m;
  float* v;
  elementwise::Gradient grads;
  uint16_t* copy;
  elementwise::AdamWConstants constants;
  template <int W>
  __device__ void apply(int64_t i) const {
    store_pack<W>(copy + i, elementwise::adamw_pack<W>(constants, params, m, v, grads, i));
  }
};

// ---------------------------------------------------------------------------------------------------------
// Linear-layer support

__device__ __forceinline__ uint16_t f16_bits(float x) {
  // round_to_f16's result is an FP16 value, which the hardware conversion then represents exactly; NaN is
  // written as the canonical 0x7FFF, as octet::float_to_f16 writes it.
  const float r = round_to_f16(x);
  return r != r ? static_cast<uint16_t>(0x7FFFu) : __half_as_ushort(__float2half_rn(r));
}

// With W = 4 the output is 8-byte aligned and written as one 64-bit store.
template <bool Bf16>
struct Convert {
  uint16_t* out;
  const float* in;
  template <int W>
  __device__ void apply(int64_t i) const {
    const Pack<W> p = load_pack<W>(in + i);
    uint16_t codes[W];
#pragma unroll
    for (int k = 0; k < W; ++k) codes[k] = Bf16 ? bf16_bits(p.v[k]) : f16_bits(p.v[k]);
    if constexpr (W == 4) {
      uint2 packed;
      packed.x = static_cast<uint32_t>(codes[0]) | (static_cast<uint32_t>(codes[1]) << 16);
      packed.y = static_cast<uint32_t>(codes[2]) | (static_cast<uint32_t>(codes[3]) << 16);
      *reinterpret_cast<uint2*>(out + i) = packed;
    } else {
      out[i] = codes[0];
    }
  }
};

void check_size(int64_t n, const char* op) {
  OCTET_CHECK(n >= 0, "{}: a non-negative size, got {}", op, n);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Workspace

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

// ---------------------------------------------------------------------------------------------------------
// Launchers

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                     int64_t T, int64_t C, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0 && C >= 0, "encoder_forward: non-negative B, T, C, got {} {} {}", B, T, C);
  const int64_t n = B * T * C;
  if (n == 0) return;
  const bool vectorize = C % 4 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
  for_each(EncoderForward{out, tokens, wte, wpe, T, C}, n, vectorize, stream);
  OCTET_CUDA_CHECK_LAUNCH("encoder_forward");
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                      int64_t T, int64_t C, Workspace& workspace, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0 && C >= 0, "encoder_backward: non-negative B, T, C, got {} {} {}", B, T, C);
  const int64_t rows = B * T;
  if (rows == 0 || C == 0) return;
  OCTET_CHECK(rows <= INT32_MAX, "encoder_backward: at most 2^31 - 1 positions, got {}", rows);
  const int n = static_cast<int>(rows);

  // Positions sorted by token id, stably, so that each token's positions keep the reference's (b, t) order.
  size_t sort_bytes = 0;
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, tokens, static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), n, 0, 32, stream));
  Layout layout;
  const size_t sorted_tokens_at = layout.reserve(rows * sizeof(int32_t));
  const size_t positions_at = layout.reserve(rows * sizeof(int32_t));
  const size_t sorted_positions_at = layout.reserve(rows * sizeof(int32_t));
  const size_t sort_at = layout.reserve(sort_bytes);
  void* base = workspace.get(layout.bytes, stream);
  auto* sorted_tokens = at_offset<int32_t>(base, sorted_tokens_at);
  auto* positions = at_offset<int32_t>(base, positions_at);
  auto* sorted_positions = at_offset<int32_t>(base, sorted_positions_at);

  iota_kernel<<<static_cast<unsigned>(ceil_div(rows, kThreads)), kThreads, 0, stream>>>(positions, n);
  OCTET_CUDA_CHECK_LAUNCH("iota_kernel");
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(at_offset<void>(base, sort_at), sort_bytes, tokens,
                                                   sorted_tokens, positions, sorted_positions, n, 0, 32,
                                                   stream));

  const bool vectorize = C % 4 == 0 && aligned16(dwte) && aligned16(dout);
  const int width = vectorize ? 4 : 1;
  const int64_t lanes = ceil_div(C, width);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, ceil_div(lanes, kWarp) * kWarp));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(ceil_div(lanes, threads)));
  if (vectorize) {
    encoder_backward_token_kernel<4>
        <<<grid, threads, 0, stream>>>(dwte, dout, sorted_tokens, sorted_positions, n, C);
  } else {
    encoder_backward_token_kernel<1>
        <<<grid, threads, 0, stream>>>(dwte, dout, sorted_tokens, sorted_positions, n, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("encoder_backward_token_kernel");

  const int64_t TC = T * C;
  for_each(EncoderBackwardPosition{dwpe, dout, B, TC}, TC, TC % 4 == 0 && aligned16(dwpe) && aligned16(dout),
           stream);
  OCTET_CUDA_CHECK_LAUNCH("encoder_backward (positions)");
}

namespace {

template <typename Out>
void layernorm_forward_of(Out* out, float* mean, float* rstd, const float* inp, const float* weight,
                          const float* bias, int64_t N, int64_t C, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && C > 0, "layernorm_forward: N >= 0 and C > 0, got N={} C={}", N, C);
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(ceil_div(N, kLayernormForwardWarps));
  if (C % 4 == 0 && elementwise::pack_aligned(out) && aligned16(inp) && aligned16(weight) &&
      aligned16(bias)) {
    layernorm_forward_kernel<4><<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  } else {
    layernorm_forward_kernel<1><<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream) {
  layernorm_forward_of(out, mean, rstd, inp, weight, bias, N, C, stream);
}

void layernorm_forward(uint16_t* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream) {
  layernorm_forward_of(out, mean, rstd, inp, weight, bias, N, C, stream);
}

namespace {

// The backward kernel for a shape: rows held in registers for BF16 gradients (whose held values take half
// the registers) of 1028 to 1664 channels (GPT-2 1.5B's 1600: 9 to 13 packs a lane), where it measured
// faster; else streamed, which keeps twice the warps resident.
template <typename Dout>
auto layernorm_backward_choice(bool vectorize, int64_t C) {
  const int64_t packs = (C + 4 * kWarp - 1) / (4 * kWarp);
  if constexpr (std::is_same_v<Dout, uint16_t>) {
    if (vectorize && packs > 8 && packs <= 13) return layernorm_backward_held_kernel<13, Dout>;
  }
  return vectorize ? layernorm_backward_kernel<4, Dout> : layernorm_backward_kernel<1, Dout>;
}

template <typename Dout>
void layernorm_backward_of(float* dinp, float* dweight, float* dbias, const Dout* dout, const float* inp,
                           const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                           Workspace& workspace, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && C > 0, "layernorm_backward: N >= 0 and C > 0, got N={} C={}", N, C);
  if (N == 0) return;
  const size_t warp_bytes = static_cast<size_t>(2 * C) * sizeof(float);
  const size_t shared_limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  const int warps = static_cast<int>(std::min<size_t>(kLayernormBackwardWarps, shared_limit / warp_bytes));
  OCTET_REQUIRE(warps >= 1,
                "layernorm_backward: C={} needs {} bytes of shared memory per warp, the device has {}", C,
                warp_bytes, shared_limit);
  const size_t shared_bytes = static_cast<size_t>(warps) * warp_bytes;
  const bool vectorize =
      C % 4 == 0 && aligned16(dinp) && elementwise::pack_aligned(dout) && aligned16(inp) && aligned16(weight);
  const auto kernel = layernorm_backward_choice<Dout>(vectorize, C);
  if (shared_bytes > kDefaultSharedBytes) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
  }
  // One wave of equal blocks: the most the GPU holds at once, each warp given the same number of rows, so
  // that no block starts after the others have finished (a second wave of a few blocks, or warps with one
  // row more than the rest, would leave the GPU idling). The rows of a warp, and so the order of the
  // dweight and dbias partial sums, depend on the shape and the GPU's size.
  int resident_per_multiprocessor = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident_per_multiprocessor, kernel,
                                                                 warps * kWarp, shared_bytes));
  const int64_t resident = static_cast<int64_t>(device_attribute(cudaDevAttrMultiProcessorCount)) *
                           std::max(resident_per_multiprocessor, 1);
  const int64_t rows_per_warp = std::max<int64_t>(ceil_div(N, resident * warps), 1);
  const int64_t blocks = ceil_div(N, warps * rows_per_warp);

  const bool joint = dbias == dweight + C;  // one column sum for both (below)
  const int64_t sum_columns = joint ? 2 * C : C;
  const ColumnSumPlan plan = plan_column_sum(blocks, sum_columns);
  Layout layout;
  const size_t partials_at = layout.reserve(static_cast<size_t>(blocks) * warp_bytes);
  const size_t scratch_at = layout.reserve(plan.scratch_floats(sum_columns) * sizeof(float));
  void* base = workspace.get(layout.bytes, stream);
  float* partials = at_offset<float>(base, partials_at);
  float* scratch = at_offset<float>(base, scratch_at);

  kernel<<<static_cast<unsigned>(blocks), warps * kWarp, shared_bytes, stream>>>(dinp, partials, dout, inp,
                                                                                 weight, mean, rstd, N, C);
  OCTET_CUDA_CHECK_LAUNCH("layernorm_backward_kernel");
  // Rows of partials hold dweight then dbias: one sum over 2C columns where the gradients lie so too (a
  // LayerNorm's weight and bias in the model's parameters), else one each; stage two of each may reuse the
  // scratch, being ordered on the stream.
  if (joint) {
    column_sum(partials, 2 * C, blocks, 2 * C, dweight, plan, scratch, stream);
  } else {
    column_sum(partials, 2 * C, blocks, C, dweight, plan, scratch, stream);
    column_sum(partials + C, 2 * C, blocks, C, dbias, plan, scratch, stream);
  }
}

}  // namespace

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream) {
  layernorm_backward_of(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, workspace, stream);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const uint16_t* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream) {
  layernorm_backward_of(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, workspace, stream);
}

namespace {

template <typename In, typename Out>
void gelu_forward_of(Out* out, const In* inp, int64_t n, cudaStream_t stream) {
  check_size(n, "gelu_forward");
  if (n == 0) return;
  for_each(Map1<Gelu, In, Out>{out, inp, Gelu{}}, n,
           elementwise::pack_aligned(out) && elementwise::pack_aligned(inp), stream);
  OCTET_CUDA_CHECK_LAUNCH("gelu_forward");
}

template <typename In, typename Out>
void gelu_backward_of(Out* dinp, const In* inp, const In* dout, int64_t n, cudaStream_t stream) {
  check_size(n, "gelu_backward");
  if (n == 0) return;
  for_each(
      Map2<GeluGradient, In, Out>{dinp, inp, dout, GeluGradient{}}, n,
      elementwise::pack_aligned(dinp) && elementwise::pack_aligned(inp) && elementwise::pack_aligned(dout),
      stream);
  OCTET_CUDA_CHECK_LAUNCH("gelu_backward");
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_forward(float* out, const uint16_t* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_forward(uint16_t* out, const float* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_forward(uint16_t* out, const uint16_t* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void gelu_backward(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void gelu_backward(uint16_t* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void gelu_backward(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, int64_t n,
                   cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void residual_forward(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  check_size(n, "residual_forward");
  if (n == 0) return;
  for_each(Map2<Add>{out, a, b, Add{}}, n, aligned16(out) && aligned16(a) && aligned16(b), stream);
  OCTET_CUDA_CHECK_LAUNCH("residual_forward");
}

void accumulate(float* a, const float* b, int64_t n, cudaStream_t stream) {
  check_size(n, "accumulate");
  if (n == 0) return;
  for_each(Map2<Add>{a, a, b, Add{}}, n, aligned16(a) && aligned16(b), stream);
  OCTET_CUDA_CHECK_LAUNCH("accumulate");
}

void scale(float* x, int64_t n, float factor, cudaStream_t stream) {
  check_size(n, "scale");
  if (n == 0) return;
  for_each(Map1<Multiply>{x, x, Multiply{factor}}, n, aligned16(x), stream);
  OCTET_CUDA_CHECK_LAUNCH("scale");
}

void fill_zero(float* x, int64_t n, cudaStream_t stream) {
  check_size(n, "fill_zero");
  if (n == 0) return;
  OCTET_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), stream));
}

namespace {

template <typename Logit>
void launch_softmax_cross_entropy(float* losses, Logit* logits, const int32_t* targets, int64_t N, int64_t V,
                                  int64_t Vp, float dloss, cudaStream_t stream) {
  OCTET_CHECK(N >= 0 && V > 0 && Vp >= V, "softmax_cross_entropy: N >= 0, 0 < V <= Vp, got N={} V={} Vp={}",
              N, V, Vp);
  if (N == 0) return;
  OCTET_CHECK(N <= INT32_MAX, "softmax_cross_entropy: at most 2^31 - 1 rows, got {}", N);
  const auto blocks = static_cast<unsigned>(N);
  const size_t shared_limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  // Rows of whole 16-byte copies that fit in shared memory (every row of a GPT-2 vocabulary padded to a
  // multiple of 64) are staged there in their own type.
  const size_t row_bytes = static_cast<size_t>(Vp) * sizeof(Logit);
  if (row_bytes % kCopyBytes == 0 && reinterpret_cast<uintptr_t>(logits) % kCopyBytes == 0) {
    const auto kernel = softmax_cross_entropy_staged_kernel<Logit>;
    cudaFuncAttributes attributes{};
    OCTET_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (row_bytes + attributes.sharedSizeBytes <= shared_limit) {
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(row_bytes)));
      // As much shared memory as the multiprocessor has: a second block of BF16 rows needs it.
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
      kernel<<<blocks, kSoftmaxThreads, row_bytes, stream>>>(losses, logits, targets, V, Vp, dloss);
      OCTET_CUDA_CHECK_LAUNCH("softmax_cross_entropy_staged_kernel");
      return;
    }
  }
  // The row cache is only worth its shared memory when the gradient pass reads the row again.
  const size_t cache_bytes = static_cast<size_t>(V) * sizeof(float);
  const bool cached =
      dloss != 0.0f && cache_bytes + 1024 <= shared_limit;  // 1 KiB for the reduction's arrays
  auto launch = [&](auto kernel, size_t shared_bytes) {
    if (shared_bytes > kDefaultSharedBytes) {
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
    }
    kernel<<<blocks, kSoftmaxThreads, shared_bytes, stream>>>(losses, logits, targets, V, Vp, dloss);
  };
  // Four logits per load: 16 bytes of float32 or 8 of BF16.
  const bool vectorize = Vp % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % (4 * sizeof(Logit)) == 0;
  if (cached) {
    if (vectorize) {
      launch(softmax_cross_entropy_kernel<Logit, 4, true>, cache_bytes);
    } else {
      launch(softmax_cross_entropy_kernel<Logit, 1, true>, cache_bytes);
    }
  } else {
    if (vectorize) {
      launch(softmax_cross_entropy_kernel<Logit, 4, false>, 0);
    } else {
      launch(softmax_cross_entropy_kernel<Logit, 1, false>, 0);
    }
  }
  OCTET_CUDA_CHECK_LAUNCH("softmax_cross_entropy_kernel");
}

}  // namespace

void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream) {
  launch_softmax_cross_entropy(losses, logits, targets, N, V, Vp, dloss, stream);
}

void softmax_cross_entropy(float* losses, __nv_bfloat16* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream) {
  launch_softmax_cross_entropy(losses, logits, targets, N, V, Vp, dloss, stream);
}

namespace {

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

namespace {

void adamw_update_from(float* params, float* m, float* v, elementwise::Gradient grads, int64_t n,
                       float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step, float grad_scale, cudaStream_t stream) {
  check_size(n, "adamw_update");
  if (n == 0) return;
  const AdamW op{
      params, m, v, grads,
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale)};
  const bool grads_aligned =
      grads.bf16 != nullptr ? elementwise::pack_aligned(grads.bf16) : aligned16(grads.f32);
  for_each(op, n, aligned16(params) && aligned16(m) && aligned16(v) && grads_aligned, stream);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update");
}

}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float learning_rate,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                  cudaStream_t stream) {
  adamw_update_from(params, m, v, {grads, nullptr}, n, learning_rate, beta1, beta2, eps, weight_decay, step,
                    grad_scale, stream);
}

void adamw_update(float* params, float* m, float* v, const uint16_t* grads, int64_t n, float learning_rate,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                  cudaStream_t stream) {
  adamw_update_from(params, m, v, {nullptr, grads}, n, learning_rate, beta1, beta2, eps, weight_decay, step,
                    grad_scale, stream);
}

namespace {

// One block per chunk: groups of four with float4 accesses where the chunk starts 16-byte aligned, then the
// rest one by one; the step is adamw_update's.
__global__ void __launch_bounds__(kThreads)
    adamw_chunks_kernel(float* params, float* m, float* v, const float* grads, const Chunk* chunks,
                        elementwise::AdamWConstants decayed, elementwise::AdamWConstants plain,
                        bool aligned) {
  const Chunk chunk = chunks[blockIdx.x];
  const elementwise::AdamWConstants& c = chunk.flag != 0 ? decayed : plain;
  const int64_t groups = aligned && chunk.offset % 4 == 0 && chunk.grad_offset % 4 == 0 ? chunk.count / 4 : 0;
  // The chunk's own elements: its gradient may sit elsewhere in grads than its params (Chunk::grad_offset).
  float* p = params + chunk.offset;
  float* mc = m + chunk.offset;
  float* vc = v + chunk.offset;
  const elementwise::Gradient g{grads + chunk.grad_offset, nullptr};
  for (int64_t k = threadIdx.x; k < groups; k += blockDim.x)
    elementwise::adamw_pack<4>(c, p, mc, vc, g, k * 4);
  for (int64_t i = groups * 4 + threadIdx.x; i < chunk.count; i += blockDim.x) {
    elementwise::adamw_pack<1>(c, p, mc, vc, g, i);
  }
  if (chunk.rounded == nullptr) return;  // the same for the whole block
  __syncthreads();                       // the block's updated values, whichever thread wrote them
  for (int64_t i = threadIdx.x; i < chunk.count; i += blockDim.x) {
    const float p = params[chunk.offset + i];
    if (chunk.rounded_bits != 0) {
      static_cast<uint16_t*>(chunk.rounded)[i] = bf16_bits(p);
    } else {
      static_cast<float*>(chunk.rounded)[i] = round_to_bf16(p);
    }
  }
}

// adamw_update_converts: block b takes chunk b - first_block of the weight whose chunks hold b (n % 4 == 0
// and every pointer aligned: float4 loads, one 64-bit store of bf16).
__global__ void __launch_bounds__(kThreads)
    adamw_convert_chunks_kernel(const AdamWConvertWeight* __restrict__ weights, int count,
                                elementwise::AdamWConstants decayed, elementwise::AdamWConstants plain) {
  const AdamWConvertWeight& w = weights[elementwise::entry_of_block(weights, count, blockIdx.x)];
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - w.first_block) * kChunkElements;
  const int64_t end = w.n < begin + kChunkElements ? w.n : begin + kChunkElements;
  const AdamWConvert op{w.params,
                        w.m,
                        w.v,
                        {w.grads, w.grads_bf16},
                        reinterpret_cast<uint16_t*>(w.copy),
                        w.decayed ? decayed : plain};
  for (int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x); i < end; i += 4 * kThreads) {
    op.apply<4>(i);
  }
}

__global__ void __launch_bounds__(kThreads)
    fill_zero_chunks_kernel(float* x, const Chunk* chunks, bool aligned) {
  const Chunk chunk = chunks[blockIdx.x];
  const int64_t groups = aligned && chunk.offset % 4 == 0 ? chunk.count / 4 : 0;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    *reinterpret_cast<float4*>(x + chunk.offset + g * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (int64_t i = groups * 4 + threadIdx.x; i < chunk.count; i += blockDim.x) x[chunk.offset + i] = 0.0f;
}

}  // namespace

void fill_zero_chunks(float* x, const Chunk* chunks, int64_t chunk_count, cudaStream_t stream) {
  OCTET_CHECK(chunk_count >= 0 && chunk_count <= 0x7FFFFFFF, "fill_zero_chunks: {} chunks", chunk_count);
  if (chunk_count == 0) return;
  fill_zero_chunks_kernel<<<static_cast<unsigned>(chunk_count), kThreads, 0, stream>>>(x, chunks,
                                                                                       aligned16(x));
  OCTET_CUDA_CHECK_LAUNCH("fill_zero_chunks");
}

void adamw_update_chunks(float* params, float* m, float* v, const float* grads, const Chunk* chunks,
                         int64_t chunk_count, float learning_rate, float beta1, float beta2, float eps,
                         float weight_decay, int64_t step, float grad_scale, cudaStream_t stream) {
  OCTET_CHECK(chunk_count >= 0 && chunk_count <= 0x7FFFFFFF, "adamw_update_chunks: {} chunks", chunk_count);
  if (chunk_count == 0) return;
  const auto decayed =
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale);
  const auto plain = elementwise::adamw_constants(learning_rate, beta1, beta2, eps, 0.0f, step, grad_scale);
  const bool aligned = aligned16(params) && aligned16(m) && aligned16(v) && aligned16(grads);
  adamw_chunks_kernel<<<static_cast<unsigned>(chunk_count), kThreads, 0, stream>>>(
      params, m, v, grads, chunks, decayed, plain, aligned);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_chunks");
}

namespace {

// adamw_update_convert over a float32 or a bf16 gradient.
void adamw_update_convert_from(float* params, float* m, float* v, elementwise::Gradient grads,
                               __nv_bfloat16* params_bf16, int64_t n, float learning_rate, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                               cudaStream_t stream) {
  check_size(n, "adamw_update_convert");
  OCTET_CHECK(params_bf16 != nullptr, "adamw_update_convert: a bf16 output");
  OCTET_CHECK((grads.f32 != nullptr) != (grads.bf16 != nullptr), "adamw_update_convert: one gradient");
  if (n == 0) return;
  auto* copy = reinterpret_cast<uint16_t*>(params_bf16);
  const AdamWConvert op{
      params, m,
      v,      grads,
      copy,   elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale)};
  const bool grads_aligned =
      grads.bf16 != nullptr ? elementwise::pack_aligned(grads.bf16) : aligned16(grads.f32);
  for_each(
      op, n,
      aligned16(params) && aligned16(m) && aligned16(v) && grads_aligned && elementwise::pack_aligned(copy),
      stream);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_convert");
}

}  // namespace

void adamw_update_convert(float* params, float* m, float* v, const float* grads, __nv_bfloat16* params_bf16,
                          int64_t n, float learning_rate, float beta1, float beta2, float eps,
                          float weight_decay, int64_t step, float grad_scale, cudaStream_t stream) {
  adamw_update_convert_from(params, m, v, {grads, nullptr}, params_bf16, n, learning_rate, beta1, beta2, eps,
                            weight_decay, step, grad_scale, stream);
}

void adamw_update_converts(std::span<const AdamWConvertWeight> weights, float learning_rate, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                           AdamWConvertTable& table, cudaStream_t stream) {
  std::vector<AdamWConvertWeight> entries;
  int64_t blocks = 0;
  for (const AdamWConvertWeight& w : weights) {
    OCTET_CHECK((w.grads != nullptr) != (w.grads_bf16 != nullptr), "adamw_update_converts: one gradient");
    const bool grads_aligned =
        w.grads_bf16 != nullptr ? elementwise::pack_aligned(w.grads_bf16) : aligned16(w.grads);
    const bool vector = w.n > 0 && w.n % 4 == 0 && aligned16(w.params) && aligned16(w.m) && aligned16(w.v) &&
                        grads_aligned && elementwise::pack_aligned(reinterpret_cast<uint16_t*>(w.copy));
    if (!vector) {  // adamw_update_convert checks the weight
      adamw_update_convert_from(w.params, w.m, w.v, {w.grads, w.grads_bf16}, w.copy, w.n, learning_rate,
                                beta1, beta2, eps, w.decayed ? weight_decay : 0.0f, step, grad_scale, stream);
      continue;
    }
    OCTET_CHECK(w.copy != nullptr, "adamw_update_converts: a bf16 output");
    AdamWConvertWeight e = w;
    e.first_block = blocks;
    entries.push_back(e);
    blocks += ceil_div(w.n, kChunkElements);
  }
  if (entries.empty()) return;
  OCTET_REQUIRE(blocks <= 0x7FFFFFFF, "adamw_update_converts: {} chunks of {} values, at most 2^31 - 1",
                blocks, kChunkElements);
  const auto count = static_cast<int>(entries.size());
  const AdamWConvertWeight* device = table.upload(std::move(entries), stream);
  adamw_convert_chunks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      device, count,
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale),
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, 0.0f, step, grad_scale));
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_converts");
}

void convert_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream) {
  check_size(n, "convert_to_bf16");
  if (n == 0) return;
  auto* codes = reinterpret_cast<uint16_t*>(out);
  for_each(Convert<true>{codes, in}, n, reinterpret_cast<uintptr_t>(out) % 8 == 0 && aligned16(in), stream);
  OCTET_CUDA_CHECK_LAUNCH("convert_to_bf16");
}

namespace {

// Eight bf16 values per thread where both sides allow 16-byte accesses, one otherwise.
__global__ void convert_from_bf16_kernel(float* out, const uint16_t* in, int64_t n, bool vectorised) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vectorised) {
    for (; i * 8 + 7 < n; i += stride) {
      const uint4 packed = reinterpret_cast<const uint4*>(in)[i];
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      float4 lo, hi;
      lo.x = __uint_as_float(words[0] << 16);
      lo.y = __uint_as_float(words[0] & 0xFFFF0000u);
      lo.z = __uint_as_float(words[1] << 16);
      lo.w = __uint_as_float(words[1] & 0xFFFF0000u);
      hi.x = __uint_as_float(words[2] << 16);
      hi.y = __uint_as_float(words[2] & 0xFFFF0000u);
      hi.z = __uint_as_float(words[3] << 16);
      hi.w = __uint_as_float(words[3] & 0xFFFF0000u);
      reinterpret_cast<float4*>(out)[2 * i] = lo;
      reinterpret_cast<float4*>(out)[2 * i + 1] = hi;
    }
    // The tail past the last whole group of eight.
    const int64_t done = n / 8 * 8;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t < n - done) out[done + t] = __uint_as_float(static_cast<uint32_t>(in[done + t]) << 16);
    return;
  }
  for (; i < n; i += stride) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

}  // namespace

void convert_from_bf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  check_size(n, "convert_from_bf16");
  if (n == 0) return;
  const bool vectorised = aligned16(out) && reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const int64_t work = vectorised ? std::max<int64_t>(n / 8, 1) : n;
  const int64_t blocks = std::clamp<int64_t>((work + 255) / 256, 1, 132 * 16);
  convert_from_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, in, n, vectorised);
  OCTET_CUDA_CHECK_LAUNCH("convert_from_bf16_kernel");
}

void convert_to_f16(__half* out, const float* in, int64_t n, cudaStream_t stream) {
  check_size(n, "convert_to_f16");
  if (n == 0) return;
  auto* codes = reinterpret_cast<uint16_t*>(out);
  for_each(Convert<false>{codes, in}, n, reinterpret_cast<uintptr_t>(out) % 8 == 0 && aligned16(in), stream);
  OCTET_CUDA_CHECK_LAUNCH("convert_to_f16");
}

void round_in_place(float* x, int64_t n, Dtype dtype, cudaStream_t stream) {
  round_copy(x, x, n, dtype, stream);
}

void round_copy(float* out, const float* in, int64_t n, Dtype dtype, cudaStream_t stream) {
  check_size(n, "round_copy");
  OCTET_CHECK(dtype == Dtype::bf16 || dtype == Dtype::f16, "round_copy: bf16 or f16, got dtype {}",
              static_cast<int>(dtype));
  if (n == 0) return;
  const bool vectorize = aligned16(out) && aligned16(in);
  if (dtype == Dtype::bf16) {
    for_each(Map1<RoundBf16>{out, in, RoundBf16{}}, n, vectorize, stream);
  } else {
    for_each(Map1<RoundF16>{out, in, RoundF16{}}, n, vectorize, stream);
  }
  OCTET_CUDA_CHECK_LAUNCH("round_copy");
}

namespace {

template <typename T>
void column_sums_into(float* dbias, const T* dout, int64_t N, int64_t OC, Workspace& workspace,
                      cudaStream_t stream, uint16_t* copy = nullptr) {
  OCTET_CHECK(N >= 0 && OC >= 0, "bias_backward: non-negative N and OC, got {} {}", N, OC);
  if (N == 0 || OC == 0) return;
  const ColumnSumPlan plan = plan_column_sum(N, OC);
  float* scratch = nullptr;
  if (plan.scratch_floats(OC) > 0) {
    scratch = static_cast<float*>(workspace.get(plan.scratch_floats(OC) * sizeof(float), stream));
  }
  column_sum(dout, OC, N, OC, dbias, plan, scratch, stream, copy);
}

}  // namespace

void bias_backward(float* dbias, const float* dout, int64_t N, int64_t OC, Workspace& workspace,
                   cudaStream_t stream) {
  column_sums_into(dbias, dout, N, OC, workspace, stream);
}

void bias_backward(float* dbias, const uint16_t* dout, int64_t N, int64_t OC, Workspace& workspace,
                   cudaStream_t stream) {
  column_sums_into(dbias, dout, N, OC, workspace, stream);
}

void bias_backward_convert(float* dbias, __nv_bfloat16* dout_bf16, const float* dout, int64_t N, int64_t OC,
                           Workspace& workspace, cudaStream_t stream) {
  OCTET_CHECK(dout_bf16 != nullptr, "bias_backward_convert: a bf16 output");
  column_sums_into(dbias, dout, N, OC, workspace, stream, reinterpret_cast<uint16_t*>(dout_bf16));
}

}  // namespace octet::cuda
