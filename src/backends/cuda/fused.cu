// Producer-fused FP8 casts (see fused.h): LayerNorm, GELU (forward and backward) and AdamW kernels that also
// write the FP8 cast of what they produce, in the same pass over the data; and the gradient cast that also
// sums the bias gradient of what it reads. The op's arithmetic is elementwise.cuh's, the code that ops.cu's
// kernels run (the same round-to-nearest intrinsics, the same reduction order), and the cast is
// cast_element.cuh, the step cast_amax runs, so every byte and count matches the unfused pair.
//
// Bytes moved per element (float32 in, FP8 codes out; "out" is the float32 result, optional here):
//   GELU:      read 4, write 4 (out) + 1 (codes) + 1 (transposed)  = 10, or 6 without out; unfused 14.
//   LayerNorm: the same as GELU (weight, bias, mean, rstd are per row or per column);         unfused 14.
//   GELU backward, with the consumer's bias gradient: read 8 (inp, dout), write 4 (dinp) + 1 + 1 = 14, or 10
//              without dinp (plus 1/8 out and in for the column partial sums); unfused 26 (gelu_backward
//              12, bias_backward 4, cast 6).
//   AdamW:     read 16 (params, m, v, grads), write 12 + 1 + 1    = 30;                      unfused 34.
//   Bias gradient with the gradient cast: read 4 (dout), write 1 + 1 = 6 (plus 1/8 out and in for the
//              column partial sums); unfused 10 (bias_backward 4, cast 6).
#include "fused.h"

#include <type_traits>
#include <vector>

#include "cast_element.cuh"
#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/numerics/format.h"

