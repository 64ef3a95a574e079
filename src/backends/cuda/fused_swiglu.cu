// SwiGLU's forward and backward with the FP8 cast of what they produce (fused.h), in the same pass over the
// data; the backward also sums the bias gradient of the layer that produced its input, where it has one.
// Bytes moved per output element (float32 in, FP8 codes out; "out" is the float32 result, optional here):
//   SwiGLU:    read 8 (gate, up), write 4 (out) + 1 (codes) + 1 (transposed) = 14, or 10 without out;
//              unfused 18.
//   SwiGLU backward, per element of dinp [N, 2C]: read 6 (a pair's gate, up and dout, read once by the one
//              thread that writes both of the pair's gradients), write 4 (dinp) + 1 + 1 = 12, or 8 without
//              dinp (plus 1/8 out and in for the column partial sums of a bias gradient); over bf16 inputs
//              read 3: 9, or 5 without dinp, as the Llama step runs it (640 MiB a call at N = 8192, C =
//              8192). Each input is read once and each output written once: the op's floor. The gradient's
//              arithmetic (an exponential and a division) runs once a pair, too. Unfused (swiglu_backward
//              10, the cast 6, bias_backward 4) 20.
#include "fused.h"

#include <cstdint>

#include "elementwise.cuh"
#include "fused_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using cast_internal::Tally;
using elementwise::load_raw;
using elementwise::Pack;
using elementwise::Raw;
using elementwise::store_pack;
using elementwise::widen;
using fused_internal::add_partial_sums;
using fused_internal::aligned;
using fused_internal::cast_pack;
using fused_internal::check_cast;
using fused_internal::check_sums;
using fused_internal::flush_tally;
using fused_internal::grid_size;
using fused_internal::GroupSums;
using fused_internal::kRowGroups;
using fused_internal::kRowsPerThread;
using fused_internal::kThreads;
using fused_internal::kTileCols;
using fused_internal::kTileRows;
using fused_internal::kTileStride;
using fused_internal::CastGroupTable;
using fused_internal::for_each_group_table;
using fused_internal::for_each_group_tile;
using fused_internal::launch_elementwise;
using fused_internal::launch_elementwise_grouped;
using fused_internal::resident_blocks;
using fused_internal::tile_column_of_thread;
using fused_internal::tile_row_of_thread;
using fused_internal::with_format;
using fused_internal::write_scale_inv;
using fused_internal::write_transposed_tile;
using ops_internal::aligned16;

// The forward's producer (fused_common.cuh describes its two steps, load and finish). Element i is the flat
// index into out [rows, C]; a pack never straddles two rows: the launcher asks for packs of four only where
// C % 4 == 0.

