// Fused causal self-attention on the GPU, multi-head or grouped-query, flash-style: the forward keeps only
// the softmax's log-sum-exp per row and the backward recomputes the probabilities from it, so no T x T
// matrix ever lives in device memory. Same contract as the CPU reference
// (src/backends/cpu/cpu_attention.cpp):
//   qkv  [B, T, C + 2 KVH hs]  q (NH heads of hs = C / NH), then k and v (KVH heads each); query head h reads
//                    kv head h / (NH / KVH). KVH = NH is multi-head attention (qkv [B, T, 3C]).
//   out  [B, T, C]
//   lse  [B, NH, T]  natural log of sum_j exp(s_j) over the row's scaled scores s_j = (q . k_j) / sqrt(hs),
//                    max included (lse = max + log(sum_j exp(s_j - max)))
// Internal to the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"

namespace octet::cuda {

// Head sizes up to this many elements are supported (GPT-2 uses 64).
inline constexpr int64_t kAttentionMaxHeadSize = 128;

struct AttentionOptions {
  // false: float32 arithmetic throughout, the path compared with the CPU reference.
  // true: the products Q K^T, P V and those of the backward run on BF16 tensor cores with float32
  // accumulation (Q, K, V, dO and the probabilities rounded to bf16 first); softmax, scaling and the
  // accumulators stay float32. Needs hs % 16 == 0 and compute capability 8.0 or newer; other head sizes take
  // the float32 path.
  bool bf16 = false;
};

// Whether attention with these options takes the tensor-core path on the current device: options.bf16, hs a
// multiple of 16 (up to kAttentionMaxHeadSize) and compute capability 8.0 or newer. Otherwise the float32
// path runs; callers that asked for bf16 can use this to report the fallback.
bool attention_uses_tensor_cores(int64_t C, int64_t NH, const AttentionOptions& options);

// Scratch of the kernels: D = rowsum(dO * O) per (b, h, t) for the backward, and the tensor-core path's
// bf16 copies: q, k, v [B, T, C + 2 KVH hs] where they come in float32 (or misaligned), then dO packed head
// by head
// ([B * NH][T][hs]) in the backward. Grows on demand and is reused across calls; the
// stream of the call that grows it is synchronised before the old block is freed. Move-only.
struct AttentionWorkspace {
  DeviceBuffer<float> row_dot;
  DeviceBuffer<uint16_t> packed;  // bf16 bits

  // At least `count` elements, valid for work queued on `stream` after this call.
  float* reserve_row_dot(size_t count, cudaStream_t stream);
  uint16_t* reserve_packed(size_t count, cudaStream_t stream);
};

// out [B, T, C], lse [B, NH, T] from qkv [B, T, C + 2 KVH hs] stored as qkv_type: float32, or bf16 where the
// tensor-core path runs (attention_uses_tensor_cores), which rounds q, k, v to bf16 anyway, so a bf16 qkv
// loses nothing and is read as it is. B or T may be zero (nothing is launched). KVH divides NH.
void attention_forward(float* out, float* lse, const void* qkv, Dtype qkv_type, int64_t B, int64_t T,
                       int64_t C, int64_t NH, int64_t KVH, AttentionWorkspace& workspace,
                       const AttentionOptions& options, cudaStream_t stream);
// Multi-head attention (KVH = NH): qkv [B, T, 3C].
inline void attention_forward(float* out, float* lse, const void* qkv, Dtype qkv_type, int64_t B, int64_t T,
                              int64_t C, int64_t NH, AttentionWorkspace& workspace,
                              const AttentionOptions& options, cudaStream_t stream) {
  attention_forward(out, lse, qkv, qkv_type, B, T, C, NH, NH, workspace, options, stream);
}
inline void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                              int64_t NH, AttentionWorkspace& workspace, const AttentionOptions& options,
                              cudaStream_t stream) {
  attention_forward(out, lse, qkv, Dtype::f32, B, T, C, NH, NH, workspace, options, stream);
}

// dqkv (qkv's shape, overwritten; a kv head's gradient summed over the NH / KVH query heads that read it)
// from dout [B, T, C] and the forward's qkv (same type rules), out and lse. Deterministic: the same inputs
// give bit-identical dqkv (no atomics; every sum has a fixed order).
void attention_backward(float* dqkv, const float* dout, const void* qkv, Dtype qkv_type, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH,
                        AttentionWorkspace& workspace, const AttentionOptions& options, cudaStream_t stream);
// Multi-head attention (KVH = NH).
inline void attention_backward(float* dqkv, const float* dout, const void* qkv, Dtype qkv_type,
                               const float* out, const float* lse, int64_t B, int64_t T, int64_t C,
                               int64_t NH, AttentionWorkspace& workspace, const AttentionOptions& options,
                               cudaStream_t stream) {
  attention_backward(dqkv, dout, qkv, qkv_type, out, lse, B, T, C, NH, NH, workspace, options, stream);
}
inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                               AttentionWorkspace& workspace, const AttentionOptions& options,
                               cudaStream_t stream) {
  attention_backward(dqkv, dout, qkv, Dtype::f32, out, lse, B, T, C, NH, NH, workspace, options, stream);
}

}  // namespace octet::cuda