namespace octet::cuda {
namespace {

using cast_internal::flush_tally;
using cast_internal::Tally;
using cast_internal::write_scale_inv;
using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::load_raw;
using elementwise::Pack;
using elementwise::Raw;
using elementwise::store_pack;
using elementwise::widen;

constexpr int kThreads = 256;                // flat and element-wise tile kernels
constexpr int kBlocksPerMultiprocessor = 8;  // 8 x 256 threads fill a Hopper multiprocessor

// The fused casts take no CastOptions: they are cast_amax's defaults.
constexpr Overflow kOverflow = CastOptions{}.overflow;
static_assert(CastOptions{}.rounding == Rounding::nearest_even, "the fused casts round to nearest even");

// Transposed tiles: kTileRows rows, so that each column of a tile is one 32-byte segment of the transposed
// codes (a full sector). Codes are staged in shared memory as rows of `stride` bytes, stride = 4 x odd: the
// transposed writer reads four rows of one column per thread, and with that stride the eight row groups of
// a warp land in eight different banks.
constexpr int kTileRows = 32;
constexpr int kTileCols = 128;                  // element-wise tiles: a warp reads one row, 32 float4
constexpr int64_t kTileStride = kTileCols + 4;  // 132 = 4 x 33
constexpr int kLayernormRowWarps = 8;           // row-major kernel: a row per warp, as layernorm_forward
constexpr int kLayernormTileWarps = 16;         // transposed kernel: 32 rows, two per warp
constexpr int kTransposeTile = 32;              // byte-transpose fallback: 32 x 32 tiles,
constexpr int kTransposeRowsPerPass = 8;        // 32 x 8 threads
constexpr int kWordTile = 64;                   // transpose_codes in words: 64 x 64 byte tiles,
constexpr int kWordTileWords = kWordTile / 4;   // 16 words a tile row

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
// they hide says so (kLoadRowsFirst = false: AdamW, 16 floats a row, measured slower loading first).

// ops.cu's Gelu: elementwise::gelu, over float32 or bf16 (In = uint16_t) inputs.
template <typename In>
struct GeluProducer {
  static constexpr bool kLoadRowsFirst = true;
  float* out;  // may be null
  const In* inp;
  template <int W>
  using Loaded = Raw<W, In>;
  template <int W>
  __device__ __forceinline__ Loaded<W> load(int64_t i) const {
    return load_raw<W>(inp + i);
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(const Loaded<W>& loaded, int64_t i) const {
    Pack<W> x = widen(loaded);
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = elementwise::gelu(x.v[k]);
    if (out != nullptr) store_pack<W>(out + i, x);
    return x;
  }
};

// ops.cu's GeluGradient: elementwise::gelu_gradient, over float32 or bf16 (In = uint16_t) inputs. Each
// element is read and written by one thread, so dinp may alias inp or dout.
template <typename In>
struct GeluBackwardProducer {
  static constexpr bool kLoadRowsFirst = true;
  float* dinp;  // may be null
  const In* inp;
  const In* dout;
  template <int W>
  struct Loaded {
    Raw<W, In> x, g;
  };
  template <int W>
  __device__ __forceinline__ Loaded<W> load(int64_t i) const {
    return {load_raw<W>(inp + i), load_raw<W>(dout + i)};
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(const Loaded<W>& loaded, int64_t i) const {
    Pack<W> x = widen(loaded.x);
    const Pack<W> g = widen(loaded.g);
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = elementwise::gelu_gradient(x.v[k], g.v[k]);
    if (dinp != nullptr) store_pack<W>(dinp + i, x);
    return x;
  }
};

// The values as they are stored, float32 or bf16 bits widened to float32 (exact): a cast that reads its input
// only (the bias gradient is all that it adds), or of attention's bf16 output or gradient (W = 4 reads 8
// bytes of bf16).
template <typename In>
struct StoredProducer {
  static constexpr bool kLoadRowsFirst = true;
  const In* x;
  template <int W>
  using Loaded = Raw<W, In>;
  template <int W>
  __device__ __forceinline__ Loaded<W> load(int64_t i) const {
    return load_raw<W>(x + i);
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(const Loaded<W>& loaded, int64_t) const {
    return widen(loaded);
  }
};
using IdentityProducer = StoredProducer<float>;
using Bf16Producer = StoredProducer<uint16_t>;

// ops.cu's AdamW: elementwise::adamw_step on each element (adamw_pack's arithmetic, loads and stores), with
// the constants of elementwise::adamw_constants.
struct AdamWProducer {
  static constexpr bool kLoadRowsFirst = false;
  float* params;
  float* m;
  float* v;
  elementwise::Gradient grads;
  elementwise::AdamWConstants constants;
  template <int W>
  struct Loaded {
    Pack<W> p, m, v, g;
  };
  template <int W>
  __device__ __forceinline__ Loaded<W> load(int64_t i) const {
    return {load_pack<W>(params + i), load_pack<W>(m + i), load_pack<W>(v + i), grads.load<W>(i)};
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(Loaded<W> l, int64_t i) const {
#pragma unroll
    for (int k = 0; k < W; ++k) elementwise::adamw_step(constants, l.p.v[k], l.m.v[k], l.v.v[k], l.g.v[k]);
    store_pack<W>(params + i, l.p);
    store_pack<W>(m + i, l.m);
    store_pack<W>(v + i, l.v);
    return l.p;
  }
};

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

// AdamW with the weight cast over the tiles of many weights (adamw_update_casts), one tile per block: block b
// takes tile b - first_block of the weight whose tiles hold b. Every weight's results are zeroed first
// (zero_results_kernel); the block of each weight's first tile writes its scale_inv.
__global__ void zero_results_kernel(const AdamWCastEntry* entries, int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < count) *entries[i].weight.cast.results = CastResults{};
}

__global__ void __launch_bounds__(kThreads)
    adamw_cast_tiles_kernel(const AdamWCastEntry* __restrict__ entries, int count,
                            elementwise::AdamWConstants decayed, elementwise::AdamWConstants plain) {
  __shared__ __align__(16) uint8_t staged[kTileRows * kTileStride];
  __shared__ __align__(16) GroupSums<false> group_sums;
  const AdamWCastEntry& e = entries[elementwise::entry_of_block(entries, count, blockIdx.x)];
  const AdamWCastWeight& w = e.weight;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) - e.first_block;
  const int64_t tile_cols = (w.cols + kTileCols - 1) / kTileCols;
  const int64_t row0 = tile / tile_cols * kTileRows, col0 = tile % tile_cols * kTileCols;
  const AdamWProducer producer{w.params, w.m, w.v, {w.grads, w.grads_bf16}, w.decayed ? decayed : plain};
  const float scale = *w.cast.scale;
  const int c = tile_column_of_thread(), r_first = tile_row_of_thread();
  Tally t{};
  if (w.cast.format == Dtype::e4m3) {
    produce_tile<Dtype::e4m3, true, false>(producer, w.cast, scale, w.rows, w.cols, row0, col0,
                                           e.transposed_words, nullptr, c, r_first, staged, group_sums, t);
  } else {
    produce_tile<Dtype::e5m2, true, false>(producer, w.cast, scale, w.rows, w.cols, row0, col0,
                                           e.transposed_words, nullptr, c, r_first, staged, group_sums, t);
  }
  write_scale_inv(w.cast.scale_inv, scale, tile == 0);
  flush_tally(t, w.cast.results);
}

// ---------------------------------------------------------------------------------------------------------
// LayerNorm. The statistics and the normalisation are ops.cu's (elementwise::layernorm_statistics and
// layernorm_normalise): one warp per row, lane l summing elements l*W, l*W + 32*W, ... in float64, then a
// butterfly; W (4 or 1) must therefore be the one layernorm_forward picks for the same pointers, or the
// float64 sums would be taken in another order.
//
// Transposed codes: a block takes 32 rows; each warp normalises whole rows exactly as layernorm_forward does
// (three passes over one row, the second and third served from L1/L2 while the row is fresh), and stages
// the row's codes in shared memory, 32 x C bytes; the block then writes the transposed codes as 32-byte
// column segments. The alternatives lose: writing row-major codes and transposing them in a second kernel
// moves one more byte in and out per element and costs a launch; tiling the columns (32 rows x 128
// columns at a time) needs the statistics first and then a third pass over all 32 rows, 32 x 4C bytes that
// no longer stay in cache between passes. The limit is shared memory: 32 x C bytes must fit a block (C up
// to about 7200 on Hopper); beyond that the row-major kernel runs and a byte transpose follows.

struct LayernormArguments {
  float* out;  // may be null
  float* mean;
  float* rstd;
  const float* inp;
  const float* weight;
  const float* bias;
  int64_t N;
  int64_t C;
};

// One row by one warp: layernorm_forward_kernel's arithmetic, then the codes of the row to the row-major
// output and, when `staged` is not null, to shared memory.
template <int W, Dtype Format>
__device__ __forceinline__ void layernorm_row(const LayernormArguments& a, const FusedCast& cast, float scale,
                                              bool code_words, int64_t row, uint8_t* staged, Tally& t) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t C = a.C;
  const float* x = a.inp + row * C;
  const elementwise::RowStatistics r = elementwise::layernorm_statistics<W>(x, C, lane);
  float* o = a.out == nullptr ? nullptr : a.out + row * C;
  uint8_t* codes = cast.output + row * C;
  for (int64_t i = lane * W; i < C; i += kWarp * W) {
    const Pack<W> p = elementwise::layernorm_normalise<W>(x, a.weight, a.bias, i, r);
    if (o != nullptr) store_pack<W>(o + i, p);
    const uint32_t word = cast_pack<Format>(p, scale, t);
    store_codes<W>(codes + i, word, code_words);
    if (staged != nullptr) store_codes<W>(staged + i, word, true);  // rows of 4 x odd bytes: aligned
  }
  if (lane == 0) {
    a.mean[row] = r.mean;
    a.rstd[row] = r.rstd;
  }
}

// Row-major codes only: a row per warp.
template <int W, Dtype Format>
__global__ void __launch_bounds__(kLayernormRowWarps* kWarp)
    layernorm_cast_kernel(const LayernormArguments a, const FusedCast cast, bool code_words) {
  const float scale = *cast.scale;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kLayernormRowWarps + threadIdx.x / kWarp;
  Tally t{};
  if (row < a.N) layernorm_row<W, Format>(a, cast, scale, code_words, row, nullptr, t);
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

// Row-major and transposed codes: kTileRows rows per block, staged in dynamic shared memory
// (kTileRows x stride bytes).
template <int W, Dtype Format>
__global__ void __launch_bounds__(kLayernormTileWarps* kWarp, 2)
    layernorm_cast_transpose_kernel(const LayernormArguments a, const FusedCast cast, bool code_words,
                                    bool transposed_words, int64_t stride) {
  extern __shared__ __align__(16) uint8_t staged_rows[];
  const float scale = *cast.scale;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  Tally t{};
  for (int r = static_cast<int>(threadIdx.x / kWarp); r < kTileRows; r += kLayernormTileWarps) {
    if (row0 + r < a.N)
      layernorm_row<W, Format>(a, cast, scale, code_words, row0 + r, staged_rows + r * stride, t);
  }
  __syncthreads();
  const int rows_in_tile = static_cast<int>(a.N - row0 < kTileRows ? a.N - row0 : kTileRows);
  write_transposed_tile(staged_rows, stride, rows_in_tile, static_cast<int>(a.C), cast.output_transposed, a.N,
                        row0, 0, transposed_words);
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

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

// ---------------------------------------------------------------------------------------------------------
// Launchers

bool aligned(const void* pointer, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  int value = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// Enough blocks to fill the GPU, no more: the kernels stride over the rest. At least one block, which writes
// scale_inv even for an empty tensor, and never so few that a block strides more than kMaxBlockStrides times
// (see Tally). Results never depend on the grid size.
unsigned grid_size(int64_t work_items, int64_t items_per_block,
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

void check_cast(const FusedCast& cast, int64_t n, const char* op) {
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

// Bytes per staged LayerNorm row: C rounded up to 4 x odd (see kTileStride).
int64_t staged_stride(int64_t C) {
  int64_t stride = (C + 3) / 4 * 4;
  if ((stride / 4) % 2 == 0) stride += 4;
  return stride;
}

template <int W, Dtype Format>
void launch_layernorm(const LayernormArguments& a, const FusedCast& cast, bool code_words,
                      cudaStream_t stream) {
  if (cast.output_transposed != nullptr && a.N > 0) {
    const auto kernel = layernorm_cast_transpose_kernel<W, Format>;
    const int64_t stride = staged_stride(a.C);
    const int64_t shared_bytes = kTileRows * stride;
    cudaFuncAttributes attributes{};
    OCTET_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const int64_t shared_limit =
        static_cast<int64_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) -
        static_cast<int64_t>(attributes.sharedSizeBytes);
    if (shared_bytes <= shared_limit) {
      OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
      const bool transposed_words = a.N % 4 == 0 && aligned(cast.output_transposed, 4);
      const auto blocks = static_cast<unsigned>((a.N + kTileRows - 1) / kTileRows);
      kernel<<<blocks, kLayernormTileWarps * kWarp, static_cast<size_t>(shared_bytes), stream>>>(
          a, cast, code_words, transposed_words, stride);
      return;
    }
  }
  const int64_t blocks = (a.N + kLayernormRowWarps - 1) / kLayernormRowWarps;
  layernorm_cast_kernel<W, Format>
      <<<static_cast<unsigned>(blocks < 1 ? 1 : blocks), kLayernormRowWarps * kWarp, 0, stream>>>(a, cast,
                                                                                                  code_words);
  if (cast.output_transposed != nullptr && a.N > 0) {
    OCTET_CUDA_CHECK_LAUNCH("layernorm_cast_kernel");
    const int64_t tiles =
        ((a.N + kTransposeTile - 1) / kTransposeTile) * ((a.C + kTransposeTile - 1) / kTransposeTile);
    transpose_codes_kernel<<<grid_size(tiles, 1), dim3(kTransposeTile, kTransposeRowsPerPass), 0, stream>>>(
        cast.output, cast.output_transposed, a.N, a.C);
  }
}

bool aligned16(const void* pointer) {
  return aligned(pointer, 16);
}

}  // namespace

void layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int64_t N, int64_t C, const FusedCast& cast,
                            cudaStream_t stream) {
  OCTET_REQUIRE(N >= 0 && C > 0, "layernorm_forward_cast: N >= 0 and C > 0, got N={} C={}", N, C);
  check_cast(cast, N * C, "layernorm_forward_cast");
  OCTET_REQUIRE(N == 0 || (mean != nullptr && rstd != nullptr && inp != nullptr && weight != nullptr &&
                           bias != nullptr),
                "layernorm_forward_cast: mean, rstd, inp, weight and bias must be given");
  if (!cast.results_zeroed) OCTET_CUDA_CHECK(cudaMemsetAsync(cast.results, 0, sizeof(CastResults), stream));
  const LayernormArguments a{out, mean, rstd, inp, weight, bias, N, C};
  // layernorm_forward's choice of W, with a missing out counting as aligned.
  const bool vector = C % 4 == 0 && (out == nullptr || aligned16(out)) && aligned16(inp) &&
                      aligned16(weight) && aligned16(bias);
  const bool code_words = vector && aligned(cast.output, 4);
  with_format(cast.format, [&](auto format) {
    if (vector) {
      launch_layernorm<4, decltype(format)::value>(a, cast, code_words, stream);
    } else {
      launch_layernorm<1, decltype(format)::value>(a, cast, code_words, stream);
    }
  });
  OCTET_CUDA_CHECK_LAUNCH("layernorm_forward_cast");
}

namespace {

template <typename In>
void gelu_forward_cast_of(float* out, const In* inp, int64_t rows, int64_t cols, const FusedCast& cast,
                          cudaStream_t stream) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "gelu_forward_cast: the shape must not be negative, got [{}, {}]",
                rows, cols);
  check_cast(cast, rows * cols, "gelu_forward_cast");
  OCTET_REQUIRE(rows * cols == 0 || inp != nullptr, "gelu_forward_cast: inp must be given");
  const bool vector = elementwise::pack_aligned(inp) && (out == nullptr || aligned16(out));
  launch_elementwise(GeluProducer<In>{out, inp}, vector, rows, cols, cast, stream);
  OCTET_CUDA_CHECK_LAUNCH("gelu_forward_cast");
}

void check_sums(const PartialSums& sums, const Workspace& workspace, const char* op) {
  OCTET_REQUIRE(
      sums.stream == nullptr || (sums.written != nullptr && sums.done != nullptr &&
                                 sums.workspace != nullptr && sums.workspace != &workspace),
      "{}: a second stream for the bias gradient's sums needs its two events and a workspace of its "
      "own",
      op);
}

// The second stage of a fused bias gradient: bias_backward over the tile sums, where `sums` says (checked by
// check_sums before the kernel).
void add_partial_sums(float* dbias, const float* column_partials, int64_t partial_rows, int64_t cols,
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

template <typename In>
void gelu_backward_cast_of(float* dinp, const In* inp, const In* dout, int64_t rows, int64_t cols,
                           const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                           cudaStream_t stream, const PartialSums& sums) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "gelu_backward_cast: the shape must not be negative, got [{}, {}]",
                rows, cols);
  check_cast(cast, rows * cols, "gelu_backward_cast");
  OCTET_REQUIRE(rows * cols == 0 || (inp != nullptr && dout != nullptr),
                "gelu_backward_cast: inp and dout must be given");
  OCTET_REQUIRE(dbias == nullptr || rows * cols == 0 || column_partials != nullptr,
                "gelu_backward_cast: the bias gradient needs column_partials");
  check_sums(sums, workspace, "gelu_backward_cast");
  const GeluBackwardProducer<In> op{dinp, inp, dout};
  const bool vector = elementwise::pack_aligned(inp) && elementwise::pack_aligned(dout) &&
                      (dinp == nullptr || aligned16(dinp));
  if (dbias == nullptr) {
    launch_elementwise(op, vector, rows, cols, cast, stream);
    OCTET_CUDA_CHECK_LAUNCH("gelu_backward_cast");
    return;
  }
  launch_elementwise<true>(op, vector, rows, cols, cast, stream, column_partials);
  OCTET_CUDA_CHECK_LAUNCH("gelu_backward_cast");
  add_partial_sums(dbias, column_partials, gelu_backward_cast_partial_rows(rows), cols, workspace, stream,
                   sums);
}

}  // namespace

void gelu_forward_cast(float* out, const float* inp, int64_t rows, int64_t cols, const FusedCast& cast,
                       cudaStream_t stream) {
  gelu_forward_cast_of(out, inp, rows, cols, cast, stream);
}

void gelu_forward_cast(float* out, const uint16_t* inp, int64_t rows, int64_t cols, const FusedCast& cast,
                       cudaStream_t stream) {
  gelu_forward_cast_of(out, inp, rows, cols, cast, stream);
}

void gelu_backward_cast(float* dinp, const float* inp, const float* dout, int64_t rows, int64_t cols,
                        const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                        cudaStream_t stream, const PartialSums& sums) {
  gelu_backward_cast_of(dinp, inp, dout, rows, cols, cast, dbias, column_partials, workspace, stream, sums);
}

void gelu_backward_cast(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t rows, int64_t cols,
                        const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                        cudaStream_t stream, const PartialSums& sums) {
  gelu_backward_cast_of(dinp, inp, dout, rows, cols, cast, dbias, column_partials, workspace, stream, sums);
}

int64_t gelu_backward_cast_partial_rows(int64_t rows) {
  return (rows + kTileRows - 1) / kTileRows;
}

namespace {

// The producer that reads a gradient as it is stored: float32, or bf16 bits widened exactly.
IdentityProducer stored_values(const float* x) {
  return IdentityProducer{x};
}
Bf16Producer stored_values(const uint16_t* x) {
  return Bf16Producer{x};
}

template <typename In>
void bias_backward_cast_of(float* dbias, const In* dout, int64_t rows, int64_t cols, const FusedCast& cast,
                           float* column_partials, Workspace& workspace, cudaStream_t stream,
                           const PartialSums& sums) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "bias_backward_cast: the shape must not be negative, got [{}, {}]",
                rows, cols);
  check_cast(cast, rows * cols, "bias_backward_cast");
  OCTET_REQUIRE(dbias != nullptr,
                "bias_backward_cast: dbias must be given (without it, cast_amax or cast_bf16 casts)");
  OCTET_REQUIRE(rows * cols == 0 || (dout != nullptr && column_partials != nullptr),
                "bias_backward_cast: dout and column_partials must be given");
  check_sums(sums, workspace, "bias_backward_cast");
  // Always the tiled kernel (ColumnSums), which writes the transposed codes only where asked for.
  launch_elementwise<true>(stored_values(dout), elementwise::pack_aligned(dout), rows, cols, cast, stream,
                           column_partials);
  OCTET_CUDA_CHECK_LAUNCH("bias_backward_cast");
  add_partial_sums(dbias, column_partials, bias_backward_cast_partial_rows(rows), cols, workspace, stream,
                   sums);
}

}  // namespace

