// Element-wise float32 arithmetic (arithmetic.h): the sum (residual adds, accumulation), scaling and zeroing,
// each value rounded once, as the CPU reference rounds it.
#include "arithmetic.h"

#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using ops_internal::aligned16;
using ops_internal::check_size;
using ops_internal::for_each;
using ops_internal::Map1;
using ops_internal::Map2;

struct Add {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
struct Multiply {
  float factor;
  __device__ float operator()(float x) const { return __fmul_rn(x, factor); }
};

}  // namespace

void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  check_size(n, "add");
  if (n == 0) return;
  for_each(Map2<Add>{out, a, b, Add{}}, n, aligned16(out) && aligned16(a) && aligned16(b), stream);
  OCTET_CUDA_CHECK_LAUNCH("add");
}

void scale(float* x, int64_t n, float factor, cudaStream_t stream) {
  check_size(n, "scale");
  if (n == 0) return;
  for_each(Map1<Multiply>{x, x, Multiply{factor}}, n, aligned16(x), stream);
  OCTET_CUDA_CHECK_LAUNCH("scale");
}

void fill_zero(float* x, int64_t n, cudaStream_t stream) {
  check_size(n, "fill_zero");
  if (n == 0) return;
  OCTET_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), stream));
}

}  // namespace octet::cuda
