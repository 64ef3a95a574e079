// The float32 path of octet's attention (attention.h): its kernels and their launchers.
//
// Every kernel has the same shape: a block owns kTile "rows" (queries in the forward and the dQ kernel, keys
// in the dK/dV kernel), each of its kWarps warps kRowsPerWarp of them, and walks over tiles of kTile
// "columns" (keys, or queries) staged in shared memory. In the score phase lane j holds column j and computes
// its dot products with the warp's rows; the row statistics are warp reductions. In the accumulation phase
// the lanes split the head dimension (lane owns d = lane + 32 k) and sum over the tile's columns in order.
// Tiles above the causal diagonal are never visited, and on the diagonal a masked element is skipped rather
// than multiplied by zero, so a non-finite value in a future position cannot leak into an earlier row (the
// CPU reference never reads it either).
//
// The backward is three kernels and no atomics: D = rowsum(dO * O); dQ per query tile looping over key
// tiles; dK, dV per key tile looping over query tiles. Each output element is written by one thread after a
// fixed-order sum, so repeated runs are bit-identical.
//
// The BF16 tensor-core path (AttentionOptions::bf16) keeps this structure with 64-row tiles and mma.sync
// products whose scores never leave the registers; attention_mma.cuh describes it.
#include <cmath>

#include "attention_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"

namespace octet::cuda::attention_internal {
namespace {

constexpr int kTile = 32;  // rows per block and columns per tile: one column per lane
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr int kThreads = kWarps * kWarpSize;

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
  const int64_t pitch = p.pitch;
  const float* q_head = p.qkv + b * p.T * pitch + h * layout.hs;
  const float* k_head = p.qkv + b * p.T * pitch + p.C + (h / p.group) * layout.hs;
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
    load_tile(k_tile, k_head, pitch, key_tile * kTile, p.T, layout);
    load_tile(v_tile, k_head + p.kv_C, pitch, key_tile * kTile, p.T, layout);
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
  const int64_t pitch = p.pitch;
  const float* q_head = p.qkv + b * p.T * pitch + h * layout.hs;
  const float* k_head = p.qkv + b * p.T * pitch + p.C + (h / p.group) * layout.hs;
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
    load_tile(k_tile, k_head, pitch, key_tile * kTile, p.T, layout);
    load_tile(v_tile, k_head + p.kv_C, pitch, key_tile * kTile, p.T, layout);
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
    float* dq = p.out + (b * p.T + t) * p.pitch + h * layout.hs;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = lane + k * kWarpSize;
      if (d < layout.hs) dq[d] = acc[r][k];
    }
  }
}

// dK, dV for one (b, kv head, key tile): dv_j = sum_t p_tj do_t and dk_j = scale * sum_t p_tj (dp_tj - D_t)
// q_t over the queries t >= j of every query head of the kv head's group, head by head in order (one sum per
// element, in a fixed order: the group's gradient without atomics). Rows are keys here and the lanes hold
// queries.
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
  const int64_t kv_head = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int64_t k0 = key_tile * kTile;
  const int64_t pitch = p.pitch;
  const float* k_head = p.qkv + b * p.T * pitch + p.C + kv_head * layout.hs;
  const int first_row = warp * kRowsPerWarp;
  float* warp_p = p_tile + first_row * kTile;
  float* warp_ds = ds_tile + first_row * kTile;

  load_tile(k_tile, k_head, pitch, k0, p.T, layout);
  load_tile(v_tile, k_head + p.kv_C, pitch, k0, p.T, layout);

  float dk[kRowsPerWarp][kDimsPerLane], dv[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) dk[r][k] = dv[r][k] = 0.0f;
  }

  const int64_t query_tiles = (p.T + kTile - 1) / kTile;
  for (int64_t h = kv_head * p.group; h < (kv_head + 1) * p.group; ++h) {
    const float* q_head = p.qkv + b * p.T * pitch + h * layout.hs;
    const float* do_head = p.dout + b * p.T * p.C + h * layout.hs;
    const int64_t stats = (b * p.NH + h) * p.T;
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
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t t = k0 + first_row + r;
    if (t >= p.T) continue;
    float* dk_out = p.out + (b * p.T + t) * p.pitch + p.C + kv_head * layout.hs;
    float* dv_out = dk_out + p.kv_C;
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

}  // namespace

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
  const dim3 key_grid = tile_grid(B, p.T, p.KVH);
  const size_t query_shared = backward_query_shared_bytes(p.layout);
  const size_t key_shared = backward_key_shared_bytes(p.layout);
  const char* query_name = "attention_backward_query_kernel";
  const char* key_name = "attention_backward_key_kernel";
  switch ((p.layout.hs + kWarpSize - 1) / kWarpSize) {
    case 1:
      launch_tiled(attention_backward_query_kernel<1>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<1>, key_name, key_grid, key_shared, p, stream);
      break;
    case 2:
      launch_tiled(attention_backward_query_kernel<2>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<2>, key_name, key_grid, key_shared, p, stream);
      break;
    case 3:
      launch_tiled(attention_backward_query_kernel<3>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<3>, key_name, key_grid, key_shared, p, stream);
      break;
    default:
      launch_tiled(attention_backward_query_kernel<4>, query_name, grid, query_shared, p, stream);
      launch_tiled(attention_backward_key_kernel<4>, key_name, key_grid, key_shared, p, stream);
      break;
  }
}

void launch_row_dot(float* row_dot, const float* dout, const float* out, int64_t rows, int64_t T, int64_t C,
                    int64_t NH, int hs, cudaStream_t stream) {
  const int64_t row_blocks = (rows + kWarps - 1) / kWarps;
  OCTET_REQUIRE(row_blocks <= 0x7FFFFFFF, "attention_backward: too many rows ({})", rows);
  attention_row_dot_kernel<<<static_cast<unsigned>(row_blocks), kThreads, 0, stream>>>(row_dot, dout, out,
                                                                                       rows, T, C, NH, hs);
  OCTET_CUDA_CHECK_LAUNCH("attention_row_dot_kernel");
}

}  // namespace octet::cuda::attention_internal
