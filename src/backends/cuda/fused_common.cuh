// What the files of the producer-fused FP8 casts (fused.h, a file per family) share: the cast of a pack of
// values and the writer of a staged tile's transposed codes, the element-wise producers' kernels (row-major
// codes, or tiles with transposed codes and column sums) and their launcher, and the host-side checks. The
// op's arithmetic is elementwise.cuh's, the code that the unfused ops' kernels run (the same round-to-nearest
// intrinsics, the same reduction order), and the cast is cast_element.cuh, the step cast_amax runs, so every
// byte and count matches the unfused pair. Each family's file gives the bytes it moves per element.
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "cast_element.cuh"
#include "column_sum.h"
#include "elementwise.cuh"
#include "fused.h"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/numerics/format.h"
#include "ops_common.cuh"

namespace octet::cuda::fused_internal {

using cast_internal::flush_tally;
using cast_internal::Tally;
using cast_internal::write_scale_inv;
using elementwise::Pack;
using ops_internal::device_attribute;

inline constexpr int kThreads = 256;                // flat and element-wise tile kernels
inline constexpr int kBlocksPerMultiprocessor = 8;  // 8 x 256 threads fill a Hopper multiprocessor

// The fused casts take no CastOptions: they are cast_amax's defaults.
inline constexpr Overflow kOverflow = CastOptions{}.overflow;
static_assert(CastOptions{}.rounding == Rounding::nearest_even, "the fused casts round to nearest even");

// Transposed tiles: kTileRows rows, so that each column of a tile is one 32-byte segment of the transposed
// codes (a full sector). Codes are staged in shared memory as rows of `stride` bytes, stride = 4 x odd: the
// transposed writer reads four rows of one column per thread, and with that stride the eight row groups of
// a warp land in eight different banks.
inline constexpr int kTileRows = 32;
inline constexpr int kTileCols = 128;                  // element-wise tiles: a warp reads one row, 32 float4
inline constexpr int64_t kTileStride = kTileCols + 4;  // 132 = 4 x 33

// The codes of W values, code k in byte k (little endian: one 32-bit store writes them in order).
template <Dtype Format, int W>
__device__ __forceinline__ uint32_t cast_pack(const Pack<W>& x, float scale, Tally& t) {
  return cast_internal::cast_elements<Format, false, W>(x.v, scale, kOverflow, 0, 0, t);
}

// W codes to `to`: one 32-bit store when `as_word` (W == 4 and `to` 4-byte aligned), else byte by byte.
template <int W>
__device__ __forceinline__ void store_codes(uint8_t* to, uint32_t word, bool as_word) {
  if (W == 4 && as_word) {
    *reinterpret_cast<uint32_t*>(to) = word;
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) to[k] = static_cast<uint8_t>(word >> (8 * k));
  }
}

