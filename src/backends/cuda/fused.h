// Producer-fused FP8 casts: the op that produces a tensor also writes its FP8 cast (codes, transposed codes,
// scale_inv, amax and counts), so that the FP8 GEMM that consumes it needs no separate cast pass; and a cast
// that also sums a bias gradient over the tensor it reads, which another op would read again. Every
// result is bit-identical to the unfused pair: the op of ops.h, then cast_amax (octet/cuda/cast.h) with
// default CastOptions on its output. Device pointers, enqueued on `stream`.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_runtime_api.h>

#include "device_table.h"
#include "octet/cuda/cast.h"
#include "workspace.h"

namespace octet::cuda {

// Where a producing kernel writes the FP8 cast of its output: the same codes, transposed codes, scale_inv and
// CastResults that cast_amax writes for the same values and scale (default CastOptions: round to nearest
// even, saturating).
struct FusedCast {
  Dtype format = Dtype::e4m3;            // e4m3 or e5m2
  const float* scale = nullptr;          // device pointer, one value
  uint8_t* output = nullptr;             // [rows, cols] codes
  uint8_t* output_transposed = nullptr;  // [cols, rows] codes; null: not written
  float* scale_inv = nullptr;      // 1/scale written here (same expression as cast_amax); null: not written
  CastResults* results = nullptr;  // zeroed on the stream first, then amax and counts as cast_amax
  bool results_zeroed = false;     // results already hold zeros (a cleared CastResults): no zeroing first
  bool operator==(const FusedCast&) const = default;
};

// LayerNorm forward (exactly the values of cuda::layernorm_forward, same mean/rstd), writing the FP8 cast of
// out [N, C]; out itself is written only when not null. As layernorm_forward, C must be positive; N may be 0
// (then only results and scale_inv are written). With out null, the values are those layernorm_forward gives
// for a 16-byte aligned out (its reduction order depends on the alignment of its pointers).
void layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int64_t N, int64_t C, const FusedCast& cast,
                            cudaStream_t stream);

// RMSNorm forward (exactly the values of cuda::rmsnorm_forward, same rstd), writing the FP8 cast of out [N,
// C]; out itself is written only when not null, as layernorm_forward_cast.
void rmsnorm_forward_cast(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                          int64_t C, const FusedCast& cast, cudaStream_t stream);

// GELU forward over inp [rows, cols] (exactly the values of cuda::gelu_forward), writing the FP8 cast of the
// result; out written only when not null (it may alias inp). inp is float32, or bf16 (its bits) read as its
// float32 values.
void gelu_forward_cast(float* out, const float* inp, int64_t rows, int64_t cols, const FusedCast& cast,
                       cudaStream_t stream);
void gelu_forward_cast(float* out, const uint16_t* inp, int64_t rows, int64_t cols, const FusedCast& cast,
                       cudaStream_t stream);

// Where the second stage of a fused bias gradient (bias_backward over the tile sums in column_partials) runs:
// on the kernel's own stream (the default), or on `stream`, after it waits for `written` (recorded on the
// kernel's stream after the kernel), recording `done` when dbias holds the sum. Then the caller's stream
// must wait for `done` before anything reads dbias or writes column_partials again. `workspace` is the
// second stream's own (it must not be the kernel stream's).
struct PartialSums {
  cudaStream_t stream = nullptr;
  cudaEvent_t written = nullptr;
  cudaEvent_t done = nullptr;
  Workspace* workspace = nullptr;
};

// GELU backward over [rows, cols]: dinp = dout * gelu'(inp) (exactly the values of cuda::gelu_backward),
// writing the FP8 cast of dinp; dinp written only when not null (it may alias inp or dout). When dbias is not
// null, also dbias [cols] += column sums of dinp, as bias_backward would add them up to the order of the
// float32 additions: the kernel writes one partial sum per column and tile of 32 rows to column_partials
// (column_partial_rows(rows) x cols floats of scratch, not aliasing workspace memory), and
// bias_backward adds those in its fixed order. Deterministic: the order depends on the shape alone. inp and
// dout are float32, or both bf16 (their bits) read as their float32 values.
void gelu_backward_cast(float* dinp, const float* inp, const float* dout, int64_t rows, int64_t cols,
                        const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                        cudaStream_t stream, const PartialSums& sums = {});
