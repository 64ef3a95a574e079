// The row moves of a mixture-of-experts layer on the GPU (expert_rows.cu): tokens' rows gathered into their
// experts' groups, the experts' rows combined back per token, and the dot products of the backward; and rows
// copied back to their places (scatter_rows), on device pointers (float32), enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// out [M, C] row m = scale[index[m]] (null: 1) x src [R, C] row index[m] / divisor; zero where index[m] < 0.
// An index past src's rows (which the CPU reference refuses, and a kernel cannot) gives a row of NaN.
void gather_rows(float* out, const float* src, const int32_t* index, const float* scale, int64_t M, int64_t R,
                 int64_t C, int64_t divisor, cudaStream_t stream);
// The same into bf16 out: each float32 value rounded once, to nearest even.
void gather_rows(uint16_t* out, const float* src, const int32_t* index, const float* scale, int64_t M,
                 int64_t R, int64_t C, int64_t divisor, cudaStream_t stream);
// out [R, C] row r = base row r (null: zero) + the sum over j < k, in j order, of weights[r k + j] (null: 1)
// x src row positions[r k + j]. out may be base.
void combine_rows(float* out, const float* base, const float* src, const int32_t* positions,
                  const float* weights, int64_t R, int64_t C, int64_t k, cudaStream_t stream);
// out [R, C] row index[m] = src [M, C] row m for each m < M (index distinct); out's other rows untouched. An
// index outside 0 .. R - 1 (which the CPU reference refuses) writes nothing.
void scatter_rows(float* out, const float* src, const int32_t* index, int64_t M, int64_t R, int64_t C,
                  cudaStream_t stream);
// out [R k]: out[r k + j] = the dot product of a [R, C] row r and src row positions[r k + j].
void row_dots(float* out, const float* a, const float* src, const int32_t* positions, int64_t R, int64_t C,
              int64_t k, cudaStream_t stream);

}  // namespace octet::cuda
