// The forward of the BF16 tensor-core attention (attention_mma.cuh describes the scheme): per query tile,
// S = Q K^T, the online softmax, O += P V.
#include <cmath>

#include "attention_common.cuh"
#include "attention_mma.cuh"
#include "octet/cuda/device.h"

namespace octet::cuda::attention_internal {
namespace {

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

}  // namespace

template <int kHeadSize>
void launch_mma_forward(const AttentionParams& p, int64_t B, cudaStream_t stream) {
  launch_mma_kernel(attention_forward_mma_kernel<kHeadSize>, "attention_forward_mma_kernel",
                    kForwardRows<kHeadSize>, kForwardThreads,
                    mma_shared_bytes(kHeadSize, kForwardRows<kHeadSize> + kStagedColumns, 0), p, B, p.NH,
                    stream);
}

template void launch_mma_forward<16>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<32>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<48>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<64>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<80>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<96>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<112>(const AttentionParams& p, int64_t B, cudaStream_t stream);
template void launch_mma_forward<128>(const AttentionParams& p, int64_t B, cudaStream_t stream);

}  // namespace octet::cuda::attention_internal