// swiglu.cu's forward: elementwise::swiglu over float32 or bf16 (In = uint16_t) inputs.
template <typename In>
struct SwigluProducer {
  static constexpr bool kLoadRowsFirst = true;
  float* out;  // may be null
  const In* inp;
  int64_t C;
  template <int W>
  struct Loaded {
    Raw<W, In> gate, up;
  };
  template <int W>
  __device__ __forceinline__ Loaded<W> load(int64_t i) const {
    const int64_t r = i / C;
    const In* gate = inp + i + r * C;  // r * 2C + (i - r C)
    return {load_raw<W>(gate), load_raw<W>(gate + C)};
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(const Loaded<W>& loaded, int64_t i) const {
    Pack<W> x = widen(loaded.gate);
    const Pack<W> y = widen(loaded.up);
#pragma unroll
    for (int k = 0; k < W; ++k) x.v[k] = elementwise::swiglu(x.v[k], y.v[k]);
    if (out != nullptr) store_pack<W>(out + i, x);
    return x;
  }
  // The producer of rows r, r + 1, ... (a group's, launch_elementwise_grouped).
  __device__ __forceinline__ SwigluProducer rows_from(int64_t r) const {
    return {out != nullptr ? out + r * C : nullptr, inp + r * 2 * C, C};
  }
};

// ---------------------------------------------------------------------------------------------------------
// The backward. Pair column c of row r has its gate at inp[r, c], its up at inp[r, C + c], its dout at
// dout[r, c], and its two gradients at dinp[r, c] and dinp[r, C + c]: a thread reads the three values of W
// pairs once and writes both gradients of each (swiglu.cu's backward does the same), with their codes in
// both halves of the row-major and the transposed codes.

// What W pairs need, as loaded (bf16 stays 2 bytes a value until it is used).
template <int W, typename In>
struct PairsLoaded {
  Raw<W, In> gate, up, d;
};

template <int W>
struct PairGradients {
  Pack<W> gate, up;
};

// swiglu.cu's backward: elementwise::swiglu_gradient over float32 or bf16 (In = uint16_t) inputs, in the two
// steps of the producers (load, then finish), so that a tile loads a thread's four rows before it finishes
// any of them.
template <typename In>
struct SwigluBackwardPairs {
  float* dinp;  // may be null
  const In* inp;
  const In* dout;
  int64_t C;
  template <int W>
  __device__ __forceinline__ PairsLoaded<W, In> load(int64_t r, int64_t c) const {
    const In* gate = inp + r * 2 * C + c;
    return {load_raw<W>(gate), load_raw<W>(gate + C), load_raw<W>(dout + r * C + c)};
  }
  template <int W>
  __device__ __forceinline__ PairGradients<W> finish(const PairsLoaded<W, In>& loaded, int64_t r,
                                                     int64_t c) const {
    const Pack<W> x = widen(loaded.gate), y = widen(loaded.up), d = widen(loaded.d);
    PairGradients<W> g;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const elementwise::SwigluGradient gradient = elementwise::swiglu_gradient(x.v[k], y.v[k], d.v[k]);
      g.gate.v[k] = gradient.gate;
      g.up.v[k] = gradient.up;
    }
    if (dinp != nullptr) {
      store_pack<W>(dinp + r * 2 * C + c, g.gate);
      store_pack<W>(dinp + r * 2 * C + C + c, g.up);
    }
    return g;
  }  // The pairs of rows r, r + 1, ... (a group's).
  __device__ __forceinline__ SwigluBackwardPairs rows_from(int64_t r) const {
    return {dinp != nullptr ? dinp + r * 2 * C : nullptr, inp + r * 2 * C, dout + r * C, C};
  }
};

// A tile of the backward covers kTileRows rows and kTileCols pair columns: a tile of each half of dinp.
constexpr int kHalves = 2;  // 0: the gate gradients, 1: the up gradients
using StagedHalves = uint8_t[kHalves][kTileRows * kTileStride];
template <bool ColumnSums>
using HalvesGroupSums = GroupSums<ColumnSums>[kHalves];

