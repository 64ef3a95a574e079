// FP8 codes transposed byte for byte (transpose_codes, fused.h): the transposed tensor's cast under a
// per-tensor scale. 32-bit words where the shape and the pointers allow, else bytes through 32 x 32 tiles,
// which is also how the fused LayerNorm cast transposes rows too wide to stage (fused_layernorm.cu).
#include "fused.h"

#include <cstdint>

#include "fused_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"

namespace octet::cuda {
namespace {

using fused_internal::aligned;
using fused_internal::grid_size;
using fused_internal::kThreads;
using fused_internal::resident_blocks;
using fused_internal::transpose_code_bytes;

constexpr int kTransposeTile = 32;             // byte-transpose fallback: 32 x 32 tiles,
constexpr int kTransposeRowsPerPass = 8;       // 32 x 8 threads
constexpr int kWordTile = 64;                  // transpose_codes in words: 64 x 64 byte tiles,
constexpr int kWordTileWords = kWordTile / 4;  // 16 words a tile row

// codes [rows, cols] -> transposed [cols, rows], 32 x 32 tiles through shared memory (as cast.cu's tiled
// kernel, on bytes): the fallback for rows too wide to stage.
__global__ void __launch_bounds__(kTransposeTile* kTransposeRowsPerPass)
    transpose_codes_kernel(const uint8_t* codes, uint8_t* transposed, int64_t rows, int64_t cols) {
  __shared__ uint32_t tile[kTransposeTile][kTransposeTile + 1];
  const int64_t tile_cols = (cols + kTransposeTile - 1) / kTransposeTile;
  const int64_t tiles = ((rows + kTransposeTile - 1) / kTransposeTile) * tile_cols;
  for (int64_t index = blockIdx.x; index < tiles; index += gridDim.x) {
    const int64_t row0 = (index / tile_cols) * kTransposeTile;
    const int64_t col0 = (index % tile_cols) * kTransposeTile;
    for (int k = static_cast<int>(threadIdx.y); k < kTransposeTile; k += kTransposeRowsPerPass) {
      const int64_t r = row0 + k;
      const int64_t c = col0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = codes[r * cols + c];
    }
    __syncthreads();
    for (int k = static_cast<int>(threadIdx.y); k < kTransposeTile; k += kTransposeRowsPerPass) {
      const int64_t c = col0 + k;
      const int64_t r = row0 + threadIdx.x;
      if (r < rows && c < cols) transposed[c * rows + r] = static_cast<uint8_t>(tile[threadIdx.x][k]);
    }
    __syncthreads();
  }
}

// transpose_codes in 32-bit words: a block stages a 64 x 64 byte tile as 64 rows of 16 words (a padding word
// a row), then writes each of its 64 columns as 16 words, a word holding four rows' bytes of one column.
// rows and cols are multiples of 4, so a word lies wholly inside the tensor or wholly outside.
__global__ void __launch_bounds__(kThreads)
    transpose_code_words_kernel(const uint8_t* __restrict__ codes, uint8_t* __restrict__ transposed,
                                int64_t rows, int64_t cols) {
  __shared__ uint32_t tile[kWordTile][kWordTileWords + 1];
  const int64_t tile_cols = (cols + kWordTile - 1) / kWordTile;
  const int64_t tiles = ((rows + kWordTile - 1) / kWordTile) * tile_cols;
  for (int64_t index = blockIdx.x; index < tiles; index += gridDim.x) {
    const int64_t row0 = index / tile_cols * kWordTile, col0 = index % tile_cols * kWordTile;
    for (int i = static_cast<int>(threadIdx.x); i < kWordTile * kWordTileWords; i += kThreads) {
      const int r = i / kWordTileWords, w = i % kWordTileWords;
      const int64_t row = row0 + r, col = col0 + 4 * w;
      if (row < rows && col < cols) tile[r][w] = *reinterpret_cast<const uint32_t*>(codes + row * cols + col);
    }
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < kWordTile * kWordTileWords; i += kThreads) {
      const int c = i / kWordTileWords, w = i % kWordTileWords;  // tile column c, tile rows 4w .. 4w + 3
      const int64_t col = col0 + c, row = row0 + 4 * w;
      if (col >= cols || row >= rows) continue;
      const int shift = 8 * (c % 4);  // byte c % 4 of its word (little endian)
      uint32_t word = 0;
      for (int b = 0; b < 4; ++b) word |= ((tile[4 * w + b][c / 4] >> shift) & 0xFFu) << (8 * b);
      *reinterpret_cast<uint32_t*>(transposed + col * rows + row) = word;
    }
    __syncthreads();
  }
}

}  // namespace

namespace fused_internal {

void transpose_code_bytes(const uint8_t* codes, uint8_t* transposed, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
  const int64_t tiles =
      ((rows + kTransposeTile - 1) / kTransposeTile) * ((cols + kTransposeTile - 1) / kTransposeTile);
  transpose_codes_kernel<<<grid_size(tiles, 1), dim3(kTransposeTile, kTransposeRowsPerPass), 0, stream>>>(
      codes, transposed, rows, cols);
}

}  // namespace fused_internal

void transpose_codes(const uint8_t* codes, uint8_t* transposed, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "transpose_codes: a shape of {} x {}", rows, cols);
  if (rows == 0 || cols == 0) return;
  OCTET_REQUIRE(codes != nullptr && transposed != nullptr,
                "transpose_codes: codes and transposed are needed");
  const auto* first = codes;
  const auto* last = codes + rows * cols;
  OCTET_REQUIRE(transposed + rows * cols <= first || transposed >= last,
                "transpose_codes: the output must not overlap the codes");
  if (rows % 4 == 0 && cols % 4 == 0 && aligned(codes, 4) && aligned(transposed, 4)) {
    const int64_t tiles = ((rows + kWordTile - 1) / kWordTile) * ((cols + kWordTile - 1) / kWordTile);
    transpose_code_words_kernel<<<grid_size(tiles, 1, resident_blocks(transpose_code_words_kernel)), kThreads,
                                  0, stream>>>(codes, transposed, rows, cols);
    OCTET_CUDA_CHECK_LAUNCH("transpose_codes");
    return;
  }
  transpose_code_bytes(codes, transposed, rows, cols, stream);
  OCTET_CUDA_CHECK_LAUNCH("transpose_codes");
}

}  // namespace octet::cuda
