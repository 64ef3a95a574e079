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
// The BF16 tensor-core path (AttentionOptions::bf16) keeps this structure with 64-row tiles and wmma
// products; it is described where its kernels begin.
#include "attention.h"

#include <cmath>

#include <cuda_bf16.h>
#include <mma.h>

#include "octet/check.h"

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
  float* out;      // forward: out; backward: dqkv
  float* lse_out;  // forward only
  const float* qkv;
  const float* dout;     // backward only
  const float* lse;      // backward only
  const float* row_dot;  // backward only: D
  int64_t T;
  int64_t C;
  int64_t NH;
  HeadLayout layout;
  float scale;
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

// BF16 tensor-core path (nvcuda::wmma, 16 x 16 x 16 tiles with float32 accumulators). A block owns
// kMmaTile rows and walks over tiles of kMmaTile columns; each of its kMmaWarps warps owns 16 rows. Q, K, V
// and dO are staged in shared memory rounded to bf16; the scores come back through a per-warp float scratch,
// where two lanes share a row (lane / 2) and each takes half of the tile's columns for the softmax, and the
// probabilities (dS in the backward) go back to bf16 for the next product. 16-column blocks that lie wholly
// above the causal diagonal or past T are skipped. Needs hs % 16 == 0 and compute capability 8.0 or newer.
// Unlike the float32 path, a masked element inside a computed 16 x 16 block is multiplied by a zero
// probability, so an infinite V or dO in a future position would turn into NaN: this path assumes finite
// inputs.
namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16;

constexpr int kMmaTile = 64;
constexpr int kMmaWarps = kMmaTile / 16;
constexpr int kMmaThreads = kMmaWarps * kWarpSize;
constexpr int kScoreLd = kMmaTile + 4;             // float scratch rows (wmma wants a multiple of 4 floats)
constexpr int kProbLd = kMmaTile + 8;              // bf16 probability rows (a multiple of 8 bf16)
constexpr int kScratchFloats = 16 * 2 * kScoreLd;  // per warp: scores and dP, or one staged output row block
constexpr int kProbElements = 16 * kProbLd;        // per warp

static_assert(16 * (kAttentionMaxHeadSize + 4) <= kScratchFloats, "the scratch also stages a 16 x hs output");

using FragmentA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major>;
using FragmentBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major>;
using FragmentBColumn = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major>;
using FragmentAccumulator = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Every wmma pointer below is 32-byte aligned: tiles and scratch are multiples of 32 bytes long and the
// fragments start at multiples of 16 rows and 16 columns.
template <int kHeadSize>
constexpr int kMmaHeadLd = kHeadSize + 8;  // bf16 rows of the Q, K, V, dO tiles

// Rows [row0, row0 + kMmaTile) of one head, rounded to bf16, zero past T.
template <int kHeadSize>
__device__ void load_tile_bf16(Bf16* tile, const float* head, int64_t pitch, int64_t row0, int64_t T) {
  for (int index = threadIdx.x; index < kMmaTile * kHeadSize; index += kMmaThreads) {
    const int row = index / kHeadSize;
    const int d = index - row * kHeadSize;
    const int64_t t = row0 + row;
    tile[row * kMmaHeadLd<kHeadSize> + d] = __float2bfloat16(t < T ? head[t * pitch + d] : 0.0f);
  }
}

