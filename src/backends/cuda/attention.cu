// Fused causal self-attention kernels (see attention.h) and their launchers.
//
// Float32 path. Every kernel has the same shape: a block owns kTile "rows" (queries in the forward and the
// dQ kernel, keys in the dK/dV kernel), each of its kWarps warps kRowsPerWarp of them, and walks over tiles
// of kTile "columns" (keys, or queries) staged in shared memory. In the score phase lane j holds column j and
// computes its dot products with the warp's rows; the row statistics are warp reductions. In the
// accumulation phase the lanes split the head dimension (lane owns d = lane + 32 k) and sum over the tile's
// columns in order. Tiles above the causal diagonal are never visited, and on the diagonal a masked
// element is skipped rather than multiplied by zero, so a non-finite value in a future position cannot leak
// into an earlier row (the CPU reference never reads it either).
//
// The backward is three kernels and no atomics: D = rowsum(dO * O); dQ per query tile looping over key
// tiles; dK, dV per key tile looping over query tiles. Each output element is written by one thread after a
// fixed-order sum, so repeated runs are bit-identical.
//
// The BF16 tensor-core path (AttentionOptions::bf16) keeps this structure with 64-row tiles and mma.sync
// products whose scores never leave the registers; it is described where its kernels begin.
#include "attention.h"

#include <algorithm>
#include <cmath>

#include <cuda_bf16.h>

#include "octet/check.h"
#include "octet/numerics/format.h"
#include "ops.h"

namespace octet::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kTile = 32;  // rows per block and columns per tile: one column per lane
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr int kThreads = kWarps * kWarpSize;
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// How a head lies in shared memory: hs_pad rounds hs up to a float4, and stride (the distance between rows)
// is hs_pad rounded to 4 mod 8 words, so that the float4 reads of lanes holding consecutive rows fall in
// distinct bank groups.
struct HeadLayout {
  int hs = 0;
  int hs_pad = 0;
  int stride = 0;
};

HeadLayout head_layout(int hs) {
  HeadLayout layout;
  layout.hs = hs;
  layout.hs_pad = (hs + 3) / 4 * 4;
  layout.stride = layout.hs_pad % 8 == 4 ? layout.hs_pad : layout.hs_pad + 4;
  return layout;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

// Butterfly sum: float addition commutes, so every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

// Stages rows [row0, row0 + kTile) of one head into tile[kTile][stride], zero past hs (up to hs_pad) and
// past T. `head` points at element (t = 0, d = 0) of the head, rows `pitch` floats apart.
__device__ void load_tile(float* tile, const float* head, int64_t pitch, int64_t row0, int64_t T,
                          const HeadLayout& layout) {
  for (int index = threadIdx.x; index < kTile * layout.hs_pad; index += kThreads) {
    const int row = index / layout.hs_pad;
    const int d = index - row * layout.hs_pad;
    const int64_t t = row0 + row;
    tile[row * layout.stride + d] = (d < layout.hs && t < T) ? head[t * pitch + d] : 0.0f;
  }
}

// acc[r] = rows[r] . column over hs_pad (the padding is zero on both sides).
__device__ __forceinline__ void row_column_dots(float (&acc)[kRowsPerWarp], const float* rows,
                                                const float* column, const HeadLayout& layout) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) acc[r] = 0.0f;
  for (int d = 0; d < layout.hs_pad; d += 4) {
    const float4 c = *reinterpret_cast<const float4*>(column + d);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float4 q = *reinterpret_cast<const float4*>(rows + r * layout.stride + d);
      acc[r] = fmaf(q.x, c.x, acc[r]);
      acc[r] = fmaf(q.y, c.y, acc[r]);
      acc[r] = fmaf(q.z, c.z, acc[r]);
      acc[r] = fmaf(q.w, c.w, acc[r]);
    }
  }
}

// The pointers and sizes every kernel needs; b and h come from blockIdx.z and blockIdx.y.
struct AttentionParams {
  float* out;            // forward: out; backward: dqkv
  float* lse_out;        // forward only
  const float* qkv;      // float32 path only
  const float* dout;     // backward only
  const float* lse;      // backward only
  const float* row_dot;  // backward only: D
  int64_t T;
  int64_t C;
  int64_t NH;
  HeadLayout layout;
  float scale;
  // Tensor-core path only: the batch, q, k, v as bf16 [B, T, 3C] (16-byte aligned), dO packed as bf16
  // [B * NH][T][hs] in the backward (see attention_pack_kernel), and whether the float32 outputs are
  // 16-byte aligned, so that rows (whose pitches 3C and C are multiples of 16 there) can be written as
  // float2.
  int64_t B;
  const void* qkv_bf16;
  const void* packed_dout;
  bool vector;
};

// One block per (b, h, query tile); the heaviest tiles (last queries, most keys) are scheduled first.
template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(AttentionParams p) {
  extern __shared__ float4 shared_words[];
  const HeadLayout& layout = p.layout;
  float* q_tile = reinterpret_cast<float*>(shared_words);
  float* k_tile = q_tile + kTile * layout.stride;
  float* v_tile = k_tile + kTile * layout.stride;
  float* p_tile = v_tile + kTile * layout.stride;  // [kWarps][kRowsPerWarp][kTile]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t query_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t q0 = query_tile * kTile;
  const int64_t pitch = 3 * p.C;
  const float* q_head = p.qkv + b * p.T * pitch + h * layout.hs;
  const int first_row = warp * kRowsPerWarp;
  float* warp_p = p_tile + first_row * kTile;

  load_tile(q_tile, q_head, pitch, q0, p.T, layout);

  float row_max[kRowsPerWarp], row_sum[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) acc[r][k] = 0.0f;
  }

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const bool diagonal = key_tile == query_tile;  // q0 == k0 there: key j is visible to row r iff j <= r
    __syncthreads();                               // the previous tile's readers are done
    load_tile(k_tile, q_head + p.C, pitch, key_tile * kTile, p.T, layout);
    load_tile(v_tile, q_head + 2 * p.C, pitch, key_tile * kTile, p.T, layout);
    __syncthreads();

    float score[kRowsPerWarp];
    row_column_dots(score, q_tile + first_row * layout.stride, k_tile + lane * layout.stride, layout);
    // Online softmax: tile 0 always holds key 0, visible to every row, so row_max is finite from then on.
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const float s = (diagonal && lane > first_row + r) ? -INFINITY : score[r] * p.scale;
      const float new_max = fmaxf(row_max[r], warp_max(s));
      const float prob = expf(s - new_max);
      const float rescale = expf(row_max[r] - new_max);
      row_sum[r] = row_sum[r] * rescale + warp_sum(prob);
      row_max[r] = new_max;
#pragma unroll
      for (int k = 0; k < kDimsPerLane; ++k) acc[r][k] *= rescale;
      warp_p[r * kTile + lane] = prob;
    }
    __syncwarp();

    for (int j = 0; j < kTile; ++j) {
      float v[kDimsPerLane];
#pragma unroll
      for (int k = 0; k < kDimsPerLane; ++k) {
        const int d = lane + k * kWarpSize;
        v[k] = d < layout.hs ? v_tile[j * layout.stride + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        if (diagonal && j > first_row + r) continue;  // warp-uniform
        const float prob = warp_p[r * kTile + j];
#pragma unroll
        for (int k = 0; k < kDimsPerLane; ++k) acc[r][k] = fmaf(prob, v[k], acc[r][k]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t t = q0 + first_row + r;
    if (t >= p.T) continue;
    float* o = p.out + (b * p.T + t) * p.C + h * layout.hs;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < layout.hs) o[d] = acc[r][k] / row_sum[r];
    }
    if (lane == 0) p.lse_out[(b * p.NH + h) * p.T + t] = row_max[r] + logf(row_sum[r]);
  }
}

