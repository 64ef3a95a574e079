// Token embeddings, with learned positions or without, on the GPU (embedding.cu), on device pointers,
// enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "workspace.h"

namespace octet::cuda {

// out[b,t,:] = table[tokens[b,t],:] + positions[t,:]; the table's row as it is where positions is null.
void embedding_forward(float* out, const int32_t* tokens, const float* table, const float* positions,
                       int64_t B, int64_t T, int64_t C, cudaStream_t stream);
// dtable[tokens[b,t],:] += dout[b,t,:] and dpositions[t,:] += dout[b,t,:] (where dpositions is not null),
// each sum taken in (b, t) order, as the CPU reference takes it, so the results are bit-identical to it.
void embedding_backward(float* dtable, float* dpositions, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C, Workspace& workspace, cudaStream_t stream);

}  // namespace octet::cuda
