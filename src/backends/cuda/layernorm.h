// LayerNorm's forward and backward on the GPU (layernorm.cu), on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "workspace.h"

namespace octet::cuda {

// Per row of inp [N, C]: out = (x - mean) * rstd * weight + bias; writes mean and rstd [N].
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream);
// The same with out in bf16 (its bits): each float32 value rounded once, to nearest, ties to even.
void layernorm_forward(uint16_t* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream);
// Accumulates into dinp [N, C], dweight [C] and dbias [C]. C is limited by shared memory (8 * C bytes per
// warp must fit a block: C up to about 29000 on Hopper).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream);
// The same with dout in bf16 (its bits), read as their float32 values.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const uint16_t* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream);

}  // namespace octet::cuda
