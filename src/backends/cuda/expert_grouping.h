// Mixture-of-experts grouping on the GPU (expert_grouping.cu): a token's assignments to experts sorted into
// each expert's contiguous rows, on device pointers, enqueued on a stream.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace octet::cuda {

// The N k assignments experts [N, k] (assignment a = n k + j chooses expert experts[a], 0 .. E - 1) grouped
// by expert, in assignment order within an expert: offsets [E + 1] where expert e's rows start (each a
// multiple of align; offsets[E] the end of the last); slots [grouped_rows(N, k, E, align)] the assignment in
// each row, -1 in every other row; positions [N k] the row of each assignment. An expert outside 0 .. E - 1
// (which the CPU reference refuses, and a kernel cannot) puts its assignment in no row: position -1.
void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts, int64_t N,
                     int64_t k, int64_t E, int64_t align, cudaStream_t stream);

}  // namespace octet::cuda