void bias_backward_cast(float* dbias, const float* dout, int64_t rows, int64_t cols, const FusedCast& cast,
                        float* column_partials, Workspace& workspace, cudaStream_t stream,
                        const PartialSums& sums) {
  bias_backward_cast_of(dbias, dout, rows, cols, cast, column_partials, workspace, stream, sums);
}

void bias_backward_cast(float* dbias, const uint16_t* dout, int64_t rows, int64_t cols, const FusedCast& cast,
                        float* column_partials, Workspace& workspace, cudaStream_t stream,
                        const PartialSums& sums) {
  bias_backward_cast_of(dbias, dout, rows, cols, cast, column_partials, workspace, stream, sums);
}

namespace {

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
  const int64_t tiles =
      ((rows + kTransposeTile - 1) / kTransposeTile) * ((cols + kTransposeTile - 1) / kTransposeTile);
  transpose_codes_kernel<<<grid_size(tiles, 1), dim3(kTransposeTile, kTransposeRowsPerPass), 0, stream>>>(
      codes, transposed, rows, cols);
  OCTET_CUDA_CHECK_LAUNCH("transpose_codes");
}

void cast_bf16(const uint16_t* x, int64_t rows, int64_t cols, const FusedCast& cast, cudaStream_t stream) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "cast_bf16: the shape must not be negative, got [{}, {}]", rows,
                cols);
  check_cast(cast, rows * cols, "cast_bf16");
  OCTET_REQUIRE(rows * cols == 0 || x != nullptr, "cast_bf16: an input of [{}, {}] values", rows, cols);
  launch_elementwise(Bf16Producer{x}, aligned(x, 8), rows, cols, cast, stream);
  OCTET_CUDA_CHECK_LAUNCH("cast_bf16");
}

