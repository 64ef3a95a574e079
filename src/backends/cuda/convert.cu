// Conversions between float32 and the 16-bit formats (convert.h): float32 to bf16 and f16 codes, bf16 codes
// to float32, and float32 values rounded to bf16 or f16; to nearest, ties to even, as the CPU reference's
// round_to_bf16 and round_to_f16.
#include "convert.h"

#include <algorithm>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::load_pack;
using elementwise::Pack;
using ops_internal::aligned16;
using ops_internal::bf16_bits;
using ops_internal::check_size;
using ops_internal::for_each;
using ops_internal::Map1;

struct RoundBf16 {
  __device__ float operator()(float x) const { return round_to_bf16(x); }
};
struct RoundF16 {
  __device__ float operator()(float x) const { return round_to_f16(x); }
};

__device__ __forceinline__ uint16_t f16_bits(float x) {
  // round_to_f16's result is an FP16 value, which the hardware conversion then represents exactly; NaN is
  // written as the canonical 0x7FFF, as octet::float_to_f16 writes it.
  const float r = round_to_f16(x);
  return r != r ? static_cast<uint16_t>(0x7FFFu) : __half_as_ushort(__float2half_rn(r));
}

// With W = 4 the output is 8-byte aligned and written as one 64-bit store.
template <bool Bf16>
struct Convert {
  uint16_t* out;
  const float* in;
  template <int W>
  __device__ void apply(int64_t i) const {
    const Pack<W> p = load_pack<W>(in + i);
    uint16_t codes[W];
#pragma unroll
    for (int k = 0; k < W; ++k) codes[k] = Bf16 ? bf16_bits(p.v[k]) : f16_bits(p.v[k]);
    if constexpr (W == 4) {
      uint2 packed;
      packed.x = static_cast<uint32_t>(codes[0]) | (static_cast<uint32_t>(codes[1]) << 16);
      packed.y = static_cast<uint32_t>(codes[2]) | (static_cast<uint32_t>(codes[3]) << 16);
      *reinterpret_cast<uint2*>(out + i) = packed;
    } else {
      out[i] = codes[0];
    }
  }
};

}  // namespace

void convert_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream) {
  check_size(n, "convert_to_bf16");
  if (n == 0) return;
  auto* codes = reinterpret_cast<uint16_t*>(out);
  for_each(Convert<true>{codes, in}, n, reinterpret_cast<uintptr_t>(out) % 8 == 0 && aligned16(in), stream);
  OCTET_CUDA_CHECK_LAUNCH("convert_to_bf16");
}

namespace {

// Eight bf16 values per thread where both sides allow 16-byte accesses, one otherwise.
__global__ void convert_from_bf16_kernel(float* out, const uint16_t* in, int64_t n, bool vectorised) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vectorised) {
    for (; i * 8 + 7 < n; i += stride) {
      const uint4 packed = reinterpret_cast<const uint4*>(in)[i];
      const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
      float4 lo, hi;
      lo.x = __uint_as_float(words[0] << 16);
      lo.y = __uint_as_float(words[0] & 0xFFFF0000u);
      lo.z = __uint_as_float(words[1] << 16);
      lo.w = __uint_as_float(words[1] & 0xFFFF0000u);
      hi.x = __uint_as_float(words[2] << 16);
      hi.y = __uint_as_float(words[2] & 0xFFFF0000u);
      hi.z = __uint_as_float(words[3] << 16);
      hi.w = __uint_as_float(words[3] & 0xFFFF0000u);
      reinterpret_cast<float4*>(out)[2 * i] = lo;
      reinterpret_cast<float4*>(out)[2 * i + 1] = hi;
    }
    // The tail past the last whole group of eight.
    const int64_t done = n / 8 * 8;
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t < n - done) out[done + t] = __uint_as_float(static_cast<uint32_t>(in[done + t]) << 16);
    return;
  }
  for (; i < n; i += stride) out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}

}  // namespace

void convert_from_bf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream) {
  check_size(n, "convert_from_bf16");
  if (n == 0) return;
  const bool vectorised = aligned16(out) && reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const int64_t work = vectorised ? std::max<int64_t>(n / 8, 1) : n;
  const int64_t blocks = std::clamp<int64_t>((work + 255) / 256, 1, 132 * 16);
  convert_from_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, in, n, vectorised);
  OCTET_CUDA_CHECK_LAUNCH("convert_from_bf16_kernel");
}

void convert_to_f16(__half* out, const float* in, int64_t n, cudaStream_t stream) {
  check_size(n, "convert_to_f16");
  if (n == 0) return;
  auto* codes = reinterpret_cast<uint16_t*>(out);
  for_each(Convert<false>{codes, in}, n, reinterpret_cast<uintptr_t>(out) % 8 == 0 && aligned16(in), stream);
  OCTET_CUDA_CHECK_LAUNCH("convert_to_f16");
}

void round_in_place(float* x, int64_t n, Dtype dtype, cudaStream_t stream) {
  round_copy(x, x, n, dtype, stream);
}

void round_copy(float* out, const float* in, int64_t n, Dtype dtype, cudaStream_t stream) {
  check_size(n, "round_copy");
  OCTET_CHECK(dtype == Dtype::bf16 || dtype == Dtype::f16, "round_copy: bf16 or f16, got dtype {}",
              static_cast<int>(dtype));
  if (n == 0) return;
  const bool vectorize = aligned16(out) && aligned16(in);
  if (dtype == Dtype::bf16) {
    for_each(Map1<RoundBf16>{out, in, RoundBf16{}}, n, vectorize, stream);
  } else {
    for_each(Map1<RoundF16>{out, in, RoundF16{}}, n, vectorize, stream);
  }
  OCTET_CUDA_CHECK_LAUNCH("round_copy");
}

}  // namespace octet::cuda
