// The loss of a language model's logits and its gradient on the GPU (softmax_cross_entropy.cu), on device
// pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace octet::cuda {

// Softmax cross-entropy over the first V of Vp logits per row: losses [N] = -log p[target]. When dloss != 0,
// logits are overwritten with dloss * (softmax - onehot(target)), zero in the padded columns.
void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream);
// The same over BF16 logits (a BF16 GEMM's output), the gradient written back in BF16: the same losses, and
// the float32 path's gradient rounded to nearest even.
void softmax_cross_entropy(float* losses, __nv_bfloat16* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream);

}  // namespace octet::cuda