// scratch[16][kScoreLd] (columns of `blocks`) = rows[16][hs] . columns[block rows][hs]^T.
template <int kHeadSize>
__device__ __forceinline__ void mma_scores(float* scratch, const Bf16* rows, const Bf16* columns,
                                           int first_block, int end_block) {
  constexpr int kLd = kMmaHeadLd<kHeadSize>;
  for (int n = first_block; n < end_block; ++n) {
    FragmentAccumulator acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < kHeadSize / 16; ++kk) {
      FragmentA a;
      FragmentBColumn b;
      wmma::load_matrix_sync(a, rows + kk * 16, kLd);
      wmma::load_matrix_sync(b, columns + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(scratch + n * 16, acc, kScoreLd, wmma::mem_row_major);
  }
}

// acc[nn] += weights[16][blocks] . values[block rows][hs], over the 16-column blocks [first, end).
template <int kHeadSize>
__device__ __forceinline__ void mma_accumulate(FragmentAccumulator (&acc)[kHeadSize / 16],
                                               const Bf16* weights, const Bf16* values, int first_block,
                                               int end_block) {
  constexpr int kLd = kMmaHeadLd<kHeadSize>;
  for (int n = first_block; n < end_block; ++n) {
    FragmentA a;
    wmma::load_matrix_sync(a, weights + n * 16, kProbLd);
#pragma unroll
    for (int nn = 0; nn < kHeadSize / 16; ++nn) {
      FragmentBRow b;
      wmma::load_matrix_sync(b, values + n * 16 * kLd + nn * 16, kLd);
      wmma::mma_sync(acc[nn], a, b, acc[nn]);
    }
  }
}

// Writes the warp's 16 x hs accumulators to dst rows row0 + [0, 16) (pitch floats apart) below T, through
// the scratch.
template <int kHeadSize>
__device__ __forceinline__ void store_rows(float* dst, int64_t pitch, int64_t row0, int64_t T,
                                           const FragmentAccumulator (&acc)[kHeadSize / 16], float* scratch) {
  constexpr int kOutLd = kHeadSize + 4;
  __syncwarp();
#pragma unroll
  for (int nn = 0; nn < kHeadSize / 16; ++nn)
    wmma::store_matrix_sync(scratch + nn * 16, acc[nn], kOutLd, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % kWarpSize;
  for (int index = lane; index < 16 * kHeadSize; index += kWarpSize) {
    const int row = index / kHeadSize;
    const int d = index - row * kHeadSize;
    if (row0 + row < T) dst[(row0 + row) * pitch + d] = scratch[row * kOutLd + d];
  }
}

// Number of 16-column blocks of a tile starting at `first_column` that hold columns below T.
__device__ __forceinline__ int blocks_below(int64_t T, int64_t first_column) {
  const int64_t blocks = (T - first_column + 15) / 16;
  return static_cast<int>(blocks < kMmaTile / 16 ? blocks : kMmaTile / 16);
}

template <int kHeadSize>
__global__ void __launch_bounds__(kMmaThreads) attention_forward_mma_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kLd = kMmaHeadLd<kHeadSize>;
  constexpr int kHalf = kHeadSize / 2;
  constexpr int kOutLd = kHeadSize + 4;
  extern __shared__ float4 shared_words[];
  Bf16* q_tile = reinterpret_cast<Bf16*>(shared_words);
  Bf16* k_tile = q_tile + kMmaTile * kLd;
  Bf16* v_tile = k_tile + kMmaTile * kLd;
  Bf16* prob_tile = v_tile + kMmaTile * kLd;
  float* scratch = reinterpret_cast<float*>(prob_tile + kMmaWarps * kProbElements);

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row = lane / 2;
  const int half = lane % 2;
  const int64_t query_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t q0 = query_tile * kMmaTile;
  const int64_t pitch = 3 * p.C;
  const float* q_head = p.qkv + b * p.T * pitch + h * kHeadSize;
  const int64_t t = q0 + warp * 16 + row;
  float* warp_scratch = scratch + warp * kScratchFloats;
  Bf16* warp_prob = prob_tile + warp * kProbElements;

  load_tile_bf16<kHeadSize>(q_tile, q_head, pitch, q0, p.T);
  float row_max = -INFINITY, row_sum = 0.0f, acc[kHalf];
#pragma unroll
  for (int c = 0; c < kHalf; ++c) acc[c] = 0.0f;

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const int64_t k0 = key_tile * kMmaTile;
    __syncthreads();
    load_tile_bf16<kHeadSize>(k_tile, q_head + p.C, pitch, k0, p.T);
    load_tile_bf16<kHeadSize>(v_tile, q_head + 2 * p.C, pitch, k0, p.T);
    __syncthreads();
    // On the diagonal (k0 == q0) the warp's last row sees keys up to warp * 16 + 15.
    const int end_block = min(key_tile == query_tile ? warp + 1 : kMmaTile / 16, blocks_below(p.T, k0));
    mma_scores<kHeadSize>(warp_scratch, q_tile + warp * 16 * kLd, k_tile, 0, end_block);
    __syncwarp();

    float score[kMmaTile / 2];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kMmaTile / 2; ++c) {
      const int column = half * (kMmaTile / 2) + c;
      const bool visible = column < end_block * 16 && k0 + column <= t;
      score[c] = visible ? warp_scratch[row * kScoreLd + column] * p.scale : -INFINITY;
      tile_max = fmaxf(tile_max, score[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float new_max = fmaxf(row_max, tile_max);  // finite: key 0 is visible to every row
    const float rescale = expf(row_max - new_max);
    float tile_sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kMmaTile / 2; ++c) {
      const float prob = expf(score[c] - new_max);
      tile_sum += prob;
      warp_prob[row * kProbLd + half * (kMmaTile / 2) + c] = __float2bfloat16(prob);
    }
    tile_sum += __shfl_xor_sync(kFullMask, tile_sum, 1);
    row_sum = row_sum * rescale + tile_sum;
    row_max = new_max;
    __syncwarp();

    FragmentAccumulator pv[kHeadSize / 16];
#pragma unroll
    for (int nn = 0; nn < kHeadSize / 16; ++nn) wmma::fill_fragment(pv[nn], 0.0f);
    mma_accumulate<kHeadSize>(pv, warp_prob, v_tile, 0, end_block);
#pragma unroll
    for (int nn = 0; nn < kHeadSize / 16; ++nn)
      wmma::store_matrix_sync(warp_scratch + nn * 16, pv[nn], kOutLd, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kHalf; ++c) acc[c] = acc[c] * rescale + warp_scratch[row * kOutLd + half * kHalf + c];
  }

  if (t < p.T) {
    float* o = p.out + (b * p.T + t) * p.C + h * kHeadSize + half * kHalf;
#pragma unroll
    for (int c = 0; c < kHalf; ++c) o[c] = acc[c] / row_sum;
    if (half == 0) p.lse_out[(b * p.NH + h) * p.T + t] = row_max + logf(row_sum);
  }
#else
  (void)p;
  __trap();  // the launcher never picks this path below compute capability 8.0
#endif
}

template <int kHeadSize>
__global__ void __launch_bounds__(kMmaThreads) attention_backward_query_mma_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kLd = kMmaHeadLd<kHeadSize>;
  extern __shared__ float4 shared_words[];
  Bf16* q_tile = reinterpret_cast<Bf16*>(shared_words);
  Bf16* do_tile = q_tile + kMmaTile * kLd;
  Bf16* k_tile = do_tile + kMmaTile * kLd;
  Bf16* v_tile = k_tile + kMmaTile * kLd;
  Bf16* ds_tile = v_tile + kMmaTile * kLd;
  float* scratch = reinterpret_cast<float*>(ds_tile + kMmaWarps * kProbElements);

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row = lane / 2;
  const int half = lane % 2;
  const int64_t query_tile = gridDim.x - 1 - blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t q0 = query_tile * kMmaTile;
  const int64_t pitch = 3 * p.C;
  const float* q_head = p.qkv + b * p.T * pitch + h * kHeadSize;
  const int64_t t = q0 + warp * 16 + row;
  float* warp_scores = scratch + warp * kScratchFloats;
  float* warp_dprob = warp_scores + 16 * kScoreLd;
  Bf16* warp_ds = ds_tile + warp * kProbElements;

  load_tile_bf16<kHeadSize>(q_tile, q_head, pitch, q0, p.T);
  load_tile_bf16<kHeadSize>(do_tile, p.dout + b * p.T * p.C + h * kHeadSize, p.C, q0, p.T);
  const int64_t stat = (b * p.NH + h) * p.T + t;
  const float row_lse = t < p.T ? p.lse[stat] : 0.0f;
  const float row_dot = t < p.T ? p.row_dot[stat] : 0.0f;
  FragmentAccumulator dq[kHeadSize / 16];
#pragma unroll
  for (int nn = 0; nn < kHeadSize / 16; ++nn) wmma::fill_fragment(dq[nn], 0.0f);

  for (int64_t key_tile = 0; key_tile <= query_tile; ++key_tile) {
    const int64_t k0 = key_tile * kMmaTile;
    __syncthreads();
    load_tile_bf16<kHeadSize>(k_tile, q_head + p.C, pitch, k0, p.T);
    load_tile_bf16<kHeadSize>(v_tile, q_head + 2 * p.C, pitch, k0, p.T);
    __syncthreads();
    const int end_block = min(key_tile == query_tile ? warp + 1 : kMmaTile / 16, blocks_below(p.T, k0));
    mma_scores<kHeadSize>(warp_scores, q_tile + warp * 16 * kLd, k_tile, 0, end_block);
    mma_scores<kHeadSize>(warp_dprob, do_tile + warp * 16 * kLd, v_tile, 0, end_block);
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kMmaTile / 2; ++c) {
      const int column = half * (kMmaTile / 2) + c;
      const bool visible = column < end_block * 16 && k0 + column <= t;
      const float s = warp_scores[row * kScoreLd + column];
      const float dprob = warp_dprob[row * kScoreLd + column];
      const float prob = visible ? expf(s * p.scale - row_lse) : 0.0f;
      warp_ds[row * kProbLd + column] = __float2bfloat16(visible ? prob * (dprob - row_dot) * p.scale : 0.0f);
    }
    __syncwarp();
    mma_accumulate<kHeadSize>(dq, warp_ds, k_tile, 0, end_block);
  }
  store_rows<kHeadSize>(p.out + b * p.T * pitch + h * kHeadSize, pitch, q0 + warp * 16, p.T, dq, warp_scores);
