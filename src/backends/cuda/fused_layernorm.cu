// LayerNorm's and RMSNorm's forwards with the FP8 cast of their output (fused.h), in the same pass over the
// data. Bytes moved per element (float32 in, FP8 codes out; "out" is the float32 result, optional here):
//   LayerNorm, RMSNorm: read 4, write 4 (out) + 1 (codes) + 1 (transposed) = 10, or 6 without out (weight,
//              bias, mean and rstd are per row or per column); unfused 14.
#include "fused.h"

#include <cstdint>

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
using elementwise::kWarp;
using elementwise::Pack;
using elementwise::store_pack;
using fused_internal::aligned;
using fused_internal::cast_pack;
using fused_internal::check_cast;
using fused_internal::kTileRows;
using fused_internal::store_codes;
using fused_internal::transpose_code_bytes;
using fused_internal::with_format;
using fused_internal::write_transposed_tile;
using ops_internal::aligned16;
using ops_internal::device_attribute;

constexpr int kLayernormRowWarps = 8;    // row-major kernel: a row per warp, as layernorm_forward
constexpr int kLayernormTileWarps = 16;  // transposed kernel: 32 rows, two per warp

// ---------------------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm. The statistics and the normalisation are layernorm.cu's and rmsnorm.cu's
// (elementwise::layernorm_statistics and layernorm_normalise, rmsnorm_rstd and rmsnorm_normalise): one warp
// per row, lane l summing elements l*W, l*W + 32*W, ... in float64, then a butterfly; W (4 or 1) must
// therefore be the one layernorm_forward (rmsnorm_forward) picks for the same pointers, or the float64 sums
// would be taken in another order. RMSNorm's rows take two passes where LayerNorm's take three.
//
// Transposed codes: a block takes 32 rows; each warp normalises whole rows exactly as layernorm_forward does
// (three passes over one row, the second and third served from L1/L2 while the row is fresh), and stages
// the row's codes in shared memory, 32 x C bytes; the block then writes the transposed codes as 32-byte
// column segments. The alternatives lose: writing row-major codes and transposing them in a second kernel
// moves one more byte in and out per element and costs a launch; tiling the columns (32 rows x 128
// columns at a time) needs the statistics first and then a third pass over all 32 rows, 32 x 4C bytes that
// no longer stay in cache between passes. The limit is shared memory: 32 x C bytes must fit a block (C up
// to about 7200 on Hopper); beyond that the row-major kernel runs and a byte transpose follows.

// The row ops of the two normalizations: the statistics of a row (statistics<W>, every lane of the warp
// calls it), its outputs (normalise<W>) and what the op saves per row (save, lane 0).
struct LayernormRows {
  float* mean;
  float* rstd;
  const float* weight;
  const float* bias;
  template <int W>
  __device__ __forceinline__ elementwise::RowStatistics statistics(const float* x, int64_t C,
                                                                   int lane) const {
    return elementwise::layernorm_statistics<W>(x, C, lane);
  }
  template <int W>
  __device__ __forceinline__ Pack<W> normalise(const float* x, int64_t i,
                                               const elementwise::RowStatistics& r) const {
    return elementwise::layernorm_normalise<W>(x, weight, bias, i, r);
  }
  __device__ __forceinline__ void save(int64_t row, const elementwise::RowStatistics& r) const {
    mean[row] = r.mean;
    rstd[row] = r.rstd;
  }
};

struct RmsnormRows {
  float* rstd;
  const float* weight;
  template <int W>
  __device__ __forceinline__ float statistics(const float* x, int64_t C, int lane) const {
    return elementwise::rmsnorm_rstd<W>(x, C, lane);
  }
  template <int W>
  __device__ __forceinline__ Pack<W> normalise(const float* x, int64_t i, float s) const {
    return elementwise::rmsnorm_normalise<W>(x, weight, i, s);
  }
  __device__ __forceinline__ void save(int64_t row, float s) const { rstd[row] = s; }
};

template <typename Rows>
struct NormArguments {
  Rows rows;
  float* out;  // may be null
  const float* inp;
  int64_t N;
  int64_t C;
};

// One row by one warp: layernorm_forward_kernel's (or rmsnorm_forward_kernel's) arithmetic, then the codes
// of the row to the row-major output and, when `staged` is not null, to shared memory.
template <int W, Dtype Format, typename Rows>
__device__ __forceinline__ void normalise_row(const NormArguments<Rows>& a, const FusedCast& cast,
                                              float scale, bool code_words, int64_t row, uint8_t* staged,
                                              Tally& t) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t C = a.C;
  const float* x = a.inp + row * C;
  const auto r = a.rows.template statistics<W>(x, C, lane);
  float* o = a.out == nullptr ? nullptr : a.out + row * C;
  uint8_t* codes = cast.output + row * C;
  for (int64_t i = lane * W; i < C; i += kWarp * W) {
    const Pack<W> p = a.rows.template normalise<W>(x, i, r);
    if (o != nullptr) store_pack<W>(o + i, p);
    const uint32_t word = cast_pack<Format>(p, scale, t);
    store_codes<W>(codes + i, word, code_words);
    if (staged != nullptr) store_codes<W>(staged + i, word, true);  // rows of 4 x odd bytes: aligned
  }
  if (lane == 0) a.rows.save(row, r);
}

