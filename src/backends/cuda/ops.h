// The CUDA backend's element-wise, normalisation, loss and optimizer ops: the contracts of the Backend
// interface (octet/backend/backend.h) on device pointers, enqueued on a stream. Each op follows the CPU
// reference (src/backends/cpu) operation for operation: results are bit-identical where the math is exact
// (embeddings, residuals, scaling, rounding, AdamW) and differ only by reduction order elsewhere. Every op is
// deterministic: no floating-point atomics, reduction orders fixed by the shapes alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "device_table.h"
#include "octet/numerics/minifloat.h"

namespace octet::cuda {

// Device scratch memory for the ops that need it, grown on demand and kept for reuse, plus a few bytes of
// pinned host memory for the values that ops return to the host. Use one Workspace per stream. Move-only;
// the destructor frees and never throws.
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&& other) noexcept;
  Workspace& operator=(Workspace&& other) noexcept;

  // At least `bytes` of device memory, 256-byte aligned. Growing waits for the work queued on `stream`,
  // which may still use the old block. The pointer stays valid until the next call.
  void* get(size_t bytes, cudaStream_t stream);
  // kHostBytes of pinned host memory, for copies back from the device.
  static constexpr size_t kHostBytes = 64;
  void* host();

 private:
  void release() noexcept;

  void* device_ = nullptr;
  size_t device_bytes_ = 0;
  void* host_ = nullptr;
};

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                     int64_t T, int64_t C, cudaStream_t stream);
// dwte[tokens[b,t],:] += dout[b,t,:] and dwpe[t,:] += dout[b,t,:], each sum taken in (b, t) order, as the CPU
// reference takes it, so the results are bit-identical to it.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                      int64_t T, int64_t C, Workspace& workspace, cudaStream_t stream);

// Per row of inp [N, C]: out = (x - mean) * rstd * weight + bias; writes mean and rstd [N].
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream);
// The same with out in bf16 (its bits): each float32 value rounded once, to nearest, ties to even.
void layernorm_forward(uint16_t* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, cudaStream_t stream);
// Accumulates into dinp [N, C], dweight [C] and dbias [C]. C is limited by shared memory (8 * C bytes per
// warp must fit a block: C up to about 29000 on Hopper).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream);
// The same with dout in bf16 (its bits), read as their float32 values.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const uint16_t* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                        Workspace& workspace, cudaStream_t stream);

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

void residual_forward(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream);
// a += b
void accumulate(float* a, const float* b, int64_t n, cudaStream_t stream);
// x *= factor
void scale(float* x, int64_t n, float factor, cudaStream_t stream);
void fill_zero(float* x, int64_t n, cudaStream_t stream);

// Softmax cross-entropy over the first V of Vp logits per row: losses [N] = -log p[target]. When dloss != 0,
// logits are overwritten with dloss * (softmax - onehot(target)), zero in the padded columns.
void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream);
// The same over BF16 logits (a BF16 GEMM's output), the gradient written back in BF16: the same losses, and
// the float32 path's gradient rounded to nearest even.
void softmax_cross_entropy(float* losses, __nv_bfloat16* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t Vp, float dloss, cudaStream_t stream);

// Sum of x^2 in float64, in an order fixed by n; waits for the stream. The bf16 form (bits) sums the float32
// values, in the order of n floats where x is 8-byte aligned (16 for floats).
double sum_of_squares(const float* x, int64_t n, Workspace& workspace, cudaStream_t stream);
double sum_of_squares(const uint16_t* x, int64_t n, Workspace& workspace, cudaStream_t stream);
// Whether no element is Inf or NaN; waits for the stream.
bool all_finite(const float* x, int64_t n, Workspace& workspace, cudaStream_t stream);