// D[b, h, t] = dout . out over the head: one warp per row.
__global__ void __launch_bounds__(kThreads)
    attention_row_dot_kernel(float* row_dot, const float* dout, const float* out, int64_t rows, int64_t T,
                             int64_t C, int64_t NH, int hs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int64_t t = row % T;
  const int64_t h = (row / T) % NH;
  const int64_t b = row / (T * NH);
  const int64_t offset = (b * T + t) * C + h * hs;
  float sum = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) sum = fmaf(dout[offset + d], out[offset + d], sum);
  sum = warp_sum(sum);
  if (lane == 0) row_dot[row] = sum;
}

// dQ for one (b, h, query tile): dq_t = scale * sum_j p_tj (dp_tj - D_t) k_j over the visible keys j.
template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads) attention_backward_query_kernel(AttentionParams p) {
  extern __shared__ float4 shared_words[];
  const HeadLayout& layout = p.layout;
  float* q_tile = reinterpret_cast<float*>(shared_words);
  float* do_tile = q_tile + kTile * layout.stride;
  float* k_tile = do_tile + kTile * layout.stride;
  float* v_tile = k_tile + kTile * layout.stride;
  float* ds_tile = v_tile + kTile * layout.stride;  // [kWarps][kRowsPerWarp][kTile]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t query_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t q0 = query_tile * kTile;
  const int64_t pitch = 3 * p.C;
  const float* q_head = p.qkv + b * p.T * pitch + h * layout.hs;
  const int first_row = warp * kRowsPerWarp;
  float* warp_ds = ds_tile + first_row * kTile;

  load_tile(q_tile, q_head, pitch, q0, p.T, layout);
  load_tile(do_tile, p.dout + b * p.T * p.C + h * layout.hs, p.C, q0, p.T, layout);

  float row_lse[kRowsPerWarp], row_dot[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t t = q0 + first_row + r;
    const int64_t stat = (b * p.NH + h) * p.T + t;
    row_lse[r] = t < p.T ? p.lse[stat] : 0.0f;
    row_dot[r] = t < p.T ? p.row_dot[stat] : 0.0f;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) acc[r][k] = 0.0f;
  }

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const bool diagonal = key_tile == query_tile;
    __syncthreads();
    load_tile(k_tile, q_head + p.C, pitch, key_tile * kTile, p.T, layout);
    load_tile(v_tile, q_head + 2 * p.C, pitch, key_tile * kTile, p.T, layout);
    __syncthreads();

    float score[kRowsPerWarp], dprob[kRowsPerWarp];
    row_column_dots(score, q_tile + first_row * layout.stride, k_tile + lane * layout.stride, layout);
    row_column_dots(dprob, do_tile + first_row * layout.stride, v_tile + lane * layout.stride, layout);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool visible = !diagonal || lane <= first_row + r;
      const float prob = visible ? expf(score[r] * p.scale - row_lse[r]) : 0.0f;
      warp_ds[r * kTile + lane] = visible ? prob * (dprob[r] - row_dot[r]) * p.scale : 0.0f;
    }
    __syncwarp();

    for (int j = 0; j < kTile; ++j) {
      float k_row[kDimsPerLane];
#pragma unroll
      for (int k = 0; k < kDimsPerLane; ++k) {
        const int d = lane + k * kWarpSize;
        k_row[k] = d < layout.hs ? k_tile[j * layout.stride + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        if (diagonal && j > first_row + r) continue;
        const float ds = warp_ds[r * kTile + j];
#pragma unroll
        for (int k = 0; k < kDimsPerLane; ++k) acc[r][k] = fmaf(ds, k_row[k], acc[r][k]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t t = q0 + first_row + r;
    if (t >= p.T) continue;
    float* dq = p.out + (b * p.T + t) * 3 * p.C + h * layout.hs;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < layout.hs) dq[d] = acc[r][k];
    }
  }
}

// dK, dV for one (b, h, key tile): dv_j = sum_t p_tj do_t and dk_j = scale * sum_t p_tj (dp_tj - D_t) q_t
// over the queries t >= j. Rows are keys here and the lanes hold queries.
template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads) attention_backward_key_kernel(AttentionParams p) {
  extern __shared__ float4 shared_words[];
  const HeadLayout& layout = p.layout;
  float* k_tile = reinterpret_cast<float*>(shared_words);
  float* v_tile = k_tile + kTile * layout.stride;
  float* q_tile = v_tile + kTile * layout.stride;
  float* do_tile = q_tile + kTile * layout.stride;
  float* p_tile = do_tile + kTile * layout.stride;  // [kWarps][kRowsPerWarp][kTile]
  float* ds_tile = p_tile + kTile * kTile;
  float* lse_tile = ds_tile + kTile * kTile;  // [kTile]
  float* dot_tile = lse_tile + kTile;         // [kTile]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t key_tile = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t k0 = key_tile * kTile;
  const int64_t pitch = 3 * p.C;
  const float* q_head = p.qkv + b * p.T * pitch + h * layout.hs;
  const float* do_head = p.dout + b * p.T * p.C + h * layout.hs;
  const int64_t stats = (b * p.NH + h) * p.T;
  const int first_row = warp * kRowsPerWarp;
  float* warp_p = p_tile + first_row * kTile;
  float* warp_ds = ds_tile + first_row * kTile;

  load_tile(k_tile, q_head + p.C, pitch, k0, p.T, layout);
  load_tile(v_tile, q_head + 2 * p.C, pitch, k0, p.T, layout);

  float dk[kRowsPerWarp][kDimsPerLane], dv[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) dk[r][k] = dv[r][k] = 0.0f;
  }

  const int64_t query_tiles = (p.T + kTile - 1) / kTile;
  for (int64_t query_tile = key_tile; query_tile < query_tiles; ++query_tile) {
    const bool diagonal = query_tile == key_tile;  // query i sees key r iff i >= r
    const int64_t q0 = query_tile * kTile;
    const int valid_queries = static_cast<int>(p.T - q0 < kTile ? p.T - q0 : kTile);
    __syncthreads();
    load_tile(q_tile, q_head, pitch, q0, p.T, layout);
    load_tile(do_tile, do_head, p.C, q0, p.T, layout);
    if (threadIdx.x < kTile) {
      const bool inside = static_cast<int>(threadIdx.x) < valid_queries;
      lse_tile[threadIdx.x] = inside ? p.lse[stats + q0 + threadIdx.x] : 0.0f;
      dot_tile[threadIdx.x] = inside ? p.row_dot[stats + q0 + threadIdx.x] : 0.0f;
    }
    __syncthreads();

    float score[kRowsPerWarp], dprob[kRowsPerWarp];
    row_column_dots(score, k_tile + first_row * layout.stride, q_tile + lane * layout.stride, layout);
    row_column_dots(dprob, v_tile + first_row * layout.stride, do_tile + lane * layout.stride, layout);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool visible = lane < valid_queries && (!diagonal || lane >= first_row + r);
      const float prob = visible ? expf(score[r] * p.scale - lse_tile[lane]) : 0.0f;
      warp_p[r * kTile + lane] = prob;
      warp_ds[r * kTile + lane] = visible ? prob * (dprob[r] - dot_tile[lane]) * p.scale : 0.0f;
    }
    __syncwarp();

    for (int i = 0; i < valid_queries; ++i) {
      float q_row[kDimsPerLane], do_row[kDimsPerLane];
#pragma unroll
      for (int k = 0; k < kDimsPerLane; ++k) {
        const int d = lane + k * kWarpSize;
        q_row[k] = d < layout.hs ? q_tile[i * layout.stride + d] : 0.0f;
        do_row[k] = d < layout.hs ? do_tile[i * layout.stride + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        if (diagonal && i < first_row + r) continue;
        const float prob = warp_p[r * kTile + i];
        const float ds = warp_ds[r * kTile + i];
#pragma unroll
        for (int k = 0; k < kDimsPerLane; ++k) {
          dv[r][k] = fmaf(prob, do_row[k], dv[r][k]);
          dk[r][k] = fmaf(ds, q_row[k], dk[r][k]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t t = k0 + first_row + r;
    if (t >= p.T) continue;
    float* dk_out = p.out + (b * p.T + t) * 3 * p.C + p.C + h * layout.hs;
    float* dv_out = dk_out + p.C;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < layout.hs) {
        dk_out[d] = dk[r][k];
        dv_out[d] = dv[r][k];
      }
    }
  }
}

// Shared memory of each float32 kernel, in bytes.
size_t forward_shared_bytes(const HeadLayout& layout) {
  return sizeof(float) * (3 * kTile * layout.stride + kTile * kTile);
}
size_t backward_query_shared_bytes(const HeadLayout& layout) {
  return sizeof(float) * (4 * kTile * layout.stride + kTile * kTile);
}
size_t backward_key_shared_bytes(const HeadLayout& layout) {
  return sizeof(float) * (4 * kTile * layout.stride + 2 * kTile * kTile + 2 * kTile);
}

// Launches `kernel` with `shared_bytes` of dynamic shared memory, opting in beyond the default 48 KiB.
template <typename Kernel>
void launch_tiled(Kernel kernel, const char* name, dim3 grid, size_t shared_bytes, const AttentionParams& p,
                  cudaStream_t stream) {
  OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  kernel<<<grid, kThreads, shared_bytes, stream>>>(p);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) detail::throw_cuda_error(status, name, __FILE__, __LINE__);
}

