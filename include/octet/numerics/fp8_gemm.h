// The CPU emulation of a Hopper FP8 GEMM, the reference that the cuBLASLt path is held to:
//   D = alpha * dequant(A) x dequant(B)^T + beta * C
// A is [M, K] and B is [N, K], both row-major, so both are K-major ("TN" in cuBLASLt's column-major terms);
// C and D are [M, N] row-major. Products accumulate in float32. Per-tensor scales apply once after the
// reduction (as cuBLASLt applies its scale pointers); block scales promote each block's partial sum to the
// float32 accumulator multiplied by its two scales.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "octet/numerics/quantize.h"

namespace octet {

enum class GemmAccumulation : uint8_t {
  reference,  // plain loops, fixed reduction order
  blas,       // dequantize to float32, then the BLAS's sgemm (another reduction order); refused by
              // fp8_gemm_can_implement when octet was built without a BLAS
};

struct Fp8GemmArguments {
  const QuantizedTensor* a = nullptr;  // [M, K]
  const QuantizedTensor* b = nullptr;  // [N, K]
  float alpha = 1.0f;
  float beta = 0.0f;
  std::span<const float> c;   // [M, N]; required when beta != 0
  Dtype output = Dtype::f32;  // f32, bf16, e4m3 or e5m2
  float output_scale = 1.0f;  // FP8 output: q = cast(D * output_scale)
  GemmAccumulation accumulation = GemmAccumulation::reference;
};

struct GemmOutput {
  Dtype dtype = Dtype::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;    // f32: D; bf16: D rounded to bf16; FP8: code * (1 / output_scale)
  std::vector<uint16_t> codes;  // bf16 and FP8 outputs: the stored codes
  float amax = 0.0f;            // max |D| before output scaling and rounding
  CastStats stats;              // FP8 output only
};

// Empty when the arguments can run; otherwise why not (shapes, formats, scale layouts).
std::string fp8_gemm_can_implement(const Fp8GemmArguments& args);
bool blas_available();

// Throws octet::Error (invalid input) with fp8_gemm_can_implement's reason when the arguments cannot run.
GemmOutput fp8_gemm(const Fp8GemmArguments& args);

// D = A x B^T in float32 from float32 operands ([M,K], [N,K]), plain loops; the tests' and GEMM's baseline.
std::vector<float> reference_gemm_f32(std::span<const float> a, std::span<const float> b, int64_t m,
                                      int64_t n, int64_t k);

}  // namespace octet