// The transposed codes of one staged tile (rows_in_tile x cols_in_tile codes, row r at staged + r * stride):
// column c goes to transposed[(col0 + c) * rows + row0 + r].
//
// With `as_words` (rows % 4 == 0 and the output 4-byte aligned) a thread takes a 4 x 4 block: four 32-bit
// shared loads (rows r .. r+3, columns c .. c+3), a byte transpose in six permutes, and four 32-bit stores,
// one per column. The eight lanes of one column group cover its 32 rows, so a warp writes four whole 32-byte
// column segments per store; and with a stride of 4 x odd bytes the 32 lanes' loads fall in 32 different
// banks. Otherwise a thread writes four rows of one column byte by byte.
__device__ __forceinline__ void write_transposed_tile(const uint8_t* staged, int64_t stride, int rows_in_tile,
                                                      int cols_in_tile, uint8_t* transposed, int64_t rows,
                                                      int64_t row0, int64_t col0, bool as_words) {
  constexpr int kGroups = kTileRows / 4;
  if (as_words) {
    const unsigned col_groups = (static_cast<unsigned>(cols_in_tile) + 3u) / 4u;
    for (unsigned j = threadIdx.x; j < col_groups * kGroups; j += blockDim.x) {
      const int r = static_cast<int>(4u * (j % kGroups));
      const int c = static_cast<int>(4u * (j / kGroups));
      if (r >= rows_in_tile) continue;
      const uint8_t* s = staged + r * stride + c;
      const uint32_t w0 = *reinterpret_cast<const uint32_t*>(s);
      const uint32_t w1 = *reinterpret_cast<const uint32_t*>(s + stride);
      const uint32_t w2 = *reinterpret_cast<const uint32_t*>(s + 2 * stride);
      const uint32_t w3 = *reinterpret_cast<const uint32_t*>(s + 3 * stride);
      // Interleave rows pairwise (columns 0, 1 and 2, 3), then the pairs: word k holds column k's rows.
      const uint32_t low01 = __byte_perm(w0, w1, 0x5140), high01 = __byte_perm(w0, w1, 0x7362);
      const uint32_t low23 = __byte_perm(w2, w3, 0x5140), high23 = __byte_perm(w2, w3, 0x7362);
      const uint32_t columns[4] = {__byte_perm(low01, low23, 0x5410), __byte_perm(low01, low23, 0x7632),
                                   __byte_perm(high01, high23, 0x5410), __byte_perm(high01, high23, 0x7632)};
      // Column c + k's segment is `rows` bytes past column c + k - 1's.
      uint8_t* d = transposed + (col0 + c) * rows + row0 + r;
      if (c + 4 <= cols_in_tile) {
#pragma unroll
        for (int k = 0; k < 4; ++k, d += rows) *reinterpret_cast<uint32_t*>(d) = columns[k];
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k, d += rows) {
          if (c + k < cols_in_tile) *reinterpret_cast<uint32_t*>(d) = columns[k];
        }
      }
    }
    return;
  }
  for (int j = static_cast<int>(threadIdx.x); j < cols_in_tile * kGroups; j += static_cast<int>(blockDim.x)) {
    const int c = j / kGroups;
    const int r = 4 * (j % kGroups);
    if (r >= rows_in_tile) continue;
    const uint8_t* s = staged + r * stride + c;
    uint8_t* d = transposed + (col0 + c) * rows + row0 + r;
    for (int k = 0; k < 4 && r + k < rows_in_tile; ++k) d[k] = s[k * stride];
  }
}

// ---------------------------------------------------------------------------------------------------------
// Element-wise producers, in two steps: load<W>(i) reads what elements i .. i+W-1 need (Loaded<W>, the raw
// bits: bf16 stays 2 bytes a value until it is used), finish<W>(loaded, i) computes them, stores the op's own
// outputs and returns the values to cast. The tiled kernel loads a thread's four rows of a tile before it
// finishes any of them: a store may alias a later load as far as the compiler knows, so one load-compute-
// store step per row would leave one load in flight per thread, which bounds these kernels by DRAM latency
// rather than bandwidth. A producer whose four rows of loads would cost more registers than the latency
// they hide says so (kLoadRowsFirst = false: AdamW, 16 floats a row, measured slower loading first). Each
// producer lives with its op: fused_gelu.cu, fused_adamw.cu, and fused_gradient_cast.cu for values cast as
// they are stored.

// Elements i .. i+W-1 of a producer: its two steps back to back.
template <int W, typename Producer>
__device__ __forceinline__ Pack<W> produce(const Producer& producer, int64_t i) {
  return producer.template finish<W>(producer.template load<W>(i), i);
}

