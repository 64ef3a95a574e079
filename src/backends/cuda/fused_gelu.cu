// GELU's forward and backward with the FP8 cast of what they produce (fused.h), in the same pass over the
// data; the backward also sums the bias gradient of the layer that produced its input. Bytes moved per
// element (float32 in, FP8 codes out; "out" is the float32 result, optional here):
//   GELU:      read 4, write 4 (out) + 1 (codes) + 1 (transposed)  = 10, or 6 without out; unfused 14.
//   GELU backward, with the consumer's bias gradient: read 8 (inp, dout), write 4 (dinp) + 1 + 1 = 14, or 10
//              without dinp (plus 1/8 out and in for the column partial sums); unfused 26 (gelu_backward
//              12, bias_backward 4, cast 6).
#include "fused.h"

#include <cstdint>

#include "elementwise.cuh"
#include "fused_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_raw;
using elementwise::Pack;
using elementwise::Raw;
using elementwise::store_pack;
using elementwise::widen;
using fused_internal::check_cast;
using fused_internal::check_sums;
using fused_internal::launch_elementwise;
using fused_internal::launch_with_bias_gradient;
using ops_internal::aligned16;

// The producers of the two ops (fused_common.cuh describes their two steps, load and finish).

// gelu.cu's Gelu: elementwise::gelu, over float32 or bf16 (In = uint16_t) inputs.
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

// gelu.cu's GeluGradient: elementwise::gelu_gradient, over float32 or bf16 (In = uint16_t) inputs. Each
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
  launch_with_bias_gradient(op, vector, rows, cols, cast, dbias, column_partials, workspace, stream, sums);
  OCTET_CUDA_CHECK_LAUNCH("gelu_backward_cast");
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

}  // namespace octet::cuda