// Row-major codes only: a row per warp.
template <int W, Dtype Format, typename Rows>
__global__ void __launch_bounds__(kLayernormRowWarps* kWarp)
    normalization_cast_kernel(const NormArguments<Rows> a, const FusedCast cast, bool code_words) {
  const float scale = *cast.scale;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kLayernormRowWarps + threadIdx.x / kWarp;
  Tally t{};
  if (row < a.N) normalise_row<W, Format>(a, cast, scale, code_words, row, nullptr, t);
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

// Row-major and transposed codes: kTileRows rows per block, staged in dynamic shared memory
// (kTileRows x stride bytes).
template <int W, Dtype Format, typename Rows>
__global__ void __launch_bounds__(kLayernormTileWarps* kWarp, 2)
    normalization_cast_transpose_kernel(const NormArguments<Rows> a, const FusedCast cast, bool code_words,
                                        bool transposed_words, int64_t stride) {
  extern __shared__ __align__(16) uint8_t staged_rows[];
  const float scale = *cast.scale;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  Tally t{};
  for (int r = static_cast<int>(threadIdx.x / kWarp); r < kTileRows; r += kLayernormTileWarps) {
    if (row0 + r < a.N)
      normalise_row<W, Format>(a, cast, scale, code_words, row0 + r, staged_rows + r * stride, t);
  }
  __syncthreads();
  const int rows_in_tile = static_cast<int>(a.N - row0 < kTileRows ? a.N - row0 : kTileRows);
  write_transposed_tile(staged_rows, stride, rows_in_tile, static_cast<int>(a.C), cast.output_transposed, a.N,
                        row0, 0, transposed_words);
  write_scale_inv(cast.scale_inv, scale);
  flush_tally(t, cast.results);
}

// Bytes per staged LayerNorm row: C rounded up to 4 x odd (see kTileStride).
int64_t staged_stride(int64_t C) {
  int64_t stride = (C + 3) / 4 * 4;
  if ((stride / 4) % 2 == 0) stride += 4;
  return stride;
}

template <int W, Dtype Format, typename Rows>
void launch_normalization(const NormArguments<Rows>& a, const FusedCast& cast, bool code_words,
                          cudaStream_t stream) {
  if (cast.output_transposed != nullptr && a.N > 0) {
    const auto kernel = normalization_cast_transpose_kernel<W, Format, Rows>;
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
  normalization_cast_kernel<W, Format, Rows>
      <<<static_cast<unsigned>(blocks < 1 ? 1 : blocks), kLayernormRowWarps * kWarp, 0, stream>>>(a, cast,
                                                                                                  code_words);
  if (cast.output_transposed != nullptr && a.N > 0) {
    OCTET_CUDA_CHECK_LAUNCH("normalization_cast_kernel");
    transpose_code_bytes(cast.output, cast.output_transposed, a.N, a.C, stream);
  }
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
  const NormArguments<LayernormRows> a{{mean, rstd, weight, bias}, out, inp, N, C};
  // layernorm_forward's choice of W, with a missing out counting as aligned.
  const bool vector = C % 4 == 0 && (out == nullptr || aligned16(out)) && aligned16(inp) &&
                      aligned16(weight) && aligned16(bias);
  const bool code_words = vector && aligned(cast.output, 4);
  with_format(cast.format, [&](auto format) {
    if (vector) {
      launch_normalization<4, decltype(format)::value>(a, cast, code_words, stream);
    } else {
      launch_normalization<1, decltype(format)::value>(a, cast, code_words, stream);
    }
  });
  OCTET_CUDA_CHECK_LAUNCH("layernorm_forward_cast");
}

void rmsnorm_forward_cast(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                          int64_t C, const FusedCast& cast, cudaStream_t stream) {
  OCTET_REQUIRE(N >= 0 && C > 0, "rmsnorm_forward_cast: N >= 0 and C > 0, got N={} C={}", N, C);
  check_cast(cast, N * C, "rmsnorm_forward_cast");
  OCTET_REQUIRE(N == 0 || (rstd != nullptr && inp != nullptr && weight != nullptr),
                "rmsnorm_forward_cast: rstd, inp and weight must be given");
  if (!cast.results_zeroed) OCTET_CUDA_CHECK(cudaMemsetAsync(cast.results, 0, sizeof(CastResults), stream));
  const NormArguments<RmsnormRows> a{{rstd, weight}, out, inp, N, C};
  // rmsnorm_forward's choice of W, with a missing out counting as aligned.
  const bool vector = C % 4 == 0 && (out == nullptr || aligned16(out)) && aligned16(inp) && aligned16(weight);
  const bool code_words = vector && aligned(cast.output, 4);
  with_format(cast.format, [&](auto format) {
    if (vector) {
      launch_normalization<4, decltype(format)::value>(a, cast, code_words, stream);
    } else {
      launch_normalization<1, decltype(format)::value>(a, cast, code_words, stream);
    }
  });
  OCTET_CUDA_CHECK_LAUNCH("rmsnorm_forward_cast");
}

}  // namespace octet::cuda