// The grid of one (b, h, tile) block each; CUDA bounds grid.y and grid.z by 65535.
dim3 tile_grid(int64_t B, int64_t T, int64_t NH) {
  const int64_t tiles = (T + kTile - 1) / kTile;
  OCTET_REQUIRE(NH <= 65535 && B <= 65535, "attention: at most 65535 heads and batch rows, got NH={} B={}",
                NH, B);
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(NH), static_cast<unsigned>(B));
}

AttentionParams make_params(int64_t T, int64_t C, int64_t NH) {
  OCTET_REQUIRE(NH > 0 && C > 0 && C % NH == 0,
                "attention: C must be a positive multiple of NH, got C={} NH={}", C, NH);
  const int64_t hs = C / NH;
  OCTET_REQUIRE(hs <= kAttentionMaxHeadSize, "attention: head size C/NH must be at most {}, got {}",
                kAttentionMaxHeadSize, hs);
  AttentionParams p{};
  p.T = T;
  p.C = C;
  p.NH = NH;
  p.layout = head_layout(static_cast<int>(hs));
  p.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  return p;
}

void forward_float32(const AttentionParams& p, int64_t B, cudaStream_t stream) {
  const dim3 grid = tile_grid(B, p.T, p.NH);
  const size_t shared = forward_shared_bytes(p.layout);
  switch ((p.layout.hs + kWarpSize - 1) / kWarpSize) {
    case 1:
      launch_tiled(attention_forward_kernel<1>, "attention_forward_kernel", grid, shared, p, stream);
      break;
    case 2:
      launch_tiled(attention_forward_kernel<2>, "attention_forward_kernel", grid, shared, p, stream);
      break;
    case 3:
      launch_tiled(attention_forward_kernel<3>, "attention_forward_kernel", grid, shared, p, stream);
      break;
    default:
      launch_tiled(attention_forward_kernel<4>, "attention_forward_kernel", grid, shared, p, stream);
      break;
  }
}

void backward_float32(const AttentionParams& p, int64_t B, cudaStream_t stream) {
  const dim3 grid = tile_grid(B, p.T, p.NH);
  const size_t query_shared = backward_query_shared_bytes(p.layout);
  const size_t key_shared = backward_key_shared_bytes(p.layout);
  const char* query_name = "attention_backward_query_kernel";
  const char* key_name = "attention_backward_key_kernel";
  switch ((p.layout.hs + kWarpSize - 1) / kWarpSize) {
    case 1:
      launch_tiled(attention_backward_query_kernel<1>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<1>, key_name, grid, key_shared, p, stream);
      break;
    case 2:
      launch_tiled(attention_backward_query_kernel<2>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<2>, key_name, grid, key_shared, p, stream);
      break;
    case 3:
      launch_tiled(attention_backward_query_kernel<3>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<3>, key_name, grid, key_shared, p, stream);
      break;
    default:
      launch_tiled(attention_backward_query_kernel<4>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<4>, key_name, grid, key_shared, p, stream);
      break;
  }
}

// BF16 tensor-core path: FlashAttention-2's register-resident scheme on mma.sync.m16n8k16 (bf16 operands,
// float32 accumulators). The kernels read q, k, v from a bf16 [B, T, 3C] tensor (the CUDA backend stores
// qkv so; a float32 qkv is converted into the workspace first) and, in the backward, dO packed per head
// ([B * NH][T][hs]) by a pack kernel that also computes D; they stream tiles of rows with cp.async into
// shared memory, two stages deep, so that the next tile arrives while the current one is multiplied. A
// block has warps of 16-row tiles (two tiles a warp in the forward up to hs 96, so that each K and V operand
// loaded feeds two products) and walks over tiles of kColumnTile columns (keys, or queries in the dK/dV
// kernel). Operands reach the tensor cores through ldmatrix; the scores stay in the accumulator registers,
// where the softmax runs (a row's values are spread over the four lanes of a quad, so row statistics are two
// shuffles), and are fed back as the A operand of the next product without leaving the registers: the
// accumulator layout of two adjacent 16 x 8 blocks is the A layout of one 16 x 16 block. The softmax works
// in base 2 (scores pre-multiplied by log2 e); the log-sum-exp is converted back to natural log on the way
// out. The products' loops run over the column step outermost, so that a warp has eight or more independent
// accumulator chains in flight.
//
// Forward: per query tile, S = Q K^T, online softmax, O += P V. Backward, deterministic and without atomics
// as the float32 path: dQ per query tile (S, dP = dO V^T, dS = P (dP - D), dQ += dS K), then dK, dV per key
// tile (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q); the dK/dV kernel re-reads its K and V
// operands from shared memory at each step, which saves the registers for a third block per multiprocessor.
// Causality: tiles wholly past a block's last row are never loaded; on the diagonal tile the first products
// cover every 8-column block (independent chains cost less than the skipped work saves) and a masked
// element gets a zero probability. Unlike the float32 path, that zero multiplies the element's V (or dO)
// row, so an infinite value in a future position would turn into NaN: this path assumes finite inputs.
// Needs hs % 16 == 0 and compute capability 8.0 or newer.
using Bf16 = __nv_bfloat16;

constexpr int kRowWarps = 4;
constexpr int kRowTile = 16 * kRowWarps;  // rows per block
constexpr int kMmaThreads = kRowWarps * kWarpSize;
constexpr int kColumnTile = 64;                 // columns per streamed tile
constexpr int kColumnBlocks = kColumnTile / 8;  // 8-column accumulator blocks across a tile
constexpr int kStages = 2;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// bf16 elements between staged rows: 16 bytes of padding put the eight rows an ldmatrix reads in distinct
// bank groups.
template <int kHeadSize>
constexpr int kStagedLd = kHeadSize + 8;

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared without passing through registers; `valid` false writes zeros (src-size 0).
__device__ __forceinline__ void copy_async_16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8 x 8 bf16 matrices; lane i gives the address of row i % 8 of matrix i / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const Bf16* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}
__device__ __forceinline__ void ldmatrix_x4_transposed(uint32_t (&r)[4], const Bf16* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}

