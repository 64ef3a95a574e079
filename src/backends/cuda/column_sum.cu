// Column sums over the rows of a matrix (column_sum.h), in an order fixed by the shape alone: a linear
// layer's bias gradient (bias_backward, bias_backward_convert), and the column_sum that LayerNorm's
// backward runs over its blocks' partial sums. The conventions that every op follows are ops_common.cuh's.
#include "column_sum.h"

#include <algorithm>
#include <type_traits>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_pack;
using elementwise::Pack;
using ops_internal::bf16_bits;
using ops_internal::ceil_div;
using ops_internal::column_sum;
using ops_internal::ColumnSumPlan;
using ops_internal::plan_column_sum;
using ops_internal::store_pack;

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

}  // namespace

namespace ops_internal {

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

template <typename T>
void column_sum(const T* x, int64_t ld, int64_t rows, int64_t cols, float* out, const ColumnSumPlan& plan,
                float* scratch, cudaStream_t stream, uint16_t* copy) {
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

template void column_sum<float>(const float* x, int64_t ld, int64_t rows, int64_t cols, float* out,
                                const ColumnSumPlan& plan, float* scratch, cudaStream_t stream,
                                uint16_t* copy);
template void column_sum<uint16_t>(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, float* out,
                                   const ColumnSumPlan& plan, float* scratch, cudaStream_t stream,
                                   uint16_t* copy);

}  // namespace ops_internal

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
