// Fused causal self-attention (attention.h): the entry points, which check the shapes and pick the path,
// the float32 kernels (attention_float32.cu) or the BF16 tensor-core kernels (attention_mma.cuh and the two
// files of its kernels) where AttentionOptions::bf16 asks for them and the head size and the device allow;
// and the workspace that both paths take.
#include "attention.h"

#include <cmath>

#include <cuda_bf16.h>

#include "attention_common.cuh"
#include "convert.h"
#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet::cuda {
namespace {

using attention_internal::AttentionParams;
using attention_internal::backward_float32;
using attention_internal::Bf16;
using attention_internal::forward_float32;
using attention_internal::head_layout;
using attention_internal::launch_mma_backward;
using attention_internal::launch_mma_forward;
using attention_internal::launch_pack_dout;
using attention_internal::launch_row_dot;
using attention_internal::pack_heads;

AttentionParams make_params(int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  OCTET_REQUIRE(NH > 0 && C > 0 && C % NH == 0,
                "attention: C must be a positive multiple of NH, got C={} NH={}", C, NH);
  OCTET_REQUIRE(KVH > 0 && NH % KVH == 0, "attention: KVH must divide NH, got NH={} KVH={}", NH, KVH);
  const int64_t hs = C / NH;
  OCTET_REQUIRE(hs <= kAttentionMaxHeadSize, "attention: head size C/NH must be at most {}, got {}",
                kAttentionMaxHeadSize, hs);
  AttentionParams p{};
  p.T = T;
  p.C = C;
  p.NH = NH;
  p.KVH = KVH;
  p.group = NH / KVH;
  p.kv_C = KVH * hs;
  p.pitch = C + 2 * p.kv_C;
  p.layout = head_layout(static_cast<int>(hs));
  p.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  return p;
}

template <int kHeadSize>
void launch_mma(const AttentionParams& p, int64_t B, bool forward, cudaStream_t stream) {
  // Positions inside a head are 32-bit in the kernels.
  OCTET_REQUIRE(p.T <= (int64_t{1} << 30) && p.NH <= 65535 && B <= 65535,
                "attention: grid too large, got T={} NH={} B={}", p.T, p.NH, B);
  if (forward) {
    launch_mma_forward<kHeadSize>(p, B, stream);
  } else {
    launch_mma_backward<kHeadSize>(p, B, stream);
  }
}

void launch_mma_for_head_size(const AttentionParams& p, int64_t B, bool forward, cudaStream_t stream) {
  switch (p.layout.hs) {
    case 16:
      launch_mma<16>(p, B, forward, stream);
      break;
    case 32:
      launch_mma<32>(p, B, forward, stream);
      break;
    case 48:
      launch_mma<48>(p, B, forward, stream);
      break;
    case 64:
      launch_mma<64>(p, B, forward, stream);
      break;
    case 80:
      launch_mma<80>(p, B, forward, stream);
      break;
    case 96:
      launch_mma<96>(p, B, forward, stream);
      break;
    case 112:
      launch_mma<112>(p, B, forward, stream);
      break;
    case 128:
      launch_mma<128>(p, B, forward, stream);
      break;
    default:
      OCTET_CHECK(false, "no tensor-core attention kernel for head size {}", p.layout.hs);
  }
}

bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

bool current_device_has_bf16_mma() {
  int device = 0;
  int major = 0;
  OCTET_CUDA_CHECK(cudaGetDevice(&device));
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

bool use_tensor_cores(int64_t hs, const AttentionOptions& options) {
  return options.bf16 && hs % 16 == 0 && hs <= kAttentionMaxHeadSize && current_device_has_bf16_mma();
}

}  // namespace

bool attention_uses_tensor_cores(int64_t C, int64_t NH, const AttentionOptions& options) {
  return NH > 0 && C % NH == 0 && use_tensor_cores(C / NH, options);
}

uint16_t* AttentionWorkspace::reserve_packed(size_t count, cudaStream_t stream) {
  if (packed.size() < count) {
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    packed = DeviceBuffer<uint16_t>();
    packed = DeviceBuffer<uint16_t>(count);
  }
  return packed.data();
}

float* AttentionWorkspace::reserve_row_dot(size_t count, cudaStream_t stream) {
  if (row_dot.size() < count) {
    // Work already queued on the stream may still read the old block.
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    row_dot = DeviceBuffer<float>();
    row_dot = DeviceBuffer<float>(count);
  }
  return row_dot.data();
}

namespace {

// q, k, v as the kernels read them, bf16 [B, T, pitch] at a 16-byte aligned address: qkv itself where it is
// such already, otherwise converted (float32) or copied into the front of the workspace's packed block,
// which then holds `extra` more elements behind them. Returns the copy and, in *used, the elements it took.
const Bf16* bf16_qkv(const void* qkv, Dtype type, int64_t n, size_t extra, AttentionWorkspace& workspace,
                     size_t* used, cudaStream_t stream) {
  OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "attention: q, k, v in float32 or bf16, got {}",
              dtype_name(type));
  if (type == Dtype::bf16 && aligned16(qkv)) {
    *used = 0;
    workspace.reserve_packed(extra, stream);
    return static_cast<const Bf16*>(qkv);
  }
  *used = static_cast<size_t>(n);
  auto* copy = reinterpret_cast<Bf16*>(workspace.reserve_packed(static_cast<size_t>(n) + extra, stream));
  if (type == Dtype::f32) {
    convert_to_bf16(copy, static_cast<const float*>(qkv), n, stream);
  } else {
    OCTET_CUDA_CHECK(
        cudaMemcpyAsync(copy, qkv, sizeof(Bf16) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream));
  }
  return copy;
}

void check_qkv_type(Dtype type, bool tensor_cores, const char* op) {
  OCTET_CHECK(type == Dtype::f32 || (type == Dtype::bf16 && tensor_cores),
              "{}: q, k, v in bf16 need the tensor-core path (AttentionOptions::bf16, hs a multiple of 16 up "
              "to {}, compute capability 8.0 or newer); got {}",
              op, kAttentionMaxHeadSize, dtype_name(type));
}

}  // namespace