// d += a (16 x 16, row) . b (16 x 8, column), float32 accumulation.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16 (round to nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// A operand: rows [row0, row0 + 16) x columns [col0, col0 + 16) of a staged tile.
template <int kLd>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const Bf16* tile, int row0, int col0) {
  const int lane = threadIdx.x % kWarpSize;
  ldmatrix_x4(a, tile + (row0 + lane % 16) * kLd + col0 + (lane / 16) * 8);
}

// B operands of two 8-column blocks n0 + [0, 8) (b[0], b[1]) and n0 + [8, 16) (b[2], b[3]) over
// k0 + [0, 16), from a tile stored [n][k]: K^T in S = Q K^T, say.
template <int kLd>
__device__ __forceinline__ void load_b_transposed(uint32_t (&b)[4], const Bf16* tile, int n0, int k0) {
  const int lane = threadIdx.x % kWarpSize;
  const int matrix = lane / 8;
  ldmatrix_x4(b, tile + (n0 + (matrix / 2) * 8 + lane % 8) * kLd + k0 + (matrix % 2) * 8);
}

// The same from a tile stored [k][n]: V in O = P V, say; ldmatrix transposes on the way.
template <int kLd>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const Bf16* tile, int k0, int n0) {
  const int lane = threadIdx.x % kWarpSize;
  const int matrix = lane / 8;
  ldmatrix_x4_transposed(b, tile + (k0 + (matrix % 2) * 8 + lane % 8) * kLd + n0 + (matrix / 2) * 8);
}

// The A operand of column step kk, i.e. accumulator blocks 2 kk and 2 kk + 1, rounded to bf16.
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&s)[kColumnBlocks][4],
                                                  int kk) {
  a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Starts copying rows [row0, row0 + kRows) of a head (row t at head + t * pitch, hs bf16 each, 16-byte
// aligned) into a staged tile; rows past T become zeros.
template <int kHeadSize, int kRows, int kBlockThreads = kMmaThreads>
__device__ __forceinline__ void stage_rows(Bf16* tile, const Bf16* head, int64_t pitch, int64_t row0,
                                           int64_t T) {
  constexpr int kChunks = kHeadSize / 8;  // 16-byte pieces of a row
  for (int index = threadIdx.x; index < kRows * kChunks; index += kBlockThreads) {
    const int row = index / kChunks;
    const int chunk = index - row * kChunks;
    const int64_t t = row0 + row;
    const bool valid = t < T;
    copy_async_16(tile + row * kStagedLd<kHeadSize> + chunk * 8, head + (valid ? t : 0) * pitch + chunk * 8,
                  valid);
  }
}

// Writes accumulators acc[hs / 8][4] (rows g and g + 8 of the warp's 16, g = lane / 4) times `factor` to
// rows row[0], row[1] below T: element (t, d) at dst[t * pitch + d].
template <int kHeadSize>
__device__ __forceinline__ void store_accumulators(float* dst, int64_t pitch, const int (&row)[2], int64_t T,
                                                   const float (&acc)[kHeadSize / 8][4],
                                                   const float (&factor)[2], bool vector) {
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= T) continue;
    float* line = dst + row[r] * pitch + 2 * c;
#pragma unroll
    for (int dj = 0; dj < kHeadSize / 8; ++dj) {
      const float x = acc[dj][2 * r] * factor[r], y = acc[dj][2 * r + 1] * factor[r];
      if (vector) {
        *reinterpret_cast<float2*>(line + dj * 8) = make_float2(x, y);
      } else {
        line[dj * 8] = x;
        line[dj * 8 + 1] = y;
      }
    }
  }
}

// 2^x on the special-function unit (ex2.approx.ftz: relative error below 2^-22, results below 2^-126
// flushed to zero): the probabilities it makes are rounded to bf16 before they are multiplied.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}

// How many of a column tile's 8-column blocks hold a column <= the last of a warp's 16 rows (rows from
// first_row, columns from first_column, both multiples of 16): 0 to kColumnBlocks, even.
__device__ __forceinline__ int blocks_up_to(int first_row, int first_column) {
  const int blocks = (first_row + 16 - first_column) / 8;
  return blocks < 0 ? 0 : (blocks > kColumnBlocks ? kColumnBlocks : blocks);
}

// One head's rows: q, k, v from the bf16 qkv [B, T, 3C] (rows 3C apart), dO from the packed workspace
// ([B * NH][T][hs], rows hs apart).
struct HeadRows {
  const Bf16* q;
  const Bf16* k;
  const Bf16* v;
  const Bf16* dout;
  int64_t pitch;  // of q, k, v
};

__device__ __forceinline__ HeadRows head_rows(const AttentionParams& p, int64_t b, int64_t h, int hs) {
  const Bf16* qkv = static_cast<const Bf16*>(p.qkv_bf16) + b * p.T * 3 * p.C + h * hs;
  const Bf16* dout = p.packed_dout == nullptr
                         ? nullptr
                         : static_cast<const Bf16*>(p.packed_dout) + (b * p.NH + h) * p.T * hs;
  return {qkv, qkv + p.C, qkv + 2 * p.C, dout, 3 * p.C};
}

// The forward's blocks: four warps of kForwardRowTiles 16-row tiles each, so that every K and V operand a
// warp loads from shared memory feeds kForwardRowTiles products. Two row tiles up to hs 96 (timed alone on
// an H100, 16% faster than one at GPT-2's hs 64); beyond, their accumulators would not fit the registers.
constexpr int kForwardThreads = kMmaThreads;
template <int kHeadSize>
constexpr int kForwardRowTiles = kHeadSize <= 96 ? 2 : 1;
template <int kHeadSize>
constexpr int kForwardRows = kRowTile* kForwardRowTiles<kHeadSize>;

