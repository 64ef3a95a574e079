// The backward of the BF16 tensor-core attention (attention_mma.cuh describes the scheme), deterministic and
// without atomics: dQ per query tile, then dK, dV per key tile; and the packing of dO head by head that they
// read, with D = rowsum(dO * O) from the same pass where a row's groups divide a warp.
#include <algorithm>
#include <cmath>

#include "attention_common.cuh"
#include "attention_mma.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"

namespace octet::cuda::attention_internal {
namespace {

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
  const float factor[2] = {p.scale, p.scale};
  store_accumulators<kHeadSize>(p.out + b * p.T * p.pitch + h * kHeadSize, p.pitch, row, p.T, dq, factor,
                                p.vector);
#else
  (void)p;
  __trap();
#endif
}

// dK and dV for one (b, kv head, key tile), over the query tiles of each query head of its group in turn;
// key tile 0 sees every query, so the heaviest come first.
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
  const int64_t kv_head = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int k0 = static_cast<int>(blockIdx.x) * kRowTile;
  const int warp_key = k0 + warp * 16;
  const int key[2] = {warp_key + g, warp_key + g + 8};
  const float score_scale = p.scale * kLog2e;
  const int64_t first_head = kv_head * p.group;  // the group's query heads: first_head + [0, group)
  const HeadRows heads = head_rows(p, b, first_head, kHeadSize);  // k and v: the kv head's
  const int first_tile = k0 / kColumnTile;
  const int query_tiles = (static_cast<int>(p.T) + kColumnTile - 1) / kColumnTile;
  // The block's steps: query tiles first_tile .. query_tiles - 1 of each query head of the group in turn.
  const int head_tiles = query_tiles - first_tile;
  const int steps = head_tiles * static_cast<int>(p.group);

  // Stages step `step`'s query tile (q, dO, and per query the lse in base 2 and D) into stage `stage`. A
  // query past T gets lse +inf, hence probability exp2(-inf) = 0 in every row.
  const auto stage_queries = [&](int step, int stage) {
    const int64_t h = first_head + step / head_tiles;
    const int tile = first_tile + step % head_tiles;
    const Bf16* q_head = heads.q + (h - first_head) * kHeadSize;
    const Bf16* do_head = heads.dout + (h - first_head) * p.T * kHeadSize;
    Bf16* q_stage = qd_tiles + stage * 2 * kTileElements;
    stage_rows<kHeadSize, kColumnTile>(q_stage, q_head, heads.pitch, tile * kColumnTile, p.T);
    stage_rows<kHeadSize, kColumnTile>(q_stage + kTileElements, do_head, kHeadSize, tile * kColumnTile, p.T);
    if (threadIdx.x < kColumnTile) {
      const int t = tile * kColumnTile + static_cast<int>(threadIdx.x);
      const int64_t index = (b * p.NH + h) * p.T + t;
      row_stats[stage * 2 * kColumnTile + threadIdx.x] = t < p.T ? p.lse[index] * kLog2e : INFINITY;
      row_stats[stage * 2 * kColumnTile + kColumnTile + threadIdx.x] = t < p.T ? p.row_dot[index] : 0.0f;
    }
  };
  stage_rows<kHeadSize, kRowTile>(k_tile, heads.k, heads.pitch, k0, p.T);
  stage_rows<kHeadSize, kRowTile>(v_tile, heads.v, heads.pitch, k0, p.T);
  stage_queries(0, 0);
  copy_async_commit();

  float dk[kHeadBlocks][4], dv[kHeadBlocks][4];
#pragma unroll
  for (int dj = 0; dj < kHeadBlocks; ++dj) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dj][e] = dv[dj][e] = 0.0f;
  }

  for (int step = 0; step < steps; ++step) {
    const int stage = step % kStages;
    const int tile = first_tile + step % head_tiles;
    if (step + 1 < steps) stage_queries(step + 1, (stage + 1) % kStages);
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
  float* dk_head = p.out + b * p.T * p.pitch + p.C + kv_head * kHeadSize;
  const float dk_factor[2] = {p.scale, p.scale};
  const float dv_factor[2] = {1.0f, 1.0f};
  store_accumulators<kHeadSize>(dk_head, p.pitch, key, p.T, dk, dk_factor, p.vector);
  store_accumulators<kHeadSize>(dk_head + p.kv_C, p.pitch, key, p.T, dv, dv_factor, p.vector);
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

}  // namespace

void pack_heads(Bf16* dst, const float* src, int64_t B, int64_t T, int64_t NH, int hs, cudaStream_t stream) {
  const int64_t groups = B * T * NH * hs / 8;
  const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 65536);
  const bool vector = reinterpret_cast<uintptr_t>(src) % 16 == 0;
  attention_pack_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, src, B, T, NH, hs, vector);
  OCTET_CUDA_CHECK_LAUNCH("attention_pack_kernel");
}

void launch_pack_dout(Bf16* dst, float* row_dot, const float* dout, const float* out, int64_t B, int64_t T,
                      int64_t C, int64_t NH, int hs, bool vector, cudaStream_t stream) {
  const int64_t groups = B * T * C / 8;
  const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 65536);
  attention_pack_dout_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, row_dot, dout, out, B, T,
                                                                                NH, hs, vector);
  OCTET_CUDA_CHECK_LAUNCH("attention_pack_dout_kernel");
}

template <int kHeadSize>
void launch_mma_backward(const AttentionParams& p, int64_t B, cudaStream_t stream) {
  launch_mma_kernel(attention_backward_query_mma_kernel<kHeadSize>, "attention_backward_query_mma_kernel",
                    kRowTile, kMmaThreads, mma_shared_bytes(kHeadSize, 2 * kRowTile + kStagedColumns, 0), p,
                    B, p.NH, stream);
  launch_mma_kernel(attention_backward_key_mma_kernel<kHeadSize>, "attention_backward_key_mma_kernel",
                    kRowTile, kMmaThreads,
                    mma_shared_bytes(kHeadSize, 2 * kRowTile + kStagedColumns, kStagedColumns), p, B, p.KVH,
                    stream);
}

template void launch_mma_backward<16>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<32>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<48>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<64>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<80>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<96>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<112>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_backward<128>(const AttentionParams& p, int64_t B, cudaStream_t stream);

}  // namespace octet::cuda::attention_internal
