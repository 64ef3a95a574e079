// AdamW on the GPU (adamw.cu): one tensor, the chunks of several tensors in one launch, or with the bf16
// copy of the updated weights; device pointers, enqueued on a stream.
#pragma once

#include <cstdint>
#include <span>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "device_table.h"

namespace octet::cuda {

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

}  // namespace octet::cuda
