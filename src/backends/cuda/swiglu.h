// SwiGLU's forward and backward on the GPU (swiglu.cu), on device pointers, enqueued on a stream. Each row of
// inp [N, 2C] holds a gate half (columns 0 .. C-1), then an up half (C .. 2C-1).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// out [N, C] = silu(gate) * up, silu(g) = g / (1 + e^-g). inp is float32 or bf16 (its bits, read as their
// float32 values); out is float32 or bf16 (each float32 value rounded once). out must not overlap inp.
void swiglu_forward(float* out, const float* inp, int64_t N, int64_t C, cudaStream_t stream);
void swiglu_forward(float* out, const uint16_t* inp, int64_t N, int64_t C, cudaStream_t stream);
void swiglu_forward(uint16_t* out, const float* inp, int64_t N, int64_t C, cudaStream_t stream);
void swiglu_forward(uint16_t* out, const uint16_t* inp, int64_t N, int64_t C, cudaStream_t stream);
// dinp [N, 2C] (overwritten) from dout [N, C]: d gate = dout * up * silu'(gate), d up = dout * silu(gate).
// inp and dout share a type (float32 or bf16 bits); dinp is float32 or bf16. dinp may be inp itself (each
// thread reads a gate and up pair before it writes their gradients) but must not overlap dout.
void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t C,
                     cudaStream_t stream);
void swiglu_backward(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t N, int64_t C,
                     cudaStream_t stream);
void swiglu_backward(uint16_t* dinp, const float* inp, const float* dout, int64_t N, int64_t C,
                     cudaStream_t stream);
void swiglu_backward(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, int64_t N, int64_t C,
                     cudaStream_t stream);

}  // namespace octet::cuda
