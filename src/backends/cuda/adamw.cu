// AdamW (adamw.h): the CPU reference's step on float32 master weights, over one tensor, over chunks of
// several tensors in one launch, or with the bf16 copy of the updated weights written in the same pass;
// and the zeroing of chunks, which the segmented update's gradients take. The step's arithmetic is
// elementwise.cuh's, which the fused AdamW casts (fused_adamw.cu) run too.
#include "adamw.h"

#include <vector>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using ops_internal::aligned16;
using ops_internal::bf16_bits;
using ops_internal::ceil_div;
using ops_internal::check_size;
using ops_internal::for_each;
using ops_internal::kThreads;
using ops_internal::store_pack;

// The reference's AdamW step (elementwise.cuh's, shared with the fused AdamW cast).
struct AdamW {
  float* params;
  float* m;
  float* v;
  elementwise::Gradient grads;
  elementwise::AdamWConstants constants;
  template <int W>
  __device__ void apply(int64_t i) const {
    elementwise::adamw_pack<W>(constants, params, m, v, grads, i);
  }
};

// The same step, also writing the updated params rounded to bf16 (a BF16 layer's weight copy).
struct AdamWConvert {
  float* params;
  float* m;
  float* v;
  elementwise::Gradient grads;
  uint16_t* copy;
  elementwise::AdamWConstants constants;
  template <int W>
  __device__ void apply(int64_t i) const {
    store_pack<W>(copy + i, elementwise::adamw_pack<W>(constants, params, m, v, grads, i));
  }
};

void adamw_update_from(float* params, float* m, float* v, elementwise::Gradient grads, int64_t n,
                       float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                       int64_t step, float grad_scale, cudaStream_t stream) {
  check_size(n, "adamw_update");
  if (n == 0) return;
  const AdamW op{
      params, m, v, grads,
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale)};
  const bool grads_aligned =
      grads.bf16 != nullptr ? elementwise::pack_aligned(grads.bf16) : aligned16(grads.f32);
  for_each(op, n, aligned16(params) && aligned16(m) && aligned16(v) && grads_aligned, stream);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update");
}

}  // namespace

void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float learning_rate,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                  cudaStream_t stream) {
  adamw_update_from(params, m, v, {grads, nullptr}, n, learning_rate, beta1, beta2, eps, weight_decay, step,
                    grad_scale, stream);
}

void adamw_update(float* params, float* m, float* v, const uint16_t* grads, int64_t n, float learning_rate,
                  float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                  cudaStream_t stream) {
  adamw_update_from(params, m, v, {nullptr, grads}, n, learning_rate, beta1, beta2, eps, weight_decay, step,
                    grad_scale, stream);
}

namespace {

// One block per chunk: groups of four with float4 accesses where the chunk starts 16-byte aligned, then the
// rest one by one; the step is adamw_update's.
__global__ void __launch_bounds__(kThreads)
    adamw_chunks_kernel(float* params, float* m, float* v, const float* grads, const Chunk* chunks,
                        elementwise::AdamWConstants decayed, elementwise::AdamWConstants plain,
                        bool aligned) {
  const Chunk chunk = chunks[blockIdx.x];
  const elementwise::AdamWConstants& c = chunk.flag != 0 ? decayed : plain;
  const int64_t groups = aligned && chunk.offset % 4 == 0 && chunk.grad_offset % 4 == 0 ? chunk.count / 4 : 0;
  // The chunk's own elements: its gradient may sit elsewhere in grads than its params (Chunk::grad_offset).
  float* p = params + chunk.offset;
  float* mc = m + chunk.offset;
  float* vc = v + chunk.offset;
  const elementwise::Gradient g{grads + chunk.grad_offset, nullptr};
  for (int64_t k = threadIdx.x; k < groups; k += blockDim.x)
    elementwise::adamw_pack<4>(c, p, mc, vc, g, k * 4);
  for (int64_t i = groups * 4 + threadIdx.x; i < chunk.count; i += blockDim.x) {
    elementwise::adamw_pack<1>(c, p, mc, vc, g, i);
  }
  if (chunk.rounded == nullptr) return;  // the same for the whole block
  __syncthreads();                       // the block's updated values, whichever thread wrote them
  for (int64_t i = threadIdx.x; i < chunk.count; i += blockDim.x) {
    const float p = params[chunk.offset + i];
    if (chunk.rounded_bits != 0) {
      static_cast<uint16_t*>(chunk.rounded)[i] = bf16_bits(p);
    } else {
      static_cast<float*>(chunk.rounded)[i] = round_to_bf16(p);
    }
  }
}

// adamw_update_converts: block b takes chunk b - first_block of the weight whose chunks hold b (n % 4 == 0
// and every pointer aligned: float4 loads, one 64-bit store of bf16).
__global__ void __launch_bounds__(kThreads)
    adamw_convert_chunks_kernel(const AdamWConvertWeight* __restrict__ weights, int count,
                                elementwise::AdamWConstants decayed, elementwise::AdamWConstants plain) {
  const AdamWConvertWeight& w = weights[elementwise::entry_of_block(weights, count, blockIdx.x)];
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - w.first_block) * kChunkElements;
  const int64_t end = w.n < begin + kChunkElements ? w.n : begin + kChunkElements;
  const AdamWConvert op{w.params,
                        w.m,
                        w.v,
                        {w.grads, w.grads_bf16},
                        reinterpret_cast<uint16_t*>(w.copy),
                        w.decayed ? decayed : plain};
  for (int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x); i < end; i += 4 * kThreads) {
    op.apply<4>(i);
  }
}