int64_t bias_backward_cast_partial_rows(int64_t rows) {
  return (rows + kTileRows - 1) / kTileRows;
}

namespace {

// adamw_update_cast over a float32 or a bf16 gradient.
void adamw_update_cast_from(float* params, float* m, float* v, elementwise::Gradient grads, int64_t rows,
                            int64_t cols, float learning_rate, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step, float grad_scale, const FusedCast& cast,
                            cudaStream_t stream) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "adamw_update_cast: the shape must not be negative, got [{}, {}]",
                rows, cols);
  check_cast(cast, rows * cols, "adamw_update_cast");
  OCTET_REQUIRE(rows * cols == 0 || (params != nullptr && m != nullptr && v != nullptr &&
                                     (grads.f32 != nullptr) != (grads.bf16 != nullptr)),
                "adamw_update_cast: params, m, v and one gradient must be given");
  // adamw_update's constants, so that every one has the same bits.
  const AdamWProducer op{
      params, m, v, grads,
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale)};
  const bool grads_aligned =
      grads.bf16 != nullptr ? elementwise::pack_aligned(grads.bf16) : aligned16(grads.f32);
  const bool vector = aligned16(params) && aligned16(m) && aligned16(v) && grads_aligned;
  launch_elementwise(op, vector, rows, cols, cast, stream);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_cast");
}

}  // namespace