#else
  (void)p;
  __trap();
#endif
}

template <int kHeadSize>
__global__ void __launch_bounds__(kMmaThreads) attention_backward_key_mma_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kLd = kMmaHeadLd<kHeadSize>;
  extern __shared__ float4 shared_words[];
  Bf16* k_tile = reinterpret_cast<Bf16*>(shared_words);
  Bf16* v_tile = k_tile + kMmaTile * kLd;
  Bf16* q_tile = v_tile + kMmaTile * kLd;
  Bf16* do_tile = q_tile + kMmaTile * kLd;
  Bf16* p_tile = do_tile + kMmaTile * kLd;
  Bf16* ds_tile = p_tile + kMmaWarps * kProbElements;
  float* scratch = reinterpret_cast<float*>(ds_tile + kMmaWarps * kProbElements);
  float* lse_tile = scratch + kMmaWarps * kScratchFloats;  // [kMmaTile]
  float* dot_tile = lse_tile + kMmaTile;                   // [kMmaTile]

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int row = lane / 2;
  const int half = lane % 2;
  const int64_t key_tile = blockIdx.x;
  const int64_t h = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t k0 = key_tile * kMmaTile;
  const int64_t pitch = 3 * p.C;
  const float* q_head = p.qkv + b * p.T * pitch + h * kHeadSize;
  const float* do_head = p.dout + b * p.T * p.C + h * kHeadSize;
  const int64_t stats = (b * p.NH + h) * p.T;
  const int64_t j = k0 + warp * 16 + row;  // this lane's key
  float* warp_scores = scratch + warp * kScratchFloats;
  float* warp_dprob = warp_scores + 16 * kScoreLd;
  Bf16* warp_p = p_tile + warp * kProbElements;
  Bf16* warp_ds = ds_tile + warp * kProbElements;

  load_tile_bf16<kHeadSize>(k_tile, q_head + p.C, pitch, k0, p.T);
  load_tile_bf16<kHeadSize>(v_tile, q_head + 2 * p.C, pitch, k0, p.T);
  FragmentAccumulator dk[kHeadSize / 16], dv[kHeadSize / 16];