// The tile at (row0, col0) of the pairs [rows, C]: for each half h, the same bytes and sums as produce_tile
// writes for the tile of dinp [rows, 2C] at (row0, h C + col0). A thread takes the same four pair columns c
// .. c+3 and rows r, r + 8, r + 16, r + 24 as produce_tile's thread of either half tile would, loads the
// four rows first (Vector), then per row computes both gradients, casts them, writes each half's row-major
// codes and stages them. With ColumnSums, each column's sum over the tile's rows is added in produce_tile's
// order (the thread's four rows in order, then the eight row groups in order), so the partial sums and the
// bias gradient have the bits of the element-wise kernel over dinp.
template <Dtype Format, bool Vector, bool ColumnSums, typename In>
__device__ __forceinline__ void swiglu_backward_tile(const SwigluBackwardPairs<In>& pairs,
                                                     const FusedCast& cast, float scale, int64_t rows,
                                                     int64_t row0, int64_t col0, bool transposed_words,
                                                     float* column_partials, int c, int r_first,
                                                     StagedHalves& staged,
                                                     HalvesGroupSums<ColumnSums>& group_sums, Tally& t) {
  const int64_t C = pairs.C, cols = 2 * C;
  float sums[kHalves][4] = {};  // ColumnSums: columns c .. c+3 of this thread's rows, in each half
  const int64_t col = col0 + c;
  if (col < C) {
    if constexpr (Vector) {
      PairsLoaded<4, In> loaded[kRowsPerThread];
#pragma unroll
      for (int k = 0; k < kRowsPerThread; ++k) {
        const int64_t row = row0 + r_first + k * kRowGroups;
        if (row < rows) loaded[k] = pairs.template load<4>(row, col);
      }
#pragma unroll
      for (int k = 0; k < kRowsPerThread; ++k) {
        const int r = r_first + k * kRowGroups;
        const int64_t row = row0 + r;
        if (row >= rows) break;
        const PairGradients<4> g = pairs.template finish<4>(loaded[k], row, col);
        const uint32_t words[kHalves] = {cast_pack<Format>(g.gate, scale, t),
                                         cast_pack<Format>(g.up, scale, t)};
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          *reinterpret_cast<uint32_t*>(cast.output + row * cols + h * C + col) = words[h];
          *reinterpret_cast<uint32_t*>(&staged[h][r * kTileStride + c]) = words[h];
        }
        if constexpr (ColumnSums) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            sums[0][j] = __fadd_rn(sums[0][j], g.gate.v[j]);
            sums[1][j] = __fadd_rn(sums[1][j], g.up.v[j]);
          }
        }
      }
    } else {
      for (int k = 0; k < kRowsPerThread; ++k) {
        const int r = r_first + k * kRowGroups;
        const int64_t row = row0 + r;
        if (row >= rows) break;
        for (int j = 0; j < 4 && col + j < C; ++j) {
          const PairGradients<1> g =
              pairs.template finish<1>(pairs.template load<1>(row, col + j), row, col + j);
          const uint8_t codes[kHalves] = {static_cast<uint8_t>(cast_pack<Format>(g.gate, scale, t)),
                                          static_cast<uint8_t>(cast_pack<Format>(g.up, scale, t))};
          for (int h = 0; h < kHalves; ++h) {
            cast.output[row * cols + h * C + col + j] = codes[h];
            staged[h][r * kTileStride + c + j] = codes[h];
          }
          if constexpr (ColumnSums) {
            sums[0][j] = __fadd_rn(sums[0][j], g.gate.v[0]);
            sums[1][j] = __fadd_rn(sums[1][j], g.up.v[0]);
          }
        }
      }
    }
  }
  if constexpr (ColumnSums) {
    for (int h = 0; h < kHalves; ++h) {
      *reinterpret_cast<float4*>(&group_sums[h][r_first][c]) =
          make_float4(sums[h][0], sums[h][1], sums[h][2], sums[h][3]);
    }
  }
  __syncthreads();
  const int rows_in_tile = static_cast<int>(rows - row0 < kTileRows ? rows - row0 : kTileRows);
  const int cols_in_tile = static_cast<int>(C - col0 < kTileCols ? C - col0 : kTileCols);
  if (cast.output_transposed != nullptr) {
    for (int h = 0; h < kHalves; ++h) {
      write_transposed_tile(staged[h], kTileStride, rows_in_tile, cols_in_tile, cast.output_transposed, rows,
                            row0, h * C + col0, transposed_words);
    }
  }
  if constexpr (ColumnSums) {
    float* partial_row = column_partials + (row0 / kTileRows) * cols;
    for (int j = static_cast<int>(threadIdx.x); j < kHalves * cols_in_tile; j += kThreads) {
      const int h = j < cols_in_tile ? 0 : 1;
      const int column = j - h * cols_in_tile;
      float total = group_sums[h][0][column];
#pragma unroll
      for (int g = 1; g < kRowGroups; ++g) total = __fadd_rn(total, group_sums[h][g][column]);
      partial_row[h * C + col0 + column] = total;
    }
  }
  __syncthreads();  // the next tile overwrites the stage
}