void adamw_update_cast(float* params, float* m, float* v, const float* grads, int64_t rows, int64_t cols,
                       float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step, float grad_scale, const FusedCast& cast, cudaStream_t stream) {
  adamw_update_cast_from(params, m, v, {grads, nullptr}, rows, cols, learning_rate, beta1, beta2, eps,
                         weight_decay, step, grad_scale, cast, stream);
}

void adamw_update_casts(std::span<const AdamWCastWeight> weights, float learning_rate, float beta1,
                        float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                        AdamWCastTable& table, cudaStream_t stream) {
  std::vector<AdamWCastEntry> entries;
  int64_t tiles = 0;
  for (const AdamWCastWeight& w : weights) {
    OCTET_CHECK((w.grads != nullptr) != (w.grads_bf16 != nullptr), "adamw_update_casts: one gradient");
    const bool grads_aligned =
        w.grads_bf16 != nullptr ? elementwise::pack_aligned(w.grads_bf16) : aligned16(w.grads);
    const bool vector = w.rows > 0 && w.cols > 0 && w.cols % 4 == 0 && aligned16(w.params) &&
                        aligned16(w.m) && aligned16(w.v) && grads_aligned && aligned(w.cast.output, 4);
    if (!vector) {  // adamw_update_cast checks the weight
      adamw_update_cast_from(w.params, w.m, w.v, {w.grads, w.grads_bf16}, w.rows, w.cols, learning_rate,
                             beta1, beta2, eps, w.decayed ? weight_decay : 0.0f, step, grad_scale, w.cast,
                             stream);
      continue;
    }
    check_cast(w.cast, w.rows * w.cols, "adamw_update_casts");
    entries.push_back({w, tiles, w.rows % 4 == 0 && aligned(w.cast.output_transposed, 4)});
    tiles += ((w.rows + kTileRows - 1) / kTileRows) * ((w.cols + kTileCols - 1) / kTileCols);
  }
  if (entries.empty()) return;
  OCTET_REQUIRE(tiles <= 0x7FFFFFFF, "adamw_update_casts: {} tiles of 32 x 128 values, at most 2^31 - 1",
                tiles);
  const auto count = static_cast<int>(entries.size());
  const AdamWCastEntry* device = table.upload(std::move(entries), stream);
  zero_results_kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(device, count);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_casts");
  // adamw_update's constants, so that every one has the same bits.
  adamw_cast_tiles_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
      device, count,
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale),
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, 0.0f, step, grad_scale));
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_casts");
}

}  // namespace octet::cuda