// One block per (b, h, query tile); the heaviest tiles (last queries, most keys) are scheduled first.
template <int kHeadSize>
__global__ void __launch_bounds__(kForwardThreads) attention_forward_mma_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kLd = kStagedLd<kHeadSize>;
  constexpr int kSteps = kHeadSize / 16;
  constexpr int kHeadBlocks = kHeadSize / 8;
  constexpr int kTileElements = kColumnTile * kLd;
  constexpr int kM = kForwardRowTiles<kHeadSize>;
  constexpr int kRows = kForwardRows<kHeadSize>;
  extern __shared__ float4 shared_words[];
  Bf16* q_tile = reinterpret_cast<Bf16*>(shared_words);
  Bf16* kv_tiles = q_tile + kRows * kLd;  // [stage][k, v][kColumnTile][kLd]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, c = lane % 4;
  const int64_t query_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int q0 = static_cast<int>(query_tile) * kRows;
  // The warp's row tiles: m covers rows warp_row[m] + [0, 16), rows g and g + 8 of it in this lane.
  int warp_row[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) warp_row[m] = q0 + (warp * kM + m) * 16;
  const float score_scale = p.scale * kLog2e;
  const HeadRows heads = head_rows(p, b, h, kHeadSize);
  // Key tiles holding a key <= the block's last row below T.
  const int last_row = min(q0 + kRows, static_cast<int>(p.T)) - 1;
  const int key_tiles = last_row / kColumnTile + 1;

  stage_rows<kHeadSize, kRows, kForwardThreads>(q_tile, heads.q, heads.pitch, q0, p.T);
  stage_rows<kHeadSize, kColumnTile, kForwardThreads>(kv_tiles, heads.k, heads.pitch, 0, p.T);
  stage_rows<kHeadSize, kColumnTile, kForwardThreads>(kv_tiles + kTileElements, heads.v, heads.pitch, 0, p.T);
  copy_async_commit();

  uint32_t qa[kM][kSteps][4];
  float o[kM][kHeadBlocks][4];
  float row_max[kM][2], row_sum[kM][2];  // row_sum: this lane's share; the quad's are added at the end
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int dj = 0; dj < kHeadBlocks; ++dj) o[m][dj][0] = o[m][dj][1] = o[m][dj][2] = o[m][dj][3] = 0.0f;
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }

  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    if (key_tile + 1 < key_tiles) {
      Bf16* next = kv_tiles + ((key_tile + 1) % kStages) * 2 * kTileElements;
      stage_rows<kHeadSize, kColumnTile, kForwardThreads>(next, heads.k, heads.pitch,
                                                          (key_tile + 1) * kColumnTile, p.T);
      stage_rows<kHeadSize, kColumnTile, kForwardThreads>(next + kTileElements, heads.v, heads.pitch,
                                                          (key_tile + 1) * kColumnTile, p.T);
    }
    copy_async_commit();
    copy_async_wait<1>();
    __syncthreads();
    if (key_tile == 0) {
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) load_a<kLd>(qa[m][kk], q_tile, (warp * kM + m) * 16, kk * 16);
      }
    }
    const Bf16* k_tile = kv_tiles + (key_tile % kStages) * 2 * kTileElements;
    const Bf16* v_tile = k_tile + kTileElements;
    const int k0 = key_tile * kColumnTile;
    // The warp's last row tile sees the most keys of this tile.
    const int blocks = blocks_up_to(warp_row[kM - 1], k0);
    if (blocks > 0) {
      // S for every 8-column block of the tile (the causal mask below zeroes what lies above the diagonal),
      // the column step outermost so that the accumulator chains are independent.
      float s[kM][kColumnBlocks][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int j = 0; j < kColumnBlocks; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
        for (int j = 0; j < kColumnBlocks; j += 2) {
          uint32_t kb[4];
          load_b_transposed<kLd>(kb, k_tile, j * 8, kk * 16);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            mma_bf16(s[m][j], qa[m][kk], kb[0], kb[1]);
            mma_bf16(s[m][j + 1], qa[m][kk], kb[2], kb[3]);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        // Only a tile reaching past the row tile's first row needs the causal mask.
        const bool masked = k0 + kColumnTile - 1 > warp_row[m];
        const int row[2] = {warp_row[m] + g, warp_row[m] + g + 8};
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < kColumnBlocks; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e / 2;
            const bool visible = !masked || k0 + j * 8 + 2 * c + e % 2 <= row[r];
            s[m][j][e] = visible ? s[m][j][e] * score_scale : -INFINITY;
            tile_max[r] = fmaxf(tile_max[r], s[m][j][e]);
          }
        }
        float rescale[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // Finite from the first tile on: key 0 is visible to every row.
          const float new_max = fmaxf(row_max[m][r], quad_max(tile_max[r]));
          rescale[r] = fast_exp2(row_max[m][r] - new_max);
          row_max[m][r] = new_max;
          row_sum[m][r] *= rescale[r];
        }
#pragma unroll
        for (int j = 0; j < kColumnBlocks; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[m][j][e] = fast_exp2(s[m][j][e] - row_max[m][e / 2]);
            row_sum[m][e / 2] += s[m][j][e];
          }
        }
#pragma unroll
        for (int dj = 0; dj < kHeadBlocks; ++dj) {
          o[m][dj][0] *= rescale[0];
          o[m][dj][1] *= rescale[0];
          o[m][dj][2] *= rescale[1];
          o[m][dj][3] *= rescale[1];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kColumnBlocks / 2; ++kk) {
        if (2 * kk >= blocks) break;
        uint32_t pa[kM][4];
#pragma unroll
        for (int m = 0; m < kM; ++m) accumulators_as_a(pa[m], s[m], kk);
#pragma unroll
        for (int dj = 0; dj < kHeadBlocks; dj += 2) {
          uint32_t vb[4];
          load_b<kLd>(vb, v_tile, kk * 16, dj * 8);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            mma_bf16(o[m][dj], pa[m], vb[0], vb[1]);
            mma_bf16(o[m][dj + 1], pa[m], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is refilled two tiles on
  }

#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int row[2] = {warp_row[m] + g, warp_row[m] + g + 8};
    float inverse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[m][r] = quad_sum(row_sum[m][r]);
      inverse[r] = 1.0f / row_sum[m][r];
      if (c == 0 && row[r] < p.T) {
        p.lse_out[(b * p.NH + h) * p.T + row[r]] = (row_max[m][r] + log2f(row_sum[m][r])) * kLn2;
      }
    }
    store_accumulators<kHeadSize>(p.out + b * p.T * p.C + h * kHeadSize, p.C, row, p.T, o[m], inverse,
                                  p.vector);
  }
#else
  (void)p;
  __trap();  // the launcher never picks this path below compute capability 8.0
#endif
}

// dQ for one (b, h, query tile), heaviest tiles first.
template <int kHeadSize>
__global__ void __launch_bounds__(kMmaThreads) attention_backward_query_mma_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kLd = kStagedLd<kHeadSize>;
  constexpr int kSteps = kHeadSize / 16;
  constexpr int kHeadBlocks = kHeadSize / 8;
  constexpr int kTileElements = kColumnTile * kLd;
  extern __shared__ float4 shared_words[];
  Bf16* q_tile = reinterpret_cast<Bf16*>(shared_words);
  Bf16* do_tile = q_tile + kRowTile * kLd;
  Bf16* kv_tiles = do_tile + kRowTile * kLd;  // [stage][k, v][kColumnTile][kLd]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, c = lane % 4;
  const int64_t query_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int q0 = static_cast<int>(query_tile) * kRowTile;
  const int warp_row = q0 + warp * 16;
  const int row[2] = {warp_row + g, warp_row + g + 8};
  const float score_scale = p.scale * kLog2e;
  const HeadRows heads = head_rows(p, b, h, kHeadSize);
  const int last_row = min(q0 + kRowTile, static_cast<int>(p.T)) - 1;
  const int key_tiles = last_row / kColumnTile + 1;

  stage_rows<kHeadSize, kRowTile>(q_tile, heads.q, heads.pitch, q0, p.T);
  stage_rows<kHeadSize, kRowTile>(do_tile, heads.dout, kHeadSize, q0, p.T);
  stage_rows<kHeadSize, kColumnTile>(kv_tiles, heads.k, heads.pitch, 0, p.T);
  stage_rows<kHeadSize, kColumnTile>(kv_tiles + kTileElements, heads.v, heads.pitch, 0, p.T);
  copy_async_commit();

  // Rows past T have zero q and dO: their dS is zero whatever these are.
  float lse[2], dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t index = (b * p.NH + h) * p.T + row[r];
    lse[r] = row[r] < p.T ? p.lse[index] * kLog2e : 0.0f;
    dot[r] = row[r] < p.T ? p.row_dot[index] : 0.0f;
  }
  uint32_t qa[kSteps][4], da[kSteps][4];
  float dq[kHeadBlocks][4];
