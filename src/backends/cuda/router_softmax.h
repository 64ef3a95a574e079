// A mixture-of-experts router on the GPU (router_softmax.cu): each token's softmax over its expert logits
// with the choice of its k most probable experts, and the backward through both, on device pointers,
// enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// probs [N, E] the softmax of each row of logits [N, E] (the row's maximum, exp, the sum, a division, in
// float32); experts [N, k] the indices of each row's k largest probabilities, largest first, the lower
// index among equals; weights [N, k] those probabilities divided by their sum, taken in that order.
// 1 <= k <= E.
void top_k_softmax(float* probs, int32_t* experts, float* weights, const float* logits, int64_t N, int64_t E,
                   int64_t k, cudaStream_t stream);
// dlogits [N, E], overwritten: the gradient through the renormalization and the softmax of dweights [N, k],
// plus dprobs [E] (null: none) added to every row's probabilities' gradient. probs, experts and weights
// are the forward's.
void top_k_softmax_backward(float* dlogits, const float* probs, const int32_t* experts, const float* weights,
                            const float* dweights, const float* dprobs, int64_t N, int64_t E, int64_t k,
                            cudaStream_t stream);

}  // namespace octet::cuda