void gelu_backward_cast(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t rows, int64_t cols,
                        const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                        cudaStream_t stream, const PartialSums& sums = {});

// SwiGLU forward over inp [rows, 2C] (exactly the values of cuda::swiglu_forward), writing the FP8 cast of
// the result [rows, C]; out written only when not null (it must not overlap inp). inp is float32, or bf16
// (its bits) read as their float32 values.
void swiglu_forward_cast(float* out, const float* inp, int64_t rows, int64_t C, const FusedCast& cast,
                         cudaStream_t stream);
void swiglu_forward_cast(float* out, const uint16_t* inp, int64_t rows, int64_t C, const FusedCast& cast,
                         cudaStream_t stream);

// SwiGLU backward: dinp [rows, 2C] from inp [rows, 2C] and dout [rows, C] (exactly the values of
// cuda::swiglu_backward), writing the FP8 cast of dinp; dinp written only when not null (it must not overlap
// inp or dout). When dbias [2C] is not null, also dbias += column sums of dinp, as gelu_backward_cast sums
// them (column_partials: column_partial_rows(rows) x 2C floats of scratch).
void swiglu_backward_cast(float* dinp, const float* inp, const float* dout, int64_t rows, int64_t C,
                          const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                          cudaStream_t stream, const PartialSums& sums = {});
void swiglu_backward_cast(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t rows, int64_t C,
                          const FusedCast& cast, float* dbias, float* column_partials, Workspace& workspace,
                          cudaStream_t stream, const PartialSums& sums = {});

// A linear layer's bias gradient and the FP8 cast of its output gradient in one pass over dout [rows, cols]
// (bias_backward, then cast_amax, would read it twice): the codes, transposed codes, scale_inv and
// CastResults exactly as cast_amax writes them, and dbias [cols] += column sums of dout as bias_backward
// would add them up to the order of the float32 additions (per-tile partial sums in column_partials, then
// bias_backward over those, as gelu_backward_cast). dbias must be given; column_partials holds
// column_partial_rows(rows) x cols floats of scratch, not aliasing workspace memory.
// Deterministic: the order of additions depends on the shape alone.
void bias_backward_cast(float* dbias, const float* dout, int64_t rows, int64_t cols, const FusedCast& cast,
                        float* column_partials, Workspace& workspace, cudaStream_t stream,
                        const PartialSums& sums = {});
// The same over bf16 values (their bits): the results of the float32 values they are.
void bias_backward_cast(float* dbias, const uint16_t* dout, int64_t rows, int64_t cols, const FusedCast& cast,
                        float* column_partials, Workspace& workspace, cudaStream_t stream,
                        const PartialSums& sums = {});
// Rows of column_partials that a fused bias gradient (gelu_backward_cast, swiglu_backward_cast,
// bias_backward_cast) needs for `rows` rows: one per tile of rows.
int64_t column_partial_rows(int64_t rows);

// gather_rows (expert_rows.h: out [M, C] row m = scale[index[m]] (null: 1) x src [R, C] row index[m] /
// divisor, zero where index[m] < 0, NaN past src's rows; exactly its values), writing the FP8 cast of out;
// out itself is written only when not null.
void gather_rows_cast(float* out, const float* src, const int32_t* index, const float* scale, int64_t M,
                      int64_t R, int64_t C, int64_t divisor, const FusedCast& cast, cudaStream_t stream);

// Row groups of one producer's output, each cast with its own FusedCast (a mixture of experts' grouped rows,
// each expert's with its own scale): rows [row0, row0 + rows) of the output to `cast`, as though the producer
// ran on those rows alone with that cast. Every group of one call casts to the same format. The grouped
// launchers below write every group's codes, transposed codes, scale_inv and results exactly as one call per
// group would, in one launch per kMaxCastGroups groups.
struct FusedCastGroup {
  int64_t row0 = 0;
  int64_t rows = 0;
  FusedCast cast;
};
inline constexpr int kMaxCastGroups = 32;

