// RMSNorm's forward and backward on the GPU (rmsnorm.cu), on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "workspace.h"

namespace octet::cuda {

// Per row of inp [N, C]: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + 1e-5); writes rstd [N].
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     cudaStream_t stream);
// The same with out in bf16 (its bits): each float32 value rounded once, to nearest, ties to even.
void rmsnorm_forward(uint16_t* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     cudaStream_t stream);
// Accumulates into dinp [N, C] and dweight [C]. Rows wider than 8192 are limited by shared memory (4 * C
// bytes per warp must fit a block).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C, Workspace& workspace, cudaStream_t stream);
// The same with dout in bf16 (its bits), read as their float32 values.
void rmsnorm_backward(float* dinp, float* dweight, const uint16_t* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int64_t C, Workspace& workspace,
                      cudaStream_t stream);

}  // namespace octet::cuda
