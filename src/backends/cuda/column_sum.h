// Column sums over the rows of a matrix on the GPU (column_sum.cu), in an order fixed by the shape alone: a
// linear layer's bias gradient, and the sums that LayerNorm's backward adds its partial sums with.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "workspace.h"

namespace octet::cuda {

// dbias [OC] += column sums of dout [N, OC].
void bias_backward(float* dbias, const float* dout, int64_t N, int64_t OC, Workspace& workspace,
                   cudaStream_t stream);
// The same over bf16 values (their bits), in the same order of float32 additions: the sums of their float32
// values.
void bias_backward(float* dbias, const uint16_t* dout, int64_t N, int64_t OC, Workspace& workspace,
                   cudaStream_t stream);
// bias_backward over float32 dout (the same sums, in the same order) that also writes dout_bf16 [N, OC],
// dout rounded to bf16 as convert_to_bf16 rounds it, in the same pass: one read of dout for a BF16
// backward's bias gradient and operand.
void bias_backward_convert(float* dbias, __nv_bfloat16* dout_bf16, const float* dout, int64_t N, int64_t OC,
                           Workspace& workspace, cudaStream_t stream);

// The column sums that LayerNorm's backward (layernorm.cu) and bias_backward share, in column_sum.cu.
namespace ops_internal {

// How column_sum splits the rows of a shape among blocks, from plan_column_sum.
struct ColumnSumPlan {
  bool short_rows = false;  // one launch of column_lanes_kernel; rows_per_split and splits unused
  int64_t rows_per_split = 0;
  int64_t splits = 0;
  size_t scratch_floats(int64_t cols) const {
    return !short_rows && splits > 1 ? static_cast<size_t>(splits * cols) : 0;
  }
};

// The plan for a shape: it depends on the shape only (column_sum.cu says how).
ColumnSumPlan plan_column_sum(int64_t rows, int64_t cols);

// out[c] += the sum of x[r * ld + c] over the rows r < rows, for the columns c < cols, in the order that
// `plan` (plan_column_sum(rows, cols)) fixes; T is float, or uint16_t for bf16 values (their bits).
// scratch: plan.scratch_floats(cols) floats. copy: null, or [rows, ld] bf16 for x's values.
template <typename T>
void column_sum(const T* x, int64_t ld, int64_t rows, int64_t cols, float* out, const ColumnSumPlan& plan,
                float* scratch, cudaStream_t stream, uint16_t* copy = nullptr);

}  // namespace ops_internal

}  // namespace octet::cuda