#pragma unroll
  for (int dj = 0; dj < kHeadBlocks; ++dj) dq[dj][0] = dq[dj][1] = dq[dj][2] = dq[dj][3] = 0.0f;

  for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
    if (key_tile + 1 < key_tiles) {
      Bf16* next = kv_tiles + ((key_tile + 1) % kStages) * 2 * kTileElements;
      stage_rows<kHeadSize, kColumnTile>(next, heads.k, heads.pitch, (key_tile + 1) * kColumnTile, p.T);
      stage_rows<kHeadSize, kColumnTile>(next + kTileElements, heads.v, heads.pitch,
                                         (key_tile + 1) * kColumnTile, p.T);
    }
    copy_async_commit();
    copy_async_wait<1>();
    __syncthreads();
    if (key_tile == 0) {
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        load_a<kLd>(qa[kk], q_tile, warp * 16, kk * 16);
        load_a<kLd>(da[kk], do_tile, warp * 16, kk * 16);
      }
    }
    const Bf16* k_tile = kv_tiles + (key_tile % kStages) * 2 * kTileElements;
    const Bf16* v_tile = k_tile + kTileElements;
    const int k0 = key_tile * kColumnTile;
    const int blocks = blocks_up_to(warp_row, k0);
    if (blocks > 0) {
      float s[kColumnBlocks][4], dp[kColumnBlocks][4];
#pragma unroll
      for (int j = 0; j < kColumnBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
        for (int j = 0; j < kColumnBlocks; j += 2) {
          uint32_t kb[4], vb[4];
          load_b_transposed<kLd>(kb, k_tile, j * 8, kk * 16);
          load_b_transposed<kLd>(vb, v_tile, j * 8, kk * 16);
          mma_bf16(s[j], qa[kk], kb[0], kb[1]);
          mma_bf16(s[j + 1], qa[kk], kb[2], kb[3]);
          mma_bf16(dp[j], da[kk], vb[0], vb[1]);
          mma_bf16(dp[j + 1], da[kk], vb[2], vb[3]);
        }
      }
      // dS = P (dP - D), kept in s.
      const bool masked = k0 + kColumnTile - 1 > warp_row;
#pragma unroll
      for (int j = 0; j < kColumnBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2;
          const bool visible = j < blocks && (!masked || k0 + j * 8 + 2 * c + e % 2 <= row[r]);
          const float prob = visible ? fast_exp2(fmaf(s[j][e], score_scale, -lse[r])) : 0.0f;
          s[j][e] = prob * (dp[j][e] - dot[r]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kColumnBlocks / 2; ++kk) {
        uint32_t dsa[4];
        accumulators_as_a(dsa, s, kk);
#pragma unroll
        for (int dj = 0; dj < kHeadBlocks; dj += 2) {
          uint32_t kb[4];
          load_b<kLd>(kb, k_tile, kk * 16, dj * 8);
          mma_bf16(dq[dj], dsa, kb[0], kb[1]);
          mma_bf16(dq[dj + 1], dsa, kb[2], kb[3]);
        }
      }
    }
    __syncthreads();
  }
  const int64_t pitch = 3 * p.C;
  const float factor[2] = {p.scale, p.scale};
  store_accumulators<kHeadSize>(p.out + b * p.T * pitch + h * kHeadSize, pitch, row, p.T, dq, factor,
                                p.vector);
#else
  (void)p;
  __trap();
#endif
}

// dK and dV for one (b, h, key tile); key tile 0 sees every query, so the heaviest come first.
template <int kHeadSize>
__global__ void __launch_bounds__(kMmaThreads, kHeadSize <= 64 ? 3 : 1)
    attention_backward_key_mma_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kLd = kStagedLd<kHeadSize>;
  constexpr int kSteps = kHeadSize / 16;
  constexpr int kHeadBlocks = kHeadSize / 8;
  constexpr int kTileElements = kColumnTile * kLd;
  extern __shared__ float4 shared_words[];
  Bf16* k_tile = reinterpret_cast<Bf16*>(shared_words);
  Bf16* v_tile = k_tile + kRowTile * kLd;
  Bf16* qd_tiles = v_tile + kRowTile * kLd;  // [stage][q, dO][kColumnTile][kLd]
  float* row_stats = reinterpret_cast<float*>(qd_tiles + kStages * 2 * kTileElements);  // [stage][lse, D][64]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, c = lane % 4;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int k0 = static_cast<int>(blockIdx.x) * kRowTile;
  const int warp_key = k0 + warp * 16;
  const int key[2] = {warp_key + g, warp_key + g + 8};
  const float score_scale = p.scale * kLog2e;
  const HeadRows heads = head_rows(p, b, h, kHeadSize);
  const int first_tile = k0 / kColumnTile;
  const int query_tiles = (static_cast<int>(p.T) + kColumnTile - 1) / kColumnTile;

  // Stages query tile `tile` (q, dO, and per query the lse in base 2 and D) into stage `stage`. A query
  // past T gets lse +inf, hence probability exp2(-inf) = 0 in every row.
  const auto stage_queries = [&](int tile, int stage) {
    Bf16* q_stage = qd_tiles + stage * 2 * kTileElements;
    stage_rows<kHeadSize, kColumnTile>(q_stage, heads.q, heads.pitch, tile * kColumnTile, p.T);
    stage_rows<kHeadSize, kColumnTile>(q_stage + kTileElements, heads.dout, kHeadSize, tile * kColumnTile,
                                       p.T);
    if (threadIdx.x < kColumnTile) {
      const int t = tile * kColumnTile + static_cast<int>(threadIdx.x);
      const int64_t index = (b * p.NH + h) * p.T + t;
      row_stats[stage * 2 * kColumnTile + threadIdx.x] = t < p.T ? p.lse[index] * kLog2e : INFINITY;
      row_stats[stage * 2 * kColumnTile + kColumnTile + threadIdx.x] = t < p.T ? p.row_dot[index] : 0.0f;
    }
  };
  stage_rows<kHeadSize, kRowTile>(k_tile, heads.k, heads.pitch, k0, p.T);
  stage_rows<kHeadSize, kRowTile>(v_tile, heads.v, heads.pitch, k0, p.T);
  stage_queries(first_tile, 0);
  copy_async_commit();

  float dk[kHeadBlocks][4], dv[kHeadBlocks][4];
#pragma unroll
  for (int dj = 0; dj < kHeadBlocks; ++dj) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dj][e] = dv[dj][e] = 0.0f;
  }

  for (int tile = first_tile; tile < query_tiles; ++tile) {
    const int stage = (tile - first_tile) % kStages;
    if (tile + 1 < query_tiles) stage_queries(tile + 1, (stage + 1) % kStages);
    copy_async_commit();
    copy_async_wait<1>();
    __syncthreads();
    const Bf16* q_tile = qd_tiles + stage * 2 * kTileElements;
    const Bf16* do_tile = q_tile + kTileElements;
    const float* lse_tile = row_stats + stage * 2 * kColumnTile;
    const float* dot_tile = lse_tile + kColumnTile;
    const int q0 = tile * kColumnTile;
    // Query blocks before the warp's first key see none of its keys: they start at block `first`.
    const int skipped = (warp_key - q0) / 8;
    const int first = skipped < 0 ? 0 : (skipped > kColumnBlocks ? kColumnBlocks : skipped);
    if (first < kColumnBlocks) {
      float s[kColumnBlocks][4], dp[kColumnBlocks][4];  // S^T and dP^T: rows are keys, columns queries
#pragma unroll
      for (int j = 0; j < kColumnBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
      }
      // K and V operands come from shared memory for each column step rather than living in registers
      // through the loop: the registers saved let three blocks share a multiprocessor.
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        uint32_t ka[4], va[4];
        load_a<kLd>(ka, k_tile, warp * 16, kk * 16);
        load_a<kLd>(va, v_tile, warp * 16, kk * 16);
#pragma unroll
        for (int j = 0; j < kColumnBlocks; j += 2) {
          uint32_t qb[4], db[4];
          load_b_transposed<kLd>(qb, q_tile, j * 8, kk * 16);
          load_b_transposed<kLd>(db, do_tile, j * 8, kk * 16);
          mma_bf16(s[j], ka, qb[0], qb[1]);
          mma_bf16(s[j + 1], ka, qb[2], qb[3]);
          mma_bf16(dp[j], va, db[0], db[1]);
          mma_bf16(dp[j + 1], va, db[2], db[3]);
        }
      }
      // P^T into s, dS^T = P^T (dP^T - D) into dp. Only a tile starting before the warp's last key needs
      // the causal mask.
      const bool masked = q0 < warp_key + 15;
#pragma unroll
      for (int j = 0; j < kColumnBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int column = j * 8 + 2 * c + e % 2;
          const bool visible = j >= first && (!masked || q0 + column >= key[e / 2]);
          const float prob = visible ? fast_exp2(fmaf(s[j][e], score_scale, -lse_tile[column])) : 0.0f;
          s[j][e] = prob;
          dp[j][e] = prob * (dp[j][e] - dot_tile[column]);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kColumnBlocks / 2; ++kk) {
        uint32_t pa[4], dsa[4];
        accumulators_as_a(pa, s, kk);
        accumulators_as_a(dsa, dp, kk);
#pragma unroll
        for (int dj = 0; dj < kHeadBlocks; dj += 2) {
          uint32_t db[4], qb[4];
          load_b<kLd>(db, do_tile, kk * 16, dj * 8);
          load_b<kLd>(qb, q_tile, kk * 16, dj * 8);
          mma_bf16(dv[dj], pa, db[0], db[1]);
          mma_bf16(dv[dj + 1], pa, db[2], db[3]);
          mma_bf16(dk[dj], dsa, qb[0], qb[1]);
          mma_bf16(dk[dj + 1], dsa, qb[2], qb[3]);
        }
      }
    }
    __syncthreads();
  }
  const int64_t pitch = 3 * p.C;
  float* dk_head = p.out + b * p.T * pitch + p.C + h * kHeadSize;
  const float dk_factor[2] = {p.scale, p.scale};
  const float dv_factor[2] = {1.0f, 1.0f};
  store_accumulators<kHeadSize>(dk_head, pitch, key, p.T, dk, dk_factor, p.vector);
  store_accumulators<kHeadSize>(dk_head + p.C, pitch, key, p.T, dv, dv_factor, p.vector);
