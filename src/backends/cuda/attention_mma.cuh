// What the kernels of the BF16 tensor-core path of octet's attention (attention.h) share.
//
// BF16 tensor-core path: FlashAttention-2's register-resident scheme on mma.sync.m16n8k16 (bf16 operands,
// float32 accumulators). The kernels read q, k, v from a bf16 [B, T, C + 2 KVH hs] tensor (the CUDA backend
// stores qkv so; a float32 qkv is converted into the workspace first) and, in the backward, dO packed per
// head
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
// tile of a kv head (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q), walking the query tiles of
// each query head of the kv head's group in turn with its accumulators in registers (grouped-query
// attention: a kv head's gradient summed over its group in a fixed order, with K and V staged once); the
// dK/dV kernel re-reads its K and V operands from shared memory at each step, which saves the registers for a
// third block per multiprocessor. Causality: tiles wholly past a block's last row are never loaded; on the
// diagonal tile the first products cover every 8-column block (independent chains cost less than the skipped
// work saves) and a masked element gets a zero probability. Unlike the float32 path, that zero multiplies the
// element's V (or dO) row, so an infinite value in a future position would turn into NaN: this path assumes
// finite inputs. Needs hs % 16 == 0 and compute capability 8.0 or newer.
//
// Here: the tiles' sizes, the copies into shared memory, the ldmatrix and mma.sync wrappers, the quad
// reductions and the launch; the kernels are in attention_mma_forward.cu and attention_mma_backward.cu.
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "attention_common.cuh"
#include "octet/cuda/device.h"

namespace octet::cuda::attention_internal {

inline constexpr int kRowWarps = 4;
inline constexpr int kRowTile = 16 * kRowWarps;  // rows per block
inline constexpr int kMmaThreads = kRowWarps * kWarpSize;
inline constexpr int kColumnTile = 64;                 // columns per streamed tile
inline constexpr int kColumnBlocks = kColumnTile / 8;  // 8-column accumulator blocks across a tile
inline constexpr int kStages = 2;
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// bf16 elements between staged rows: 16 bytes of padding put the eight rows an ldmatrix reads in distinct
// bank groups.
template <int kHeadSize>
inline constexpr int kStagedLd = kHeadSize + 8;

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

// One query head's rows: q, and the k and v of the kv head it reads, from the bf16 qkv [B, T, pitch] (rows
// pitch apart), dO from the packed workspace ([B * NH][T][hs], rows hs apart).
struct HeadRows {
  const Bf16* q;
  const Bf16* k;
  const Bf16* v;
  const Bf16* dout;
  int64_t pitch;  // of q, k, v
};

__device__ __forceinline__ HeadRows head_rows(const AttentionParams& p, int64_t b, int64_t h, int hs) {
  const Bf16* row = static_cast<const Bf16*>(p.qkv_bf16) + b * p.T * p.pitch;
  const Bf16* k = row + p.C + (h / p.group) * hs;
  const Bf16* dout = p.packed_dout == nullptr
                         ? nullptr
                         : static_cast<const Bf16*>(p.packed_dout) + (b * p.NH + h) * p.T * hs;
  return {row + h * hs, k, k + p.kv_C, dout, p.pitch};
}

// Two tensors of kColumnTile rows a stage.
inline constexpr int kStagedColumns = kStages * 2 * kColumnTile;

// Shared memory of each tensor-core kernel, in bytes: staged rows of bf16 and floats.
inline size_t mma_shared_bytes(int hs, int rows, int floats) {
  return sizeof(Bf16) * static_cast<size_t>(rows) * (hs + 8) + sizeof(float) * static_cast<size_t>(floats);
}

// Launches one tensor-core kernel over the (b, head, tile of `rows` rows) blocks of p and B, with
// `shared_bytes` of dynamic shared memory: `heads` heads (p.NH query heads, or p.KVH kv heads).
template <typename Kernel>
void launch_mma_kernel(Kernel kernel, const char* name, int rows, int threads, size_t shared_bytes,
                       const AttentionParams& p, int64_t B, int64_t heads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.T + rows - 1) / rows), static_cast<unsigned>(heads),
                  static_cast<unsigned>(B));
  OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  kernel<<<grid, threads, shared_bytes, stream>>>(p);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) detail::throw_cuda_error(status, name, __FILE__, __LINE__);
}

}  // namespace octet::cuda::attention_internal