// gather_rows_cast over row groups of out [M, C]: group g's rows read index + row0 (out, when not null,
// covers every group's rows).
void gather_rows_cast_grouped(float* out, const float* src, const int32_t* index, const float* scale, int64_t R,
                              int64_t C, int64_t divisor, std::span<const FusedCastGroup> groups,
                              cudaStream_t stream);
// swiglu_forward_cast over row groups of inp [M, 2C] and out [M, C].
void swiglu_forward_cast_grouped(float* out, const float* inp, int64_t C, std::span<const FusedCastGroup> groups,
                                 cudaStream_t stream);
void swiglu_forward_cast_grouped(float* out, const uint16_t* inp, int64_t C,
                                 std::span<const FusedCastGroup> groups, cudaStream_t stream);
// swiglu_backward_cast (no bias gradient) over row groups of inp [M, 2C], dout [M, C] and dinp [M, 2C].
void swiglu_backward_cast_grouped(float* dinp, const float* inp, const float* dout, int64_t C,
                                  std::span<const FusedCastGroup> groups, cudaStream_t stream);
void swiglu_backward_cast_grouped(float* dinp, const uint16_t* inp, const uint16_t* dout, int64_t C,
                                  std::span<const FusedCastGroup> groups, cudaStream_t stream);

// The FP8 cast of bf16 values x [rows, cols] (their bits): exactly what cast_amax writes for the float32
// values they are (codes, transposed codes when asked for, scale_inv, CastResults).
void cast_bf16(const uint16_t* x, int64_t rows, int64_t cols, const FusedCast& cast, cudaStream_t stream);

// codes [rows, cols] -> transposed [cols, rows], byte for byte (FP8 codes under a per-tensor scale: the
// transposed tensor's cast). 32-bit loads and stores where rows and cols are multiples of 4 and both
// pointers 4-byte aligned, else byte by byte. The two must not overlap.
void transpose_codes(const uint8_t* codes, uint8_t* transposed, int64_t rows, int64_t cols,
                     cudaStream_t stream);

// AdamW (exactly cuda::adamw_update's arithmetic and host-side constants, bit for bit) over one weight matrix
// params [rows, cols] with its m, v, grads, followed by the FP8 cast of the UPDATED params.
void adamw_update_cast(float* params, float* m, float* v, const float* grads, int64_t rows, int64_t cols,
                       float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step, float grad_scale, const FusedCast& cast, cudaStream_t stream);

// One weight matrix of adamw_update_casts: params [rows, cols] with its m, v, grads, whether the call's
// weight decay applies to it, and the cast of its updated values.
struct AdamWCastWeight {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grads = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  bool decayed = false;
  FusedCast cast;
  const uint16_t* grads_bf16 = nullptr;  // instead of grads: the gradient as bf16 bits
  bool operator==(const AdamWCastWeight&) const = default;
};
// A weight as adamw_update_casts' kernel finds it: the weight, the first of its tiles in the launch's grid
// and whether its transposed codes go out as 32-bit words.
struct AdamWCastEntry {
  AdamWCastWeight weight;
  int64_t first_block = 0;
  bool transposed_words = false;
  bool operator==(const AdamWCastEntry&) const = default;
};
using AdamWCastTable = DeviceTable<AdamWCastEntry>;

// adamw_update_cast on each of `weights` (weight_decay where decayed, else none; the matrices must not
// overlap): the same bits as one call per weight, with the tiles of every weight in one launch. One launch
// per weight leaves each one's last wave of blocks short of work (GPT-2's weights take a few waves each);
// across weights the waves run full. `table` keeps the device copy of the weights between calls (the same
// weights every step: uploaded once). Weights whose pointers or shape do not allow 16-byte loads go one by
// one.
void adamw_update_casts(std::span<const AdamWCastWeight> weights, float learning_rate, float beta1,
                        float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                        AdamWCastTable& table, cudaStream_t stream);

}  // namespace octet::cuda
