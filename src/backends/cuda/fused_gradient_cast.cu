// The FP8 cast of values as they are stored (fused.h): a linear layer's output gradient, with its bias
// gradient summed in the same pass (bias_backward_cast), and bf16 values (cast_bf16). Bytes moved per
// element (float32 in, FP8 codes out):
//   Bias gradient with the gradient cast: read 4 (dout), write 1 + 1 = 6 (plus 1/8 out and in for the
//              column partial sums); unfused 10 (bias_backward 4, cast 6).
#include "fused.h"

#include <cstdint>

#include "elementwise.cuh"
#include "fused_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"

namespace octet::cuda {
namespace {

using elementwise::load_raw;
using elementwise::Pack;
using elementwise::Raw;
using elementwise::widen;
using fused_internal::add_partial_sums;
using fused_internal::aligned;
using fused_internal::check_cast;
using fused_internal::check_sums;
using fused_internal::kTileRows;
using fused_internal::launch_elementwise;

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
  add_partial_sums(dbias, column_partials, column_partial_rows(rows), cols, workspace, stream, sums);
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

void cast_bf16(const uint16_t* x, int64_t rows, int64_t cols, const FusedCast& cast, cudaStream_t stream) {
  OCTET_REQUIRE(rows >= 0 && cols >= 0, "cast_bf16: the shape must not be negative, got [{}, {}]", rows,
                cols);
  check_cast(cast, rows * cols, "cast_bf16");
  OCTET_REQUIRE(rows * cols == 0 || x != nullptr, "cast_bf16: an input of [{}, {}] values", rows, cols);
  launch_elementwise(Bf16Producer{x}, aligned(x, 8), rows, cols, cast, stream);
  OCTET_CUDA_CHECK_LAUNCH("cast_bf16");
}

int64_t column_partial_rows(int64_t rows) {
  return (rows + fused_internal::kTileRows - 1) / fused_internal::kTileRows;
}

}  // namespace octet::cuda