#else
  (void)p;
  __trap();
#endif
}

// Rounds the heads of src [B, T, C] (head h at columns h * hs) to bf16 and packs them as dst [B * NH][T][hs].
// Eight elements per thread and step: one 16-byte store.
__global__ void attention_pack_kernel(Bf16* dst, const float* src, int64_t B, int64_t T, int64_t NH, int hs,
                                      bool vector) {
  const int64_t C = NH * hs;
  const int64_t groups = B * T * C / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; group < groups;
       group += stride) {
    const int64_t i = group * 8;  // element index in src: (b * T + t) * C + h * hs + d
    const int64_t bt = i / C;
    const int64_t h = (i - bt * C) / hs;
    const int64_t d = i - bt * C - h * hs;
    const int64_t b = bt / T;
    const int64_t t = bt - b * T;
    float v[8];
    if (vector) {
      const float4 lo = __ldg(reinterpret_cast<const float4*>(src + i));
      const float4 hi = __ldg(reinterpret_cast<const float4*>(src + i + 4));
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = src[i + k];
    }
    uint4 packed;
    packed.x = pack_bf16(v[0], v[1]);
    packed.y = pack_bf16(v[2], v[3]);
    packed.z = pack_bf16(v[4], v[5]);
    packed.w = pack_bf16(v[6], v[7]);
    *reinterpret_cast<uint4*>(dst + ((b * NH + h) * T + t) * hs + d) = packed;
  }
}

// The backward's dO: packed as attention_pack_kernel packs it, and D = rowsum(dO * O) per (b, h, t) from the
// same read. Eight elements per thread; the hs / 8 threads of a row (a power of two dividing 32, so that a
// row's threads sit in one aligned segment of a warp) add their partial dot products with shuffles.
__global__ void attention_pack_dout_kernel(Bf16* dst, float* row_dot, const float* dout, const float* out,
                                           int64_t B, int64_t T, int64_t NH, int hs, bool vector) {
  const int groups_per_row = hs / 8;
  const int64_t C = NH * hs;
  const int64_t groups = B * T * C / 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Whole warps run every iteration (the shuffles need all lanes); lanes past the end only add zeros.
  const int64_t warp_first =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - threadIdx.x % kWarpSize;
  for (int64_t base = warp_first; base < groups; base += stride) {
    const int64_t group = base + threadIdx.x % kWarpSize;
    const bool active = group < groups;
    float dot = 0.0f;
    int64_t i = 0;
    if (active) {
      i = group * 8;  // element index in dout: (b * T + t) * C + h * hs + d
      float v[8], o[8];
      if (vector) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(dout + i));
        const float4 b = __ldg(reinterpret_cast<const float4*>(dout + i + 4));
        const float4 c = __ldg(reinterpret_cast<const float4*>(out + i));
        const float4 d = __ldg(reinterpret_cast<const float4*>(out + i + 4));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        o[0] = c.x, o[1] = c.y, o[2] = c.z, o[3] = c.w, o[4] = d.x, o[5] = d.y, o[6] = d.z, o[7] = d.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          v[k] = dout[i + k];
          o[k] = out[i + k];
        }
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) dot = fmaf(v[k], o[k], dot);
      const int64_t bt = i / C;
      const int64_t h = (i - bt * C) / hs;
      const int64_t d = i - bt * C - h * hs;
      const int64_t b = bt / T;
      const int64_t t = bt - b * T;
      uint4 packed;
      packed.x = pack_bf16(v[0], v[1]);
      packed.y = pack_bf16(v[2], v[3]);
      packed.z = pack_bf16(v[4], v[5]);
      packed.w = pack_bf16(v[6], v[7]);
      *reinterpret_cast<uint4*>(dst + ((b * NH + h) * T + t) * hs + d) = packed;
      i = (b * NH + h) * T + t;  // the row's index in row_dot
    }
    for (int offset = groups_per_row / 2; offset > 0; offset /= 2)
      dot += __shfl_xor_sync(kFullMask, dot, offset);
    if (active && group % groups_per_row == 0) row_dot[i] = dot;
  }
}

void pack_heads(Bf16* dst, const float* src, int64_t B, int64_t T, int64_t NH, int hs, cudaStream_t stream) {
  const int64_t groups = B * T * NH * hs / 8;
  const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 65536);
  const bool vector = reinterpret_cast<uintptr_t>(src) % 16 == 0;
  attention_pack_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, src, B, T, NH, hs, vector);
  OCTET_CUDA_CHECK_LAUNCH("attention_pack_kernel");
}

// Shared memory of each tensor-core kernel, in bytes: staged rows of bf16 and floats.
size_t mma_shared_bytes(int hs, int rows, int floats) {
  return sizeof(Bf16) * static_cast<size_t>(rows) * (hs + 8) + sizeof(float) * static_cast<size_t>(floats);
}

template <int kHeadSize>
void launch_mma(const AttentionParams& p, int64_t B, bool forward, cudaStream_t stream) {
  // Positions inside a head are 32-bit in the kernels.
  OCTET_REQUIRE(p.T <= (int64_t{1} << 30) && p.NH <= 65535 && B <= 65535,
                "attention: grid too large, got T={} NH={} B={}", p.T, p.NH, B);
  auto launch = [&](auto kernel, const char* name, int rows, int threads, size_t shared_bytes) {
    const dim3 grid(static_cast<unsigned>((p.T + rows - 1) / rows), static_cast<unsigned>(p.NH),
                    static_cast<unsigned>(B));
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
    kernel<<<grid, threads, shared_bytes, stream>>>(p);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) detail::throw_cuda_error(status, name, __FILE__, __LINE__);
  };
  constexpr int kStagedColumns = kStages * 2 * kColumnTile;  // two tensors per stage
  if (forward) {
    launch(attention_forward_mma_kernel<kHeadSize>, "attention_forward_mma_kernel", kForwardRows<kHeadSize>,
           kForwardThreads, mma_shared_bytes(kHeadSize, kForwardRows<kHeadSize> + kStagedColumns, 0));
  } else {
    launch(attention_backward_query_mma_kernel<kHeadSize>, "attention_backward_query_mma_kernel", kRowTile,
           kMmaThreads, mma_shared_bytes(kHeadSize, 2 * kRowTile + kStagedColumns, 0));
    launch(attention_backward_key_mma_kernel<kHeadSize>, "attention_backward_key_mma_kernel", kRowTile,
           kMmaThreads, mma_shared_bytes(kHeadSize, 2 * kRowTile + kStagedColumns, kStagedColumns));
  }
}

