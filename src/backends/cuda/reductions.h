// Reductions of a tensor to values on the host (reductions.cu): the gradient norm's sum of squares, the
// check for non-finite values, and a calibration's counts of magnitudes.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "octet/backend/backend.h"
#include "workspace.h"

namespace octet::cuda {

// Sum of x^2 in float64, in an order fixed by n; waits for the stream. The bf16 form (bits) sums the float32
// values, in the order of n floats where x is 8-byte aligned (16 for floats).
double sum_of_squares(const float* x, int64_t n, Workspace& workspace, cudaStream_t stream);
double sum_of_squares(const uint16_t* x, int64_t n, Workspace& workspace, cudaStream_t stream);
// Whether no element is Inf or NaN; waits for the stream.
bool all_finite(const float* x, int64_t n, Workspace& workspace, cudaStream_t stream);
// Adds the magnitudes of x (float32, or bf16 bits) to `counts` (MagnitudeCounts: bins, zeros, Inf and NaN,
// amax); waits for the stream.
void count_magnitudes(MagnitudeCounts& counts, const float* x, int64_t n, Workspace& workspace,
                      cudaStream_t stream);
void count_magnitudes(MagnitudeCounts& counts, const uint16_t* x, int64_t n, Workspace& workspace,
                      cudaStream_t stream);

}  // namespace octet::cuda