void attention_forward(float* out, float* lse, const void* qkv, Dtype qkv_type, int64_t B, int64_t T,
                       int64_t C, int64_t NH, int64_t KVH, AttentionWorkspace& workspace,
                       const AttentionOptions& options, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0, "attention_forward: non-negative B and T, got B={} T={}", B, T);
  AttentionParams p = make_params(T, C, NH, KVH);
  if (B == 0 || T == 0) return;
  OCTET_CHECK(out != nullptr && lse != nullptr && qkv != nullptr, "attention_forward: non-null pointers");
  const bool tensor_cores = use_tensor_cores(p.layout.hs, options);
  check_qkv_type(qkv_type, tensor_cores, "attention_forward");
  p.out = out;
  p.lse_out = lse;
  if (tensor_cores) {
    p.B = B;
    p.vector = aligned16(out);
    size_t used = 0;
    p.qkv_bf16 = bf16_qkv(qkv, qkv_type, B * T * p.pitch, 0, workspace, &used, stream);
    p.packed_dout = nullptr;
    launch_mma_for_head_size(p, B, true, stream);
  } else {
    p.qkv = static_cast<const float*>(qkv);
    forward_float32(p, B, stream);
  }
}

void attention_backward(float* dqkv, const float* dout, const void* qkv, Dtype qkv_type, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH,
                        AttentionWorkspace& workspace, const AttentionOptions& options, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0, "attention_backward: non-negative B and T, got B={} T={}", B, T);
  AttentionParams p = make_params(T, C, NH, KVH);
  if (B == 0 || T == 0) return;
  OCTET_CHECK(dqkv != nullptr && dout != nullptr && qkv != nullptr && out != nullptr && lse != nullptr,
              "attention_backward: non-null pointers");
  const int hs = p.layout.hs;
  const bool tensor_cores = use_tensor_cores(hs, options);
  check_qkv_type(qkv_type, tensor_cores, "attention_backward");
  const int64_t rows = B * NH * T;
  float* row_dot = workspace.reserve_row_dot(static_cast<size_t>(rows), stream);
  p.out = dqkv;
  p.dout = dout;
  p.lse = lse;
  p.row_dot = row_dot;

  // D comes with the packing of dO where a row's eight-element groups divide a warp evenly.
  const bool packed_row_dot = tensor_cores && 32 % (hs / 8) == 0;
  if (!packed_row_dot) {
    launch_row_dot(row_dot, dout, out, rows, T, C, NH, hs, stream);
  }
  if (tensor_cores) {
    p.B = B;
    p.vector = aligned16(dqkv);
    // The workspace: q, k, v where they need converting, then dO packed per head.
    size_t used = 0;
    p.qkv_bf16 =
        bf16_qkv(qkv, qkv_type, B * T * p.pitch, static_cast<size_t>(B * T * C), workspace, &used, stream);
    Bf16* packed_dout = reinterpret_cast<Bf16*>(workspace.packed.data()) + used;
    if (packed_row_dot) {
      launch_pack_dout(packed_dout, row_dot, dout, out, B, T, C, NH, hs, aligned16(dout) && aligned16(out),
                       stream);
    } else {
      pack_heads(packed_dout, dout, B, T, NH, hs, stream);
    }
    p.packed_dout = packed_dout;
    launch_mma_for_head_size(p, B, false, stream);
  } else {
    p.qkv = static_cast<const float*>(qkv);
    backward_float32(p, B, stream);
  }
}

}  // namespace octet::cuda
