// Rotary position embedding on the GPU (rope.cu), on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// In place over x [B, T, W]: the first `heads` heads of hs (even) columns in each row, at position t, rotate
// in the rotate-half convention: for i < hs / 2, (x_i, x_{i+hs/2}) becomes (x_i cos - x_{i+hs/2} sin,
// x_{i+hs/2} cos + x_i sin), cos = table[t, i], sin = table[t, hs/2 + i] (table [>= T, hs] float32);
// `inverse` rotates by the opposite angle (sin negated). x is float32, or bf16 (its bits): computed from
// their float32 values and rounded once.
void rotary_embedding(float* x, const float* table, int64_t B, int64_t T, int64_t W, int64_t heads,
                      int64_t hs, bool inverse, cudaStream_t stream);
void rotary_embedding(uint16_t* x, const float* table, int64_t B, int64_t T, int64_t W, int64_t heads,
                      int64_t hs, bool inverse, cudaStream_t stream);

}  // namespace octet::cuda
