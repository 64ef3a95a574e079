// AdamW with the FP8 cast of the updated weights (fused.h): over one weight matrix, or over the tiles of many
// in one launch. Bytes moved per element (float32 in, FP8 codes out):
//   AdamW:     read 16 (params, m, v, grads), write 12 + 1 + 1 = 30; unfused 34.
#include "fused.h"

#include <cstdint>
#include <vector>

#include "cast_element.cuh"
#include "elementwise.cuh"
#include "fused_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using cast_internal::flush_tally;
using cast_internal::Tally;
using cast_internal::write_scale_inv;
using elementwise::load_pack;
using elementwise::Pack;
using elementwise::store_pack;
using fused_internal::aligned;
using fused_internal::check_cast;
using fused_internal::GroupSums;
using fused_internal::kThreads;
using fused_internal::kTileCols;
using fused_internal::kTileRows;
using fused_internal::kTileStride;
using fused_internal::launch_elementwise;
using fused_internal::produce_tile;
using fused_internal::tile_column_of_thread;
using fused_internal::tile_row_of_thread;
using ops_internal::aligned16;

// adamw.cu's AdamW: elementwise::adamw_step on each element (adamw_pack's arithmetic, loads and stores), with
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
