// SwiGLU's forward and backward with the FP8 cast of what they produce (fused.h), in the same pass over the
// data; the backward also sums the bias gradient of the layer that produced its input, where it has one.
// Bytes moved per output element (float32 in, FP8 codes out; "out" is the float32 result, optional here):
//   SwiGLU:    read 8 (gate, up), write 4 (out) + 1 (codes) + 1 (transposed) = 14, or 10 without out;
//              unfused 18.
//   SwiGLU backward, per element of dinp [N, 2C]: read 12 (gate, up, dout: each pair's three values are
//              read by the thread of its gate gradient and again by that of its up gradient, the second time
//              mostly from L2), write 4 (dinp) + 1 + 1 = 18, or 14 without dinp; unfused (swiglu_backward 10,
//              the cast 6, bias_backward 4) 20.
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

// The producers of the two ops (fused_common.cuh describes their two steps, load and finish). Element i is
// the flat index into the produced tensor: out [rows, C] in the forward, dinp [rows, 2C] in the backward.
// Both take whole packs from one half of one row: the launcher asks for packs of four only where C % 4 == 0.

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
};

// swiglu.cu's backward: elementwise::swiglu_gradient, its gate or its up half as element i lies. dinp must
// not overlap inp or dout (another thread reads the pair whose gradient this one writes).
template <typename In>
struct SwigluBackwardProducer {
  static constexpr bool kLoadRowsFirst = true;
  float* dinp;  // may be null
  const In* inp;
  const In* dout;
  int64_t C;
  template <int W>
  struct Loaded {
    Raw<W, In> gate, up, d;
    bool up_half;
  };
  template <int W>
  __device__ __forceinline__ Loaded<W> load(int64_t i) const {
    const int64_t r = i / (2 * C);
    const int64_t c = i - r * 2 * C;
    const bool up_half = c >= C;
    const int64_t column = up_half ? c - C : c;
    const In* gate = inp + r * 2 * C + column;
    return {load_raw<W>(gate), load_raw<W>(gate + C), load_raw<W>(dout + r * C + column), up_half};
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(const Loaded<W>& loaded, int64_t i) const {
    const Pack<W> x = widen(loaded.gate), y = widen(loaded.up), d = widen(loaded.d);
    Pack<W> g;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const elementwise::SwigluGradient gradient = elementwise::swiglu_gradient(x.v[k], y.v[k], d.v[k]);
      g.v[k] = loaded.up_half ? gradient.up : gradient.gate;
    }
    if (dinp != nullptr) store_pack<W>(dinp + i, g);
    return g;
  }
};

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
  const SwigluBackwardProducer<In> op{dinp, inp, dout, C};
  const bool vector = C % 4 == 0 && elementwise::pack_aligned(inp) && elementwise::pack_aligned(dout) &&
                      (dinp == nullptr || aligned16(dinp));
  launch_with_bias_gradient(op, vector, rows, cols, cast, dbias, column_partials, workspace, stream, sums);
  OCTET_CUDA_CHECK_LAUNCH("swiglu_backward_cast");
}

}  // namespace

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