// AdamW on float32 master weights, the CPU reference's formula: g = grads * grad_scale; step counts from 1
// and sets the bias corrections; weight decay is decoupled (params *= 1 - learning_rate * weight_decay).
void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float learning_rate,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                  cudaStream_t stream);
// The same over a gradient stored as bf16 bits, read as its float32 values: the same bits as adamw_update
// over those values.
void adamw_update(float* params, float* m, float* v, const uint16_t* grads, int64_t n, float learning_rate,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                  cudaStream_t stream);
// A piece of a segmented update: elements offset .. offset + count - 1 (count <= kChunkElements) of each
// tensor, with a flag (AdamW: whether weight decay applies). AdamW also writes the updated values, rounded
// to bf16, to `rounded` (the chunk's first value's place) where it is not null: as bf16 bits
// (convert_to_bf16's) with rounded_bits, else as float32 values (round_copy's to bf16).
struct Chunk {
  int64_t offset;
  int32_t count;
  int32_t flag;
  void* rounded = nullptr;
  int32_t rounded_bits = 0;
  int64_t grad_offset = 0;  // AdamW: where the chunk's gradient starts in grads
  bool operator==(const Chunk&) const = default;
};
inline constexpr int64_t kChunkElements = 4096;
// fill_zero of every chunk of `chunks` (device memory, chunk_count of them) of x, in one launch.
void fill_zero_chunks(float* x, const Chunk* chunks, int64_t chunk_count, cudaStream_t stream);
// adamw_update (the same bits) on every chunk of `chunks` (device memory, chunk_count of them), in one
// launch: weight_decay on the chunks flagged, none on the others.
void adamw_update_chunks(float* params, float* m, float* v, const float* grads, const Chunk* chunks,
                         int64_t chunk_count, float learning_rate, float beta1, float beta2, float eps,
                         float weight_decay, int64_t step, float grad_scale, cudaStream_t stream);
// adamw_update (the same bits) that also writes the updated params rounded to bf16 into params_bf16 [n], as
// convert_to_bf16 would from them, in the same pass: a BF16 layer's weight copy.
void adamw_update_convert(float* params, float* m, float* v, const float* grads, __nv_bfloat16* params_bf16,
                          int64_t n, float learning_rate, float beta1, float beta2, float eps,
                          float weight_decay, int64_t step, float grad_scale, cudaStream_t stream);
// One weight of adamw_update_converts: n elements of its four tensors, its bf16 copy, whether the call's
// weight decay applies; first_block is the first of its blocks in the launch (set by adamw_update_converts).
struct AdamWConvertWeight {
  float* params = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grads = nullptr;
  __nv_bfloat16* copy = nullptr;
  int64_t n = 0;
  bool decayed = false;
  int64_t first_block = 0;
  const uint16_t* grads_bf16 = nullptr;  // instead of grads: the gradient as bf16 bits
  bool operator==(const AdamWConvertWeight&) const = default;
};
using AdamWConvertTable = DeviceTable<AdamWConvertWeight>;
// adamw_update_convert on each of `weights` (weight_decay where decayed, else none; they must not overlap):
// the same bits, with every weight's chunks of kChunkElements in one launch, a block each (one launch per
// weight leaves each one's last wave of blocks short of work). `table` keeps the device copy of the weights
// between calls. Weights whose pointers or size do not allow 16-byte loads go one by one.
void adamw_update_converts(std::span<const AdamWConvertWeight> weights, float learning_rate, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                           AdamWConvertTable& table, cudaStream_t stream);

// Linear-layer support. Conversions round to nearest, ties to even, as octet::round_to_bf16 / round_to_f16.
void convert_to_bf16(__nv_bfloat16* out, const float* in, int64_t n, cudaStream_t stream);
// out = the float32 value of each bf16 (exact).
void convert_from_bf16(float* out, const uint16_t* in, int64_t n, cudaStream_t stream);
void convert_to_f16(__half* out, const float* in, int64_t n, cudaStream_t stream);
// x = round_to_bf16(x) or round_to_f16(x); `dtype` is Dtype::bf16 or Dtype::f16.
void round_in_place(float* x, int64_t n, Dtype dtype, cudaStream_t stream);
// out = in rounded so, in one pass (out may be in).
void round_copy(float* out, const float* in, int64_t n, Dtype dtype, cudaStream_t stream);
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

}  // namespace octet::cuda