// swiglu_backward_tile over every tile of the pairs [rows, C]: a block walks tiles blockIdx.x, + gridDim.x,
// ... in the order of produce_cast_transpose_kernel. A thread counts 32 elements a tile, both halves' share:
// with at most kMaxBlockStrides tiles a block, Tally's 32-bit counts stay exact.
template <Dtype Format, bool Vector, bool ColumnSums, typename In>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_cast_kernel(const SwigluBackwardPairs<In> pairs, const FusedCast cast, int64_t rows,
                                bool transposed_words, float* column_partials) {
  __shared__ __align__(16) StagedHalves staged;
  __shared__ __align__(16) HalvesGroupSums<ColumnSums> group_sums;
  const float scale = *cast.scale;
  const int c = tile_column_of_thread(), r_first = tile_row_of_thread();
  const int64_t tile_cols = (pairs.C + kTileCols - 1) / kTileCols;
  const int64_t tile_rows = (rows + kTileRows - 1) / kTileRows;
  Tally t{};
  if (tile_cols > 0) {  // C = 0: no tiles
    const int64_t step_rows = gridDim.x / tile_cols, step_cols = gridDim.x % tile_cols;
    int64_t tile_row = blockIdx.x / tile_cols, tile_col = blockIdx.x % tile_cols;
    while (tile_row < tile_rows) {
      const int64_t row0 = tile_row * kTileRows;
      const int64_t col0 = tile_col * kTileCols;
      tile_row += step_rows;  // the next tile's; row0 and col0 keep this one's
      tile_col += step_cols;
      if (tile_col >= tile_cols) {
        tile_col -= tile_cols;
        ++tile_row;
      }
      swiglu_backward_tile<Format, Vector, ColumnSums>(pairs, cast, scale, rows, row0, col0, transposed_words,
                                                       column_partials, c, r_first, staged, group_sums, t);
    }
  }
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

// swiglu_backward_cast_kernel over row groups (no bias gradient): group g's tiles with its own FusedCast.
template <Dtype Format, bool Vector, typename In>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_cast_grouped_kernel(const SwigluBackwardPairs<In> pairs, const CastGroupTable table) {
  __shared__ __align__(16) StagedHalves staged;
  __shared__ __align__(16) HalvesGroupSums<false> group_sums;
  const int c = tile_column_of_thread(), r_first = tile_row_of_thread();
  Tally t{};
  for_each_group_tile(table, (pairs.C + kTileCols - 1) / kTileCols, t,
                      [&](int g, int64_t row0, int64_t col0, bool first) {
                        const FusedCast& cast = table.cast[g];
                        const float scale = *cast.scale;
                        swiglu_backward_tile<Format, Vector, false>(
                            pairs.rows_from(table.row0[g]), cast, scale, table.rows[g], row0, col0,
                            table.transposed_words[g], nullptr, c, r_first, staged, group_sums, t);
                        write_scale_inv(cast.scale_inv, scale, first);
                      });
}

template <typename In>
void swiglu_forward_cast_of(float* out, const In* inp, int64_t rows, int64_t C, const FusedCast& cast,
                            cudaStream_t stream) {
  OCTET_REQUIRE(rows >= 0 && C >= 0, "swiglu_forward_cast: the shape must not be negative, got [{}, {}]",
                rows, C);
  check_cast(cast, rows * C, "swiglu_forward_cast");
  OCTET_REQUIRE(rows * C == 0 || inp != nullptr, "swiglu_forward_cast: inp must be given");
  const bool vector = C % 4 == 0 && elementwise::pack_aligned(inp) && (out == nullptr || aligned16(out));
  launch_elementwise(SwigluProducer<In>{out, inp, C}, vector, rows, C, cast, stream);
  OCTET_CUDA_CHECK_LAUNCH("swiglu_forward_cast");
}

template <typename In>
void swiglu_backward_cast_of(float* dinp, const In* inp, const In* dout, int64_t rows, int64_t C,
                             const FusedCast& cast, float* dbias, float* column_partials,
                             Workspace& workspace, cudaStream_t stream, const PartialSums& sums) {
  OCTET_REQUIRE(rows >= 0 && C >= 0, "swiglu_backward_cast: the shape must not be negative, got [{}, {}]",
                rows, C);
  const int64_t cols = 2 * C;
  check_cast(cast, rows * cols, "swiglu_backward_cast");
  OCTET_REQUIRE(rows * C == 0 || (inp != nullptr && dout != nullptr),
                "swiglu_backward_cast: inp and dout must be given");
  OCTET_REQUIRE(dbias == nullptr || rows * C == 0 || column_partials != nullptr,
                "swiglu_backward_cast: the bias gradient needs column_partials");
  check_sums(sums, workspace, "swiglu_backward_cast");
  if (!cast.results_zeroed) OCTET_CUDA_CHECK(cudaMemsetAsync(cast.results, 0, sizeof(CastResults), stream));
  const SwigluBackwardPairs<In> pairs{dinp, inp, dout, C};
  // 16-byte loads (bf16: 8) and 32-bit code stores where C % 4 == 0 and every pointer allows them.
  const bool vector = C % 4 == 0 && elementwise::pack_aligned(inp) && elementwise::pack_aligned(dout) &&
                      (dinp == nullptr || aligned16(dinp)) && aligned(cast.output, 4);
  const bool transposed_words = rows % 4 == 0 && aligned(cast.output_transposed, 4);
  const bool column_sums = dbias != nullptr;
  const int64_t tiles = ((rows + kTileRows - 1) / kTileRows) * ((C + kTileCols - 1) / kTileCols);
  with_format(cast.format, [&](auto format) {
    constexpr Dtype kFormat = decltype(format)::value;
    using Kernel = void (*)(SwigluBackwardPairs<In>, FusedCast, int64_t, bool, float*);
    const Kernel kernels[2][2] = {{swiglu_backward_cast_kernel<kFormat, false, false, In>,
                                   swiglu_backward_cast_kernel<kFormat, false, true, In>},
                                  {swiglu_backward_cast_kernel<kFormat, true, false, In>,
                                   swiglu_backward_cast_kernel<kFormat, true, true, In>}};
    const Kernel kernel = kernels[vector ? 1 : 0][column_sums ? 1 : 0];
    kernel<<<grid_size(tiles, 1, resident_blocks(kernel)), kThreads, 0, stream>>>(
        pairs, cast, rows, transposed_words, column_partials);
  });
  OCTET_CUDA_CHECK_LAUNCH("swiglu_backward_cast");
  if (column_sums) {
    add_partial_sums(dbias, column_partials, column_partial_rows(rows), cols, workspace, stream, sums);
  }
}

template <typename In>
void swiglu_forward_cast_grouped_of(float* out, const In* inp, int64_t C, std::span<const FusedCastGroup> groups,
                                    cudaStream_t stream) {
  OCTET_REQUIRE(C >= 0, "swiglu_forward_cast_grouped: C must not be negative, got {}", C);
  OCTET_REQUIRE(inp != nullptr, "swiglu_forward_cast_grouped: inp must be given");
  const bool vector = C % 4 == 0 && elementwise::pack_aligned(inp) && (out == nullptr || aligned16(out));
  launch_elementwise_grouped(SwigluProducer<In>{out, inp, C}, vector, C, groups, "swiglu_forward_cast_grouped",
                             stream);
  OCTET_CUDA_CHECK_LAUNCH("swiglu_forward_cast_grouped");
}

template <typename In>
void swiglu_backward_cast_grouped_of(float* dinp, const In* inp, const In* dout, int64_t C,
                                     std::span<const FusedCastGroup> groups, cudaStream_t stream) {
  OCTET_REQUIRE(C >= 0, "swiglu_backward_cast_grouped: C must not be negative, got {}", C);
  OCTET_REQUIRE(inp != nullptr && dout != nullptr, "swiglu_backward_cast_grouped: inp and dout must be given");
  const SwigluBackwardPairs<In> pairs{dinp, inp, dout, C};
  // Per group as swiglu_backward_cast_of: 16-byte loads and 32-bit code stores where C % 4 == 0 and every
  // pointer allows them (a group's first row keeps the alignment when C % 4 == 0).
  const bool vector_inputs = C % 4 == 0 && elementwise::pack_aligned(inp) && elementwise::pack_aligned(dout) &&
                             (dinp == nullptr || aligned16(dinp));
  for_each_group_table(groups, C, "swiglu_backward_cast_grouped", stream,
                       [&](const CastGroupTable& table, int64_t tiles, bool vector_outputs) {
                         with_format(groups.front().cast.format, [&](auto format) {
                           constexpr Dtype kFormat = decltype(format)::value;
                           const auto kernel = vector_inputs && vector_outputs
                                                   ? swiglu_backward_cast_grouped_kernel<kFormat, true, In>
                                                   : swiglu_backward_cast_grouped_kernel<kFormat, false, In>;
                           kernel<<<grid_size(tiles, 1, resident_blocks(kernel)), kThreads, 0, stream>>>(pairs,
                                                                                                       table);
                         });
                       });
  OCTET_CUDA_CHECK_LAUNCH("swiglu_backward_cast_grouped");
}

}  // namespace

