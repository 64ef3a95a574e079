// GELU's forward and backward on the GPU (gelu.cu), on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// GELU, tanh approximation; gelu_backward overwrites dinp = dout * gelu'(inp).
void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream);
// The same over bf16 inputs (their bits), read as their float32 values; the outputs stay float32.
void gelu_forward(float* out, const uint16_t* inp, int64_t n, cudaStream_t stream);
void gelu_backward(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t n, cudaStream_t stream);
// The forward and the backward with out / dinp in bf16 (its bits), each float32 value rounded once, over
// float32 or bf16 inputs.
void gelu_forward(uint16_t* out, const float* inp, int64_t n, cudaStream_t stream);
void gelu_forward(uint16_t* out, const uint16_t* inp, int64_t n, cudaStream_t stream);
void gelu_backward(uint16_t* dinp, const float* inp, const float* dout, int64_t n, cudaStream_t stream);
void gelu_backward(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, int64_t n, cudaStream_t stream);

}  // namespace octet::cuda