#pragma unroll
  for (int nn = 0; nn < kHeadSize / 16; ++nn) {
    wmma::fill_fragment(dk[nn], 0.0f);
    wmma::fill_fragment(dv[nn], 0.0f);
  }

  const int64_t query_tiles = (p.T + kMmaTile - 1) / kMmaTile;
  for (int64_t query_tile = key_tile; query_tile < query_tiles; ++query_tile) {
    const int64_t q0 = query_tile * kMmaTile;
    __syncthreads();
    load_tile_bf16<kHeadSize>(q_tile, q_head, pitch, q0, p.T);
    load_tile_bf16<kHeadSize>(do_tile, do_head, p.C, q0, p.T);
    if (threadIdx.x < kMmaTile) {
      const bool inside = q0 + threadIdx.x < p.T;
      lse_tile[threadIdx.x] = inside ? p.lse[stats + q0 + threadIdx.x] : 0.0f;
      dot_tile[threadIdx.x] = inside ? p.row_dot[stats + q0 + threadIdx.x] : 0.0f;
    }
    __syncthreads();
    // On the diagonal (q0 == k0) the warp's first key is seen by queries from warp * 16 on.
    const int first_block = query_tile == key_tile ? warp : 0;
    const int end_block = blocks_below(p.T, q0);
    mma_scores<kHeadSize>(warp_scores, k_tile + warp * 16 * kLd, q_tile, first_block, end_block);
    mma_scores<kHeadSize>(warp_dprob, v_tile + warp * 16 * kLd, do_tile, first_block, end_block);
    __syncwarp();
#pragma unroll
    for (int c = 0; c < kMmaTile / 2; ++c) {
      const int column = half * (kMmaTile / 2) + c;
      const int64_t i = q0 + column;  // query
      const bool visible = column >= first_block * 16 && column < end_block * 16 && i >= j && i < p.T;
      const float s = warp_scores[row * kScoreLd + column];
      const float dprob = warp_dprob[row * kScoreLd + column];
      const float prob = visible ? expf(s * p.scale - lse_tile[column]) : 0.0f;
      warp_p[row * kProbLd + column] = __float2bfloat16(prob);
      warp_ds[row * kProbLd + column] =
          __float2bfloat16(visible ? prob * (dprob - dot_tile[column]) * p.scale : 0.0f);
    }
    __syncwarp();
    mma_accumulate<kHeadSize>(dv, warp_p, do_tile, first_block, end_block);
    mma_accumulate<kHeadSize>(dk, warp_ds, q_tile, first_block, end_block);
  }
  float* dk_head = p.out + b * p.T * pitch + p.C + h * kHeadSize;
  store_rows<kHeadSize>(dk_head, pitch, k0 + warp * 16, p.T, dk, warp_scores);
  store_rows<kHeadSize>(dk_head + p.C, pitch, k0 + warp * 16, p.T, dv, warp_scores);