void swiglu_forward_cast_grouped(float* out, const float* inp, int64_t C, std::span<const FusedCastGroup> groups,
                                 cudaStream_t stream) {
  swiglu_forward_cast_grouped_of(out, inp, C, groups, stream);
}

void swiglu_forward_cast_grouped(float* out, const uint16_t* inp, int64_t C,
                                 std::span<const FusedCastGroup> groups, cudaStream_t stream) {
  swiglu_forward_cast_grouped_of(out, inp, C, groups, stream);
}

void swiglu_backward_cast_grouped(float* dinp, const float* inp, const float* dout, int64_t C,
                                  std::span<const FusedCastGroup> groups, cudaStream_t stream) {
  swiglu_backward_cast_grouped_of(dinp, inp, dout, C, groups, stream);
}

void swiglu_backward_cast_grouped(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t C,
                                  std::span<const FusedCastGroup> groups, cudaStream_t stream) {
  swiglu_backward_cast_grouped_of(dinp, inp, dout, C, groups, stream);
}

void swiglu_forward_cast(float* out, const float* inp, int64_t rows, int64_t C, const FusedCast& cast,
                         cudaStream_t stream) {
  swiglu_forward_cast_of(out, inp, rows, C, cast, stream);
}

void swiglu_forward_cast(float* out, const uint16_t* inp, int64_t rows, int64_t C, const FusedCast& cast,
                         cudaStream_t stream) {
  swiglu_forward_cast_of(out, inp, rows, C, cast, stream);
}

void swiglu_backward_cast(float* dinp, const float* inp, const float* dout, int64_t rows, int64_t C,
                          const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                          cudaStream_t stream, const PartialSums& sums) {
  swiglu_backward_cast_of(dinp, inp, dout, rows, C, cast, dbias, column_partials, workspace, stream, sums);
}

void swiglu_backward_cast(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t rows, int64_t C,
                          const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                          cudaStream_t stream, const PartialSums& sums) {
  swiglu_backward_cast_of(dinp, inp, dout, rows, C, cast, dbias, column_partials, workspace, stream, sums);
}

}  // namespace octet::cuda
