// GELU's forward and backward (gelu.h) over float32 or bf16 values, into float32 or bf16: element-wise maps
// on for_each (ops_common.cuh), whose arithmetic is elementwise.cuh's, which the fused GELU casts
// (fused_gelu.cu) run too.
#include "gelu.h"

#include "elementwise.cuh"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using ops_internal::check_size;
using ops_internal::for_each;
using ops_internal::Map1;
using ops_internal::Map2;

// ---------------------------------------------------------------------------------------------------------
// GELU: the reference's expressions, evaluated left to right as C++ groups them. The forward value and the
// gradient are elementwise.cuh's, shared with the fused GELU casts.

struct Gelu {
  __device__ float operator()(float x) const { return elementwise::gelu(x); }
};

// gelu'(x) * dout
struct GeluGradient {
  __device__ float operator()(float x, float dout) const { return elementwise::gelu_gradient(x, dout); }
};

template <typename In, typename Out>
void gelu_forward_of(Out* out, const In* inp, int64_t n, cudaStream_t stream) {
  check_size(n, "gelu_forward");
  if (n == 0) return;
  for_each(Map1<Gelu, In, Out>{out, inp, Gelu{}}, n,
           elementwise::pack_aligned(out) && elementwise::pack_aligned(inp), stream);
  OCTET_CUDA_CHECK_LAUNCH("gelu_forward");
}

template <typename In, typename Out>
void gelu_backward_of(Out* dinp, const In* inp, const In* dout, int64_t n, cudaStream_t stream) {
  check_size(n, "gelu_backward");
  if (n == 0) return;
  for_each(
      Map2<GeluGradient, In, Out>{dinp, inp, dout, GeluGradient{}}, n,
      elementwise::pack_aligned(dinp) && elementwise::pack_aligned(inp) && elementwise::pack_aligned(dout),
      stream);
  OCTET_CUDA_CHECK_LAUNCH("gelu_backward");
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_forward(float* out, const uint16_t* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_forward(uint16_t* out, const float* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_forward(uint16_t* out, const uint16_t* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_of(out, inp, n, stream);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void gelu_backward(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void gelu_backward(uint16_t* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

void gelu_backward(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, int64_t n,
                   cudaStream_t stream) {
  gelu_backward_of(dinp, inp, dout, n, stream);
}

}  // namespace octet::cuda