void launch_mma_for_head_size(const AttentionParams& p, int64_t B, bool forward, cudaStream_t stream) {
  switch (p.layout.hs) {
    case 16:
      launch_mma<16>(p, B, forward, stream);
      break;
    case 32:
      launch_mma<32>(p, B, forward, stream);
      break;
    case 48:
      launch_mma<48>(p, B, forward, stream);
      break;
    case 64:
      launch_mma<64>(p, B, forward, stream);
      break;
    case 80:
      launch_mma<80>(p, B, forward, stream);
      break;
    case 96:
      launch_mma<96>(p, B, forward, stream);
      break;
    case 112:
      launch_mma<112>(p, B, forward, stream);
      break;
    case 128:
      launch_mma<128>(p, B, forward, stream);
      break;
    default:
      OCTET_CHECK(false, "no tensor-core attention kernel for head size {}", p.layout.hs);
  }
}

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

bool current_device_has_bf16_mma() {
  int device = 0;
  int major = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

bool use_tensor_cores(int64_t hs, const AttentionOptions& options) {
  return options.bf16 && hs % 16 == 0 && hs <= kAttentionMaxHeadSize && current_device_has_bf16_mma();
}

}  // namespace

bool attention_uses_tensor_cores(int64_t C, int64_t NH, const AttentionOptions& options) {
  return NH > 0 && C % NH == 0 && use_tensor_cores(C / NH, options);
}

uint16_t* AttentionWorkspace::reserve_packed(size_t count, cudaStream_t stream) {
  if (packed.size() < count) {
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    packed = DeviceBuffer<uint16_t>();
    packed = DeviceBuffer<uint16_t>(count);
  }
  return packed.data();
}

float* AttentionWorkspace::reserve_row_dot(size_t count, cudaStream_t stream) {
  if (row_dot.size() < count) {
    // Work already queued on the stream may still read the old block.
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    row_dot = DeviceBuffer<float>();
    row_dot = DeviceBuffer<float>(count);
  }
  return row_dot.data();
}

namespace {

// q, k, v as the kernels read them, bf16 [B, T, 3C] at a 16-byte aligned address: qkv itself where it is
// such already, otherwise converted (float32) or copied into the front of the workspace's packed block,
// which then holds `extra` more elements behind them. Returns the copy and, in *used, the elements it took.
const Bf16* bf16_qkv(const void* qkv, Dtype type, int64_t n, size_t extra, AttentionWorkspace& workspace,
                     size_t* used, cudaStream_t stream) {
  OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "attention: q, k, v in float32 or bf16, got {}",
              dtype_name(type));
  if (type == Dtype::bf16 && aligned16(qkv)) {
    *used = 0;
    workspace.reserve_packed(extra, stream);
    return static_cast<const Bf16*>(qkv);
  }
  *used = static_cast<size_t>(n);
  auto* copy = reinterpret_cast<Bf16*>(workspace.reserve_packed(static_cast<size_t>(n) + extra, stream));
  if (type == Dtype::f32) {
    convert_to_bf16(copy, static_cast<const float*>(qkv), n, stream);
  } else {
    OCTET_CUDA_CHECK(
        cudaMemcpyAsync(copy, qkv, sizeof(Bf16) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream));
  }
  return copy;
}

void check_qkv_type(Dtype type, bool tensor_cores, const char* op) {
  OCTET_CHECK(type == Dtype::f32 || (type == Dtype::bf16 && tensor_cores),
              "{}: q, k, v in bf16 need the tensor-core path (AttentionOptions::bf16, hs a multiple of 16 up "
              "to {}, compute capability 8.0 or newer); got {}",
              op, kAttentionMaxHeadSize, dtype_name(type));
}

}  // namespace

void attention_forward(float* out, float* lse, const void* qkv, Dtype qkv_type, int64_t B, int64_t T,
                       int64_t C, int64_t NH, AttentionWorkspace& workspace, const AttentionOptions& options,
                       cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0, "attention_forward: non-negative B and T, got B={} T={}", B, T);
  AttentionParams p = make_params(T, C, NH);
  if (B == 0 || T == 0) return;
  OCTET_CHECK(out != nullptr && lse != nullptr && qkv != nullptr, "attention_forward: non-null pointers");
  const bool tensor_cores = use_tensor_cores(p.layout.hs, options);
  check_qkv_type(qkv_type, tensor_cores, "attention_forward");
  p.out = out;
  p.lse_out = lse;
  if (tensor_cores) {
    p.B = B;
    p.vector = aligned16(out);
    size_t used = 0;
    p.qkv_bf16 = bf16_qkv(qkv, qkv_type, 3 * B * T * C, 0, workspace, &used, stream);
    p.packed_dout = nullptr;
    launch_mma_for_head_size(p, B, true, stream);
  } else {
    p.qkv = static_cast<const float*>(qkv);
    forward_float32(p, B, stream);
  }
}

void attention_backward(float* dqkv, const float* dout, const void* qkv, Dtype qkv_type, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        AttentionWorkspace& workspace, const AttentionOptions& options, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0, "attention_backward: non-negative B and T, got B={} T={}", B, T);
  AttentionParams p = make_params(T, C, NH);
  if (B == 0 || T == 0) return;
  OCTET_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && out != nullptr && lse != nullptr,
              "attention_backward: non-null pointers");
  const int hs = p.layout.hs;
  const bool tensor_cores = use_tensor_cores(hs, options);
  check_qkv_type(qkv_type, tensor_cores, "attention_backward");
  const int64_t rows = B * NH * T;
  float* row_dot = workspace.reserve_row_dot(static_cast<size_t>(rows), stream);
  p.out = dqkv;
  p.dout = dout;
  p.lse = lse;
  p.row_dot = row_dot;

  // D comes with the packing of dO where a row's eight-element groups divide a warp evenly.
  const bool packed_row_dot = tensor_cores && 32 % (hs / 8) == 0;
  if (!packed_row_dot) {
    const int64_t row_blocks = (rows + kWarps - 1) / kWarps;
    OCTET_REQUIRE(row_blocks <= 0x7FFFFFFF, "attention_backward: too many rows ({})", rows);
    attention_row_dot_kernel<<<static_cast<unsigned>(row_blocks), kThreads, 0, stream>>>(row_dot, dout, out,
                                                                                         rows, T, C, NH, hs);
    OCTET_CUDA_CHECK_LAUNCH("attention_row_dot_kernel");
  }
  if (tensor_cores) {
    p.B = B;
    p.vector = aligned16(dqkv);
    // The workspace: q, k, v where they need converting, then dO packed per head.
    size_t used = 0;
    p.qkv_bf16 =
        bf16_qkv(qkv, qkv_type, 3 * B * T * C, static_cast<size_t>(B * T * C), workspace, &used, stream);
    Bf16* packed_dout = reinterpret_cast<Bf16*>(workspace.packed.data()) + used;
    if (packed_row_dot) {
      const int64_t groups = B * T * C / 8;
      const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 65536);
      attention_pack_dout_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
          packed_dout, row_dot, dout, out, B, T, NH, hs, aligned16(dout) && aligned16(out));
      OCTET_CUDA_CHECK_LAUNCH("attention_pack_dout_kernel");
    } else {
      pack_heads(packed_dout, dout, B, T, NH, hs, stream);
    }
    p.packed_dout = packed_dout;
    launch_mma_for_head_size(p, B, false, stream);
  } else {
    p.qkv = static_cast<const float*>(qkv);
    backward_float32(p, B, stream);
  }
}

}  // namespace octet::cuda
