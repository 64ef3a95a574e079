// SwiGLU's forward and backward (swiglu.h) over float32 or bf16 values, into float32 or bf16: a thread takes
// W (4 where the shape and pointers allow 16-byte loads, else 1) adjacent columns of one row, reading their
// gate and up values once and, in the backward, writing both of their gradients. The arithmetic is
// elementwise.cuh's, which the fused SwiGLU casts (fused_swiglu.cu) run too.
#include "swiglu.h"

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_pack;
using elementwise::Pack;
using ops_internal::flat_grid;
using ops_internal::kThreads;
using ops_internal::store_pack;

// Columns c .. c+W-1 of row r for the group of W outputs that starts at flat index i of [N, C].
struct RowColumn {
  int64_t r;
  int64_t c;
};
__device__ __forceinline__ RowColumn row_column(int64_t i, int64_t C) {
  const int64_t r = i / C;
  return {r, i - r * C};
}

// A grid-stride loop over the groups of W outputs (groups = N C / W, W dividing C).
template <int W, typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(Out* out, const In* inp, int64_t groups, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const auto [r, c] = row_column(g * W, C);
    const In* gate = inp + r * 2 * C + c;
    const Pack<W> x = load_pack<W>(gate), y = load_pack<W>(gate + C);
    Pack<W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = elementwise::swiglu(x.v[k], y.v[k]);
    store_pack<W>(out + g * W, o);
  }
}

template <int W, typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(Out* dinp, const In* inp, const In* dout, int64_t groups, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const auto [r, c] = row_column(g * W, C);
    const int64_t at = r * 2 * C + c;
    const Pack<W> x = load_pack<W>(inp + at), y = load_pack<W>(inp + at + C), d = load_pack<W>(dout + g * W);
    Pack<W> dgate, dup;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const elementwise::SwigluGradient gradient = elementwise::swiglu_gradient(x.v[k], y.v[k], d.v[k]);
      dgate.v[k] = gradient.gate;
      dup.v[k] = gradient.up;
    }
    store_pack<W>(dinp + at, dgate);
    store_pack<W>(dinp + at + C, dup);
  }
}

void check_shape(int64_t N, int64_t C, const char* op) {
  OCTET_CHECK(N >= 0 && C >= 0, "{}: the shape must not be negative, got N={} C={}", op, N, C);
}

template <typename In, typename Out>
void swiglu_forward_of(Out* out, const In* inp, int64_t N, int64_t C, cudaStream_t stream) {
  check_shape(N, C, "swiglu_forward");
  const int64_t n = N * C;
  if (n == 0) return;
  if (C % 4 == 0 && elementwise::pack_aligned(out) && elementwise::pack_aligned(inp)) {
    swiglu_forward_kernel<4><<<flat_grid(n / 4), kThreads, 0, stream>>>(out, inp, n / 4, C);
  } else {
    swiglu_forward_kernel<1><<<flat_grid(n), kThreads, 0, stream>>>(out, inp, n, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
}

template <typename In, typename Out>
void swiglu_backward_of(Out* dinp, const In* inp, const In* dout, int64_t N, int64_t C, cudaStream_t stream) {
  check_shape(N, C, "swiglu_backward");
  const int64_t n = N * C;
  if (n == 0) return;
  if (C % 4 == 0 && elementwise::pack_aligned(dinp) && elementwise::pack_aligned(inp) &&
      elementwise::pack_aligned(dout)) {
    swiglu_backward_kernel<4><<<flat_grid(n / 4), kThreads, 0, stream>>>(dinp, inp, dout, n / 4, C);
  } else {
    swiglu_backward_kernel<1><<<flat_grid(n), kThreads, 0, stream>>>(dinp, inp, dout, n, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
}

}  // namespace

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t C, cudaStream_t stream) {
  swiglu_forward_of(out, inp, N, C, stream);
}

void swiglu_forward(float* out, const uint16_t* inp, int64_t N, int64_t C, cudaStream_t stream) {
  swiglu_forward_of(out, inp, N, C, stream);
}

void swiglu_forward(uint16_t* out, const float* inp, int64_t N, int64_t C, cudaStream_t stream) {
  swiglu_forward_of(out, inp, N, C, stream);
}

void swiglu_forward(uint16_t* out, const uint16_t* inp, int64_t N, int64_t C, cudaStream_t stream) {
  swiglu_forward_of(out, inp, N, C, stream);
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t C,
                     cudaStream_t stream) {
  swiglu_backward_of(dinp, inp, dout, N, C, stream);
}

void swiglu_backward(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t N, int64_t C,
                     cudaStream_t stream) {
  swiglu_backward_of(dinp, inp, dout, N, C, stream);
}

void swiglu_backward(uint16_t* dinp, const float* inp, const float* dout, int64_t N, int64_t C,
                     cudaStream_t stream) {
  swiglu_backward_of(dinp, inp, dout, N, C, stream);
}

void swiglu_backward(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, int64_t N, int64_t C,
                     cudaStream_t stream) {
  swiglu_backward_of(dinp, inp, dout, N, C, stream);
}

}  // namespace octet::cuda
