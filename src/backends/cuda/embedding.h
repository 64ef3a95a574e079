// GPT-2's token and position embeddings on the GPU (embedding.cu), on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "workspace.h"

namespace octet::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                     int64_t T, int64_t C, cudaStream_t stream);
// dwte[tokens[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:], each sum taken in (b, t) order, as the CPU
// reference takes it, so the results are bit-identical to it.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                      int64_t T, int64_t C, Workspace& workspace, cudaStream_t stream);

}  // namespace octet::cuda
