// The fused FP8 cast of the CUDA backend: one pass over a float32 matrix that writes its FP8 codes (and,
// optionally, the codes of its transpose, which Hopper's FP8 GEMMs need for the backward pass), its amax and
// what the cast saw. Bit-exact with the CPU reference octet::quantize_with_scale: the same encoder
// (octet/numerics/minifloat.h) runs on the device, and stochastic rounding draws the same counter-based bits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "octet/numerics/quantize.h"

namespace octet::cuda {

// What one cast produced besides its codes. Lives in device memory so that a later kernel (the next scale, a
// GEMM's amax input) can read it without a host round trip; cast_amax zeroes it on the stream first, unless
// told that it holds zeros already (the CUDA backend clears its layers' results as it applies their updates,
// which spares each cast a memset on the stream).
struct CastResults {
  float amax;                    // max |x| over the input; NaN if any input is NaN (as octet::compute_amax)
  uint32_t reserved;             // keeps the counters 8-byte aligned
  unsigned long long saturated;  // as octet::CastStats: beyond the largest finite value, Inf inputs included
  unsigned long long underflowed;  // non-zero inputs that became +-0
  unsigned long long nan_inputs;   // NaN inputs
  unsigned long long nonzero;      // non-zero finite inputs (the base of the underflow fraction)
};

// One cast. Every pointer is device memory.
struct CastAmaxArguments {
  const float* input = nullptr;  // [rows, cols], row-major
  int64_t rows = 0;
  int64_t cols = 0;
  Dtype format = Dtype::e4m3;            // e4m3 or e5m2
  const float* scale = nullptr;          // one value: codes are cast(x * scale), as the CPU reference
  uint8_t* output = nullptr;             // [rows, cols] codes
  uint8_t* output_transposed = nullptr;  // [cols, rows] codes; null: not written
  float* scale_inv = nullptr;            // one value: 1 / scale is written there; null: not written
  CastResults* results = nullptr;        // amax and counts
  bool results_zeroed = false;           // results already hold zeros: cast_amax does not zero them first
  CastOptions options;  // overflow, rounding; stochastic: element i uses CounterRng(seed).bits(i)
};

// Enqueues the cast on `stream`. Throws octet::Error (invalid_input) for a format other than e4m3/e5m2, a
// negative shape or a missing pointer, and (internal) when CUDA reports an error.
void cast_amax(const CastAmaxArguments& arguments, cudaStream_t stream);

// max |x| over n values into results->amax (NaN if any is NaN); the other fields of results are zeroed.
void amax_only(const float* input, int64_t n, CastResults* results, cudaStream_t stream);

// The host side of a whole cast, for tests and tools: copies x to the device, casts, waits, copies back.
struct DeviceCastOutput {
  QuantizedTensor tensor;           // as octet::quantize_with_scale returns it (per-tensor, stats filled)
  std::vector<uint8_t> transposed;  // [cols, rows] codes; empty unless asked for
};

DeviceCastOutput cast_on_device(std::span<const float> x, int64_t rows, int64_t cols, Dtype format,
                                float scale, const CastOptions& options = {}, bool transposed = true);

}  // namespace octet::cuda