__global__ void __launch_bounds__(kThreads)
    fill_zero_chunks_kernel(float* x, const Chunk* chunks, bool aligned) {
  const Chunk chunk = chunks[blockIdx.x];
  const int64_t groups = aligned && chunk.offset % 4 == 0 ? chunk.count / 4 : 0;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    *reinterpret_cast<float4*>(x + chunk.offset + g * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (int64_t i = groups * 4 + threadIdx.x; i < chunk.count; i += blockDim.x) x[chunk.offset + i] = 0.0f;
}

}  // namespace

void fill_zero_chunks(float* x, const Chunk* chunks, int64_t chunk_count, cudaStream_t stream) {
  OCTET_CHECK(chunk_count >= 0 && chunk_count <= 0x7FFFFFFF, "fill_zero_chunks: {} chunks", chunk_count);
  if (chunk_count == 0) return;
  fill_zero_chunks_kernel<<<static_cast<unsigned>(chunk_count), kThreads, 0, stream>>>(x, chunks,
                                                                                       aligned16(x));
  OCTET_CUDA_CHECK_LAUNCH("fill_zero_chunks");
}

void adamw_update_chunks(float* params, float* m, float* v, const float* grads, const Chunk* chunks,
                         int64_t chunk_count, float learning_rate, float beta1, float beta2, float eps,
                         float weight_decay, int64_t step, float grad_scale, cudaStream_t stream) {
  OCTET_CHECK(chunk_count >= 0 && chunk_count <= 0x7FFFFFFF, "adamw_update_chunks: {} chunks", chunk_count);
  if (chunk_count == 0) return;
  const auto decayed =
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale);
  const auto plain = elementwise::adamw_constants(learning_rate, beta1, beta2, eps, 0.0f, step, grad_scale);
  const bool aligned = aligned16(params) && aligned16(m) && aligned16(v) && aligned16(grads);
  adamw_chunks_kernel<<<static_cast<unsigned>(chunk_count), kThreads, 0, stream>>>(
      params, m, v, grads, chunks, decayed, plain, aligned);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_chunks");
}

namespace {

// adamw_update_convert over a float32 or a bf16 gradient.
void adamw_update_convert_from(float* params, float* m, float* v, elementwise::Gradient grads,
                               __nv_bfloat16* params_bf16, int64_t n, float learning_rate, float beta1,
                               float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                               cudaStream_t stream) {
  check_size(n, "adamw_update_convert");
  OCTET_CHECK(params_bf16 != nullptr, "adamw_update_convert: a bf16 output");
  OCTET_CHECK((grads.f32 != nullptr) != (grads.bf16 != nullptr), "adamw_update_convert: one gradient");
  if (n == 0) return;
  auto* copy = reinterpret_cast<uint16_t*>(params_bf16);
  const AdamWConvert op{
      params, m,
      v,      grads,
      copy,   elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale)};
  const bool grads_aligned =
      grads.bf16 != nullptr ? elementwise::pack_aligned(grads.bf16) : aligned16(grads.f32);
  for_each(
      op, n,
      aligned16(params) && aligned16(m) && aligned16(v) && grads_aligned && elementwise::pack_aligned(copy),
      stream);
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_convert");
}

}  // namespace

void adamw_update_convert(float* params, float* m, float* v, const float* grads, __nv_bfloat16* params_bf16,
                          int64_t n, float learning_rate, float beta1, float beta2, float eps,
                          float weight_decay, int64_t step, float grad_scale, cudaStream_t stream) {
  adamw_update_convert_from(params, m, v, {grads, nullptr}, params_bf16, n, learning_rate, beta1, beta2, eps,
                            weight_decay, step, grad_scale, stream);
}

void adamw_update_converts(std::span<const AdamWConvertWeight> weights, float learning_rate, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
                           AdamWConvertTable& table, cudaStream_t stream) {
  std::vector<AdamWConvertWeight> entries;
  int64_t blocks = 0;
  for (const AdamWConvertWeight& w : weights) {
    OCTET_CHECK((w.grads != nullptr) != (w.grads_bf16 != nullptr), "adamw_update_converts: one gradient");
    const bool grads_aligned =
        w.grads_bf16 != nullptr ? elementwise::pack_aligned(w.grads_bf16) : aligned16(w.grads);
    const bool vector = w.n > 0 && w.n % 4 == 0 && aligned16(w.params) && aligned16(w.m) && aligned16(w.v) &&
                        grads_aligned && elementwise::pack_aligned(reinterpret_cast<uint16_t*>(w.copy));
    if (!vector) {  // adamw_update_convert checks the weight
      adamw_update_convert_from(w.params, w.m, w.v, {w.grads, w.grads_bf16}, w.copy, w.n, learning_rate,
                                beta1, beta2, eps, w.decayed ? weight_decay : 0.0f, step, grad_scale, stream);
      continue;
    }
    OCTET_CHECK(w.copy != nullptr, "adamw_update_converts: a bf16 output");
    AdamWConvertWeight e = w;
    e.first_block = blocks;
    entries.push_back(e);
    blocks += ceil_div(w.n, kChunkElements);
  }
  if (entries.empty()) return;
  OCTET_REQUIRE(blocks <= 0x7FFFFFFF, "adamw_update_converts: {} chunks of {} values, at most 2^31 - 1",
                blocks, kChunkElements);
  const auto count = static_cast<int>(entries.size());
  const AdamWConvertWeight* device = table.upload(std::move(entries), stream);
  adamw_convert_chunks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      device, count,
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, weight_decay, step, grad_scale),
      elementwise::adamw_constants(learning_rate, beta1, beta2, eps, 0.0f, step, grad_scale));
  OCTET_CUDA_CHECK_LAUNCH("adamw_update_converts");
}

}  // namespace octet::cuda