// Row-major codes only: a grid-stride loop over groups of four (float4 loads, one 32-bit store of codes;
// `groups` = n / 4 when every pointer allows it, else 0), then the rest one by one.
template <Dtype Format, typename Producer>
__global__ void __launch_bounds__(kThreads)
    produce_cast_kernel(const Producer producer, const FusedCast cast, int64_t groups, int64_t n) {
  const float scale = *cast.scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  Tally t{};
  uint32_t* output4 = reinterpret_cast<uint32_t*>(cast.output);
  for (int64_t g = first; g < groups; g += stride) {
    output4[g] = cast_pack<Format>(produce<4>(producer, g * 4), scale, t);
  }
  for (int64_t i = groups * 4 + first; i < n; i += stride) {
    cast.output[i] = static_cast<uint8_t>(cast_pack<Format>(produce<1>(producer, i), scale, t));
  }
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

// Row-major and transposed codes, one kTileRows x kTileCols tile at (row0, col0) by a block of kThreads. A
// warp produces one tile row of 128 values (float4 loads when Vector: cols % 4 == 0 and every pointer
// aligned), writes their codes row-major and stages them; the block then writes the tile's 128 columns as
// 32-byte segments (when cast.output_transposed is not null).
//
// With ColumnSums, the block also writes the sum of each column of the produced values over the tile's rows
// to column_partials[tile row, column] ([ceil(rows / kTileRows), cols]), in a fixed order: a thread always
// takes the same four columns (kThreads is a multiple of the groups per row), in rows r, r + 8, r + 16,
// r + 24 of the tile, adding them in that order; the eight row groups' sums are then added in order.
constexpr int kGroupsPerRow = kTileCols / 4;
constexpr int kRowGroups = kThreads / kGroupsPerRow;
constexpr int kRowsPerThread = kTileRows / kRowGroups;
static_assert(kThreads % kGroupsPerRow == 0 && kTileRows % kRowGroups == 0,
              "each thread keeps to four columns of a tile");

// A tile's shared memory: its staged codes and, with ColumnSums, the row groups' column sums.
template <bool ColumnSums>
using GroupSums = float[ColumnSums ? kRowGroups : 1][ColumnSums ? kTileCols : 4];

// A thread's four columns c .. c+3 and first row of a tile; it then takes rows r, r + kRowGroups, ...
__device__ __forceinline__ int tile_column_of_thread() {
  return 4 * (static_cast<int>(threadIdx.x) % kGroupsPerRow);
}
__device__ __forceinline__ int tile_row_of_thread() {
  return static_cast<int>(threadIdx.x) / kGroupsPerRow;
}

template <Dtype Format, bool Vector, bool ColumnSums, typename Producer>
__device__ __forceinline__ void produce_tile(const Producer& producer, const FusedCast& cast, float scale,
                                             int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                                             bool transposed_words, float* column_partials, int c,
                                             int r_first, uint8_t* staged, GroupSums<ColumnSums>& group_sums,
                                             Tally& t) {
  float sums[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // ColumnSums: columns c .. c+3 of this thread's rows
  const int64_t col = col0 + c;
  if (col < cols) {
    // Vector: every row's loads first where the producer asks for it (see the producers).
    constexpr bool kLoadFirst = Vector && Producer::kLoadRowsFirst;
    [[maybe_unused]] typename Producer::template Loaded<4> loaded[kLoadFirst ? kRowsPerThread : 1];
    if constexpr (kLoadFirst) {
#pragma unroll
      for (int k = 0; k < kRowsPerThread; ++k) {
        if (row0 + r_first + k * kRowGroups < rows)
          loaded[k] = producer.template load<4>((row0 + r_first + k * kRowGroups) * cols + col);
      }
    }
    int64_t i = (row0 + r_first) * cols + col;
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k, i += kRowGroups * cols) {
      const int r = r_first + k * kRowGroups;
      if (row0 + r >= rows) break;
      uint8_t* s = staged + r * kTileStride + c;
      if constexpr (Vector) {
        Pack<4> p;
        if constexpr (kLoadFirst) {
          p = producer.template finish<4>(loaded[k], i);
        } else {
          p = produce<4>(producer, i);
        }
        const uint32_t word = cast_pack<Format>(p, scale, t);
        *reinterpret_cast<uint32_t*>(cast.output + i) = word;
        *reinterpret_cast<uint32_t*>(s) = word;
        if constexpr (ColumnSums) {
#pragma unroll
          for (int k = 0; k < 4; ++k) sums[k] = __fadd_rn(sums[k], p.v[k]);
        }
      } else {
        for (int k = 0; k < 4 && col + k < cols; ++k) {
          const Pack<1> p = produce<1>(producer, i + k);
          const auto code = static_cast<uint8_t>(cast_pack<Format>(p, scale, t));
          cast.output[i + k] = code;
          s[k] = code;
          if constexpr (ColumnSums) sums[k] = __fadd_rn(sums[k], p.v[0]);
        }
      }
    }
  }
  if constexpr (ColumnSums) {
    // One 16-byte store per thread: a warp writes 512 consecutive bytes.
    *reinterpret_cast<float4*>(&group_sums[r_first][c]) = make_float4(sums[0], sums[1], sums[2], sums[3]);
  }
  __syncthreads();
  const int rows_in_tile = static_cast<int>(rows - row0 < kTileRows ? rows - row0 : kTileRows);
  const int cols_in_tile = static_cast<int>(cols - col0 < kTileCols ? cols - col0 : kTileCols);
  if (cast.output_transposed != nullptr) {
    write_transposed_tile(staged, kTileStride, rows_in_tile, cols_in_tile, cast.output_transposed, rows, row0,
                          col0, transposed_words);
  }
  if constexpr (ColumnSums) {
    for (int j = static_cast<int>(threadIdx.x); j < cols_in_tile; j += kThreads) {
      float total = group_sums[0][j];
#pragma unroll
      for (int g = 1; g < kRowGroups; ++g) total = __fadd_rn(total, group_sums[g][j]);
      column_partials[(row0 / kTileRows) * cols + col0 + j] = total;
    }
  }
  __syncthreads();  // the next tile overwrites the stage
}

// produce_tile over every tile of [rows, cols]: a block walks tiles blockIdx.x, + gridDim.x, ...
template <Dtype Format, bool Vector, bool ColumnSums, typename Producer>
__global__ void __launch_bounds__(kThreads)
    produce_cast_transpose_kernel(const Producer producer, const FusedCast cast, int64_t rows, int64_t cols,
                                  bool transposed_words, float* column_partials) {
  __shared__ __align__(16) uint8_t staged[kTileRows * kTileStride];
  __shared__ __align__(16) GroupSums<ColumnSums> group_sums;
  const float scale = *cast.scale;
  const int c = tile_column_of_thread(), r_first = tile_row_of_thread();
  // The block's tiles as (tile row, tile column), stepped without a division.
  const int64_t tile_cols = (cols + kTileCols - 1) / kTileCols;
  const int64_t tile_rows = (rows + kTileRows - 1) / kTileRows;
  const int64_t step_rows = gridDim.x / tile_cols, step_cols = gridDim.x % tile_cols;
  int64_t tile_row = blockIdx.x / tile_cols, tile_col = blockIdx.x % tile_cols;
  Tally t{};
  while (tile_row < tile_rows) {
    const int64_t row0 = tile_row * kTileRows;
    const int64_t col0 = tile_col * kTileCols;
    tile_row += step_rows;  // the next tile's; row0 and col0 keep this one's
    tile_col += step_cols;
    if (tile_col >= tile_cols) {
      tile_col -= tile_cols;
      ++tile_row;
    }
    produce_tile<Format, Vector, ColumnSums>(producer, cast, scale, rows, cols, row0, col0, transposed_words,
                                             column_partials, c, r_first, staged, group_sums, t);
  }
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

// Row groups (FusedCastGroup, fused.h) as a kernel takes them, up to kMaxCastGroups: group g covers the
// launch's tiles first_tile[g] .. first_tile[g + 1] - 1, its rows' tiles in produce_cast_transpose_kernel's
// order.
struct CastGroupTable {
  int count;
  int64_t first_tile[kMaxCastGroups + 1];
  int64_t row0[kMaxCastGroups];
  int64_t rows[kMaxCastGroups];
  bool transposed_words[kMaxCastGroups];
  FusedCast cast[kMaxCastGroups];
};

// Walks a block's tiles of a CastGroupTable (blockIdx.x, + gridDim.x, ...), calling tile(g, row0, col0) with
// the tile's place in group g's rows, and flushing the block's tally into a group's results once it is past
// that group's tiles. Tiles come in increasing order, so a block meets each group once. `cols` is the tiles'
// column count, in tile columns of kTileCols.
template <typename Tile>
__device__ __forceinline__ void for_each_group_tile(const CastGroupTable& table, int64_t tile_cols, Tally& t,
                                                    Tile tile) {
  int g = -1;
  for (int64_t i = blockIdx.x; i < table.first_tile[table.count]; i += gridDim.x) {
    int next = g < 0 ? 0 : g;
    while (i >= table.first_tile[next + 1]) ++next;
    if (next != g) {
      if (g >= 0) {
        flush_tally(t, table.cast[g].results);
        t = Tally{};
      }
      g = next;
    }
    const int64_t local = i - table.first_tile[g];
    tile(g, (local / tile_cols) * kTileRows, (local % tile_cols) * kTileCols, local == 0);
  }
  if (g >= 0) flush_tally(t, table.cast[g].results);
}

// produce_cast_transpose_kernel over row groups (without column sums): group g's tiles cast with its own
// FusedCast, the producer shifted to its rows (Producer::rows_from).
template <Dtype Format, bool Vector, typename Producer>
__global__ void __launch_bounds__(kThreads)
    produce_cast_transpose_grouped_kernel(const Producer producer, const CastGroupTable table, int64_t cols) {
  __shared__ __align__(16) uint8_t staged[kTileRows * kTileStride];
  __shared__ __align__(16) GroupSums<false> group_sums;
  const int c = tile_column_of_thread(), r_first = tile_row_of_thread();
  Tally t{};
  for_each_group_tile(table, (cols + kTileCols - 1) / kTileCols, t,
                      [&](int g, int64_t row0, int64_t col0, bool first) {
                        const FusedCast& cast = table.cast[g];
                        const float scale = *cast.scale;
                        produce_tile<Format, Vector, false>(producer.rows_from(table.row0[g]), cast, scale,
                                                            table.rows[g], cols, row0, col0,
                                                            table.transposed_words[g], nullptr, c, r_first,
                                                            staged, group_sums, t);
                        write_scale_inv(cast.scale_inv, scale, first);
                      });
}

// ---------------------------------------------------------------------------------------------------------
// The host side

inline bool aligned(const void* pointer, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// Enough blocks to fill the GPU, no more: the kernels stride over the rest. At least one block, which writes
// scale_inv even for an empty tensor, and never so few that a block strides more than kMaxBlockStrides times
// (see Tally). Results never depend on the grid size.
inline unsigned grid_size(int64_t work_items, int64_t items_per_block,
                          int blocks_per_multiprocessor = kBlocksPerMultiprocessor) {
  const int64_t wanted = (work_items + items_per_block - 1) / items_per_block;
  const int64_t most =
      static_cast<int64_t>(device_attribute(cudaDevAttrMultiProcessorCount)) * blocks_per_multiprocessor;
  const int64_t blocks = wanted < 1 ? 1 : (wanted < most ? wanted : most);
  const int64_t least = (wanted + cast_internal::kMaxBlockStrides - 1) / cast_internal::kMaxBlockStrides;
  return static_cast<unsigned>(blocks > least ? blocks : least);
}

// The blocks of `kernel` (kThreads threads, no dynamic shared memory) that a multiprocessor holds at once, at
// most kBlocksPerMultiprocessor. The strided kernels' grids are sized to it: every block of such a grid does
// the same work, so a grid the GPU cannot hold at once runs a last wave short of warps (the GELU backward's
// registers leave room for three blocks, not eight).
template <typename Kernel>
int resident_blocks(Kernel kernel) {
  int blocks = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
  return blocks < 1 ? 1 : (blocks < kBlocksPerMultiprocessor ? blocks : kBlocksPerMultiprocessor);
}

// Calls fn with the format as a compile-time constant.
template <typename Fn>
void with_format(Dtype format, Fn&& fn) {
  if (format == Dtype::e4m3) {
    fn(std::integral_constant<Dtype, Dtype::e4m3>{});
  } else {
    fn(std::integral_constant<Dtype, Dtype::e5m2>{});
  }
}

inline void check_cast(const FusedCast& cast, int64_t n, const char* op) {
  OCTET_REQUIRE(is_fp8(cast.format), "{}: the cast's format must be e4m3 or e5m2, got {}", op,
                dtype_name(cast.format));
  OCTET_REQUIRE(cast.scale != nullptr && cast.results != nullptr, "{}: the cast needs scale and results", op);
  OCTET_REQUIRE(n == 0 || cast.output != nullptr, "{}: the cast of {} values needs an output", op, n);
}

// The element-wise op `producer` over [rows, cols] with its cast. `vector_inputs`: every float pointer the
// producer touches is 16-byte aligned. With ColumnSums, the tiles' column sums of the produced values go to
// column_partials (see produce_cast_transpose_kernel), which makes the tiled kernel run even without
// transposed codes.
template <bool ColumnSums = false, typename Producer>
void launch_elementwise(const Producer& producer, bool vector_inputs, int64_t rows, int64_t cols,
                        const FusedCast& cast, cudaStream_t stream, float* column_partials = nullptr) {
  const int64_t n = rows * cols;
  if (!cast.results_zeroed) OCTET_CUDA_CHECK(cudaMemsetAsync(cast.results, 0, sizeof(CastResults), stream));
  if ((cast.output_transposed != nullptr || ColumnSums) && n > 0) {
    const bool vector = vector_inputs && cols % 4 == 0 && aligned(cast.output, 4);
    const bool transposed_words = rows % 4 == 0 && aligned(cast.output_transposed, 4);
    const int64_t tiles = ((rows + kTileRows - 1) / kTileRows) * ((cols + kTileCols - 1) / kTileCols);
    with_format(cast.format, [&](auto format) {
      const auto kernel =
          vector ? produce_cast_transpose_kernel<decltype(format)::value, true, ColumnSums, Producer>
                 : produce_cast_transpose_kernel<decltype(format)::value, false, ColumnSums, Producer>;
      kernel<<<grid_size(tiles, 1, resident_blocks(kernel)), kThreads, 0, stream>>>(
          producer, cast, rows, cols, transposed_words, column_partials);
    });
  } else {
    const int64_t groups = vector_inputs && aligned(cast.output, 4) ? n / 4 : 0;
    with_format(cast.format, [&](auto format) {
      const auto kernel = produce_cast_kernel<decltype(format)::value, Producer>;
      kernel<<<grid_size(groups + (n - groups * 4), kThreads, resident_blocks(kernel)), kThreads, 0,
               stream>>>(producer, cast, groups, n);
    });
  }
}

// Calls launch(table, vector_outputs) for each run of at most kMaxCastGroups groups with rows (after
// zeroing the results that are not zeroed already), the table's tiles those of [rows, cols] tiles per group
// (cols: the tiles' columns, the SwiGLU backward's pairs), with transposed words where a group's rows and
// transposed codes allow; vector_outputs: every group's codes are 4-byte aligned. All groups cast to one
// format, which the caller passes to its kernel.
template <typename Launch>
void for_each_group_table(std::span<const FusedCastGroup> groups, int64_t cols, const char* op, cudaStream_t stream,
                          Launch launch) {
  for (size_t first = 0; first < groups.size();) {
    CastGroupTable table{};
    bool vector_outputs = true;
    int64_t tiles = 0;
    for (; first < groups.size() && table.count < kMaxCastGroups; ++first) {
      const FusedCastGroup& group = groups[first];
      OCTET_REQUIRE(group.row0 >= 0 && group.rows >= 0, "{}: a group of {} rows at row {}", op, group.rows,
                    group.row0);
      OCTET_REQUIRE(group.cast.format == groups.front().cast.format,
                    "{}: every group casts to one format, {} and {} given", op, dtype_name(group.cast.format),
                    dtype_name(groups.front().cast.format));
      check_cast(group.cast, group.rows * cols, op);
      if (group.rows == 0 || cols == 0) continue;
      if (!group.cast.results_zeroed) {
        OCTET_CUDA_CHECK(cudaMemsetAsync(group.cast.results, 0, sizeof(CastResults), stream));
      }
      const int i = table.count++;
      table.first_tile[i] = tiles;
      table.row0[i] = group.row0;
      table.rows[i] = group.rows;
      table.transposed_words[i] = group.rows % 4 == 0 && aligned(group.cast.output_transposed, 4);
      table.cast[i] = group.cast;
      vector_outputs &= aligned(group.cast.output, 4);
      tiles += ((group.rows + kTileRows - 1) / kTileRows) * ((cols + kTileCols - 1) / kTileCols);
    }
    table.first_tile[table.count] = tiles;
    if (table.count > 0) launch(table, tiles, vector_outputs);
  }
}

// launch_elementwise's tiled kernel over row groups of [M, cols] (no column sums): one launch per
// kMaxCastGroups groups. `vector_inputs`: every float pointer the producer touches is 16-byte aligned, and
// stays so at each group's first row.
template <typename Producer>
void launch_elementwise_grouped(const Producer& producer, bool vector_inputs, int64_t cols,
                                std::span<const FusedCastGroup> groups, const char* op, cudaStream_t stream) {
  if (groups.empty()) return;
  for_each_group_table(groups, cols, op, stream, [&](const CastGroupTable& table, int64_t tiles, bool vector_outputs) {
    const bool vector = vector_inputs && cols % 4 == 0 && vector_outputs;
    with_format(groups.front().cast.format, [&](auto format) {
      const auto kernel = vector ? produce_cast_transpose_grouped_kernel<decltype(format)::value, true, Producer>
                                 : produce_cast_transpose_grouped_kernel<decltype(format)::value, false, Producer>;
      kernel<<<grid_size(tiles, 1, resident_blocks(kernel)), kThreads, 0, stream>>>(producer, table, cols);
    });
  });
}

inline void check_sums(const PartialSums& sums, const Workspace& workspace, const char* op) {
  OCTET_REQUIRE(
      sums.stream == nullptr || (sums.written != nullptr && sums.done != nullptr &&
                                 sums.workspace != nullptr && sums.workspace != &workspace),
      "{}: a second stream for the bias gradient's sums needs its two events and a workspace of its "
      "own",
      op);
}

// The second stage of a fused bias gradient: bias_backward over the tile sums, where `sums` says (checked by
// check_sums before the kernel).
inline void add_partial_sums(float* dbias, const float* column_partials, int64_t partial_rows, int64_t cols,
                             Workspace& workspace, cudaStream_t stream, const PartialSums& sums) {
  if (sums.stream == nullptr) {
    bias_backward(dbias, column_partials, partial_rows, cols, workspace, stream);
    return;
  }
  OCTET_CUDA_CHECK(cudaEventRecord(sums.written, stream));
  OCTET_CUDA_CHECK(cudaStreamWaitEvent(sums.stream, sums.written, 0));
  bias_backward(dbias, column_partials, partial_rows, cols, *sums.workspace, sums.stream);
  OCTET_CUDA_CHECK(cudaEventRecord(sums.done, sums.stream));
}

// launch_elementwise of a producer of a linear layer's output gradient, and where dbias is given, dbias
// [cols] += the column sums of what it produced (the tiles' partial sums in column_partials, then
// add_partial_sums). The caller checks the launches.
template <typename Producer>
void launch_with_bias_gradient(const Producer& producer, bool vector_inputs, int64_t rows, int64_t cols,
                               const FusedCast& cast, float* dbias, float* column_partials,
                               Workspace& workspace, cudaStream_t stream, const PartialSums& sums) {
  if (dbias == nullptr) {
    launch_elementwise(producer, vector_inputs, rows, cols, cast, stream);
    return;
  }
  launch_elementwise<true>(producer, vector_inputs, rows, cols, cast, stream, column_partials);
  add_partial_sums(dbias, column_partials, column_partial_rows(rows), cols, workspace, stream, sums);
}

// codes [rows, cols] -> transposed [cols, rows], byte by byte through 32 x 32 tiles (fused_transpose.cu): any
// shape and alignment. Only enqueues the kernel; the caller checks the launch.
void transpose_code_bytes(const uint8_t* codes, uint8_t* transposed, int64_t rows, int64_t cols,
                          cudaStream_t stream);

}  // namespace octet::cuda::fused_internal