#else
  (void)p;
  __trap();
#endif
}

// Shared memory of each tensor-core kernel, in bytes.
size_t mma_shared_bytes(int hs, int head_tiles, int prob_tiles, int extra_floats) {
  return sizeof(Bf16) * (static_cast<size_t>(head_tiles) * kMmaTile * (hs + 8) +
                         static_cast<size_t>(prob_tiles) * kMmaWarps * kProbElements) +
         sizeof(float) * (static_cast<size_t>(kMmaWarps) * kScratchFloats + extra_floats);
}

template <int kHeadSize>
void launch_mma(const AttentionParams& p, int64_t B, bool forward, cudaStream_t stream) {
  const int64_t tiles = (p.T + kMmaTile - 1) / kMmaTile;
  OCTET_REQUIRE(tiles <= 0x7FFFFFFF && p.NH <= 65535 && B <= 65535,
                "attention: grid too large, got T={} NH={} B={}", p.T, p.NH, B);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.NH), static_cast<unsigned>(B));
  auto launch = [&](auto kernel, const char* name, size_t shared_bytes) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared_bytes)));
    kernel<<<grid, kMmaThreads, shared_bytes, stream>>>(p);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) detail::throw_cuda_error(status, name, __FILE__, __LINE__);
  };
  if (forward) {
    launch(attention_forward_mma_kernel<kHeadSize>, "attention_forward_mma_kernel",
           mma_shared_bytes(kHeadSize, 3, 1, 0));
  } else {
    launch(attention_backward_query_mma_kernel<kHeadSize>, "attention_backward_query_mma_kernel",
           mma_shared_bytes(kHeadSize, 4, 1, 0));
    launch(attention_backward_key_mma_kernel<kHeadSize>, "attention_backward_key_mma_kernel",
           mma_shared_bytes(kHeadSize, 4, 2, 2 * kMmaTile));
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

float* AttentionWorkspace::reserve_row_dot(size_t count, cudaStream_t stream) {
  if (row_dot.size() < count) {
    // Work already queued on the stream may still read the old block.
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    row_dot = DeviceBuffer<float>();
    row_dot = DeviceBuffer<float>(count);
  }
  return row_dot.data();
}

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                       const AttentionOptions& options, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0, "attention_forward: non-negative B and T, got B={} T={}", B, T);
  AttentionParams p = make_params(T, C, NH);
  if (B == 0 || T == 0) return;
  OCTET_CHECK(out != nullptr && lse != nullptr && qkv != nullptr, "attention_forward: non-null pointers");
  p.out = out;
  p.lse_out = lse;
  p.qkv = qkv;
  if (use_tensor_cores(p.layout.hs, options)) {
    launch_mma_for_head_size(p, B, true, stream);
  } else {
    forward_float32(p, B, stream);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t C, int64_t NH, AttentionWorkspace& workspace,
                        const AttentionOptions& options, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0, "attention_backward: non-negative B and T, got B={} T={}", B, T);
  AttentionParams p = make_params(T, C, NH);
  if (B == 0 || T == 0) return;
  OCTET_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && out != nullptr && lse != nullptr,
              "attention_backward: non-null pointers");
  const int64_t rows = B * NH * T;
  float* row_dot = workspace.reserve_row_dot(static_cast<size_t>(rows), stream);
  p.out = dqkv;
  p.qkv = qkv;
  p.dout = dout;
  p.lse = lse;
  p.row_dot = row_dot;

  const int64_t row_blocks = (rows + kWarps - 1) / kWarps;
  OCTET_REQUIRE(row_blocks <= 0x7FFFFFFF, "attention_backward: too many rows ({})", rows);
  attention_row_dot_kernel<<<static_cast<unsigned>(row_blocks), kThreads, 0, stream>>>(
      row_dot, dout, out, rows, T, C, NH, p.layout.hs);
  OCTET_CUDA_CHECK_LAUNCH("attention_row_dot_kernel");
  if (use_tensor_cores(p.layout.hs, options)) {
    launch_mma_for_head_size(p, B, false, stream);
  } else {
    backward_float32(p, B, stream);
  }
}

}  // namespace octet::cuda
