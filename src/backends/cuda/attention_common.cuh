// What the files of octet's attention kernels (attention.h) share: the head layout and the parameters that
// every kernel takes (with the grouped-query layout of qkv: NH query heads, then KVH key heads, then KVH
// value heads in a row), and the launchers that attention.cu calls, of the float32 kernels
// (attention_float32.cu) and of the BF16 tensor-core kernels (attention_mma_forward.cu,
// attention_mma_backward.cu).
// Internal to the CUDA backend: include only from .cu files.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "attention.h"

namespace octet::cuda::attention_internal {

using Bf16 = __nv_bfloat16;

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

// How a head lies in shared memory: hs_pad rounds hs up to a float4, and stride (the distance between rows)
// is hs_pad rounded to 4 mod 8 words, so that the float4 reads of lanes holding consecutive rows fall in
// distinct bank groups.
struct HeadLayout {
  int hs = 0;
  int hs_pad = 0;
  int stride = 0;
};

inline HeadLayout head_layout(int hs) {
  HeadLayout layout;
  layout.hs = hs;
  layout.hs_pad = (hs + 3) / 4 * 4;
  layout.stride = layout.hs_pad % 8 == 4 ? layout.hs_pad : layout.hs_pad + 4;
  return layout;
}

// The pointers and sizes every kernel needs; b and h come from blockIdx.z and blockIdx.y.
struct AttentionParams {
  float* out;            // forward: out; backward: dqkv
  float* lse_out;        // forward only
  const float* qkv;      // float32 path only
  const float* dout;     // backward only
  const float* lse;      // backward only
  const float* row_dot;  // backward only: D
  int64_t T;
  int64_t C;      // of out: NH query heads
  int64_t NH;     // query heads
  int64_t KVH;    // key and value heads; query head h reads kv head h / group
  int64_t group;  // NH / KVH query heads per kv head
  int64_t kv_C;   // KVH hs: the width of k and of v in a row of qkv
  int64_t pitch;  // C + 2 kv_C: a row of qkv (and of dqkv)
  HeadLayout layout;
  float scale;
  // Tensor-core path only: the batch, q, k, v as bf16 [B, T, pitch] (16-byte aligned), dO packed as bf16
  // [B * NH][T][hs] in the backward (see attention_pack_kernel), and whether the float32 outputs are
  // 16-byte aligned, so that rows (whose pitches and C are multiples of 16 there) can be written as float2.
  int64_t B;
  const void* qkv_bf16;
  const void* packed_dout;
  bool vector;
};

// The float32 path (attention_float32.cu): the forward, and the backward's dQ and dK, dV kernels, which need
// D (launch_row_dot) first. The dK, dV kernel has a block per kv head, which walks the queries of each of
// its group's query heads in turn.
void forward_float32(const AttentionParams& p, int64_t B, cudaStream_t stream);
void backward_float32(const AttentionParams& p, int64_t B, cudaStream_t stream);
// D = rowsum(dO * O) per (b, h, t) into row_dot [B, NH, T] (`rows` = B * NH * T values), a warp per row.
void launch_row_dot(float* row_dot, const float* dout, const float* out, int64_t rows, int64_t T, int64_t C,
                    int64_t NH, int hs, cudaStream_t stream);

// The tensor-core path for one head size, a multiple of 16 up to kAttentionMaxHeadSize: the forward
// (attention_mma_forward.cu), and the backward's dQ and dK, dV kernels (attention_mma_backward.cu), which
// read dO packed by pack_heads or launch_pack_dout first.
template <int kHeadSize>
void launch_mma_forward(const AttentionParams& p, int64_t B, cudaStream_t stream);
template <int kHeadSize>
void launch_mma_backward(const AttentionParams& p, int64_t B, cudaStream_t stream);
// src [B, T, C] rounded to bf16 and packed head by head into dst [B * NH][T][hs].
void pack_heads(Bf16* dst, const float* src, int64_t B, int64_t T, int64_t NH, int hs, cudaStream_t stream);
// dout packed as pack_heads packs it, and D per (b, h, t) into row_dot from the same read: for head sizes
// whose hs / 8 divides 32. `vector`: dout and out are 16-byte aligned.
void launch_pack_dout(Bf16* dst, float* row_dot, const float* dout, const float* out, int64_t B, int64_t T,
                      int64_t C, int64_t NH, int hs, bool vector, cudaStream_t stream);

}  // namespace octet::cuda::attention_internal
