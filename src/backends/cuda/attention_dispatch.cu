// Attention's dispatch, multi-head or grouped-query (KVH kv heads for NH query heads): cuDNN's fused
// attention where it was loaded and takes the shape (use_cudnn), octet's kernels otherwise (attention.h),
// with the outputs and gradients converted to and from the type each reads where they are stored in another.
#include <cstdint>
#include <cstdio>
#include <string>
#include <tuple>

#include <cuda_bf16.h>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {

bool CudaBackend::use_cudnn(const void* qkv, Dtype qkv_type, int64_t B, int64_t T, int64_t C, int64_t NH,
                            int64_t KVH) {
  if (cudnn_ == nullptr || qkv_type != Dtype::bf16 || reinterpret_cast<uintptr_t>(qkv) % 16 != 0) {
    return false;
  }
  const auto key = std::make_tuple(B, T, C, NH, KVH);
  if (cudnn_refused_.count(key) > 0) return false;
  std::string why_not;
  if (cudnn_->supports(B, T, C, NH, KVH, &why_not)) return true;
  cudnn_refused_.insert(key);
  std::fprintf(stderr,
               "WARNING: cuDNN attention refused B=%lld T=%lld C=%lld NH=%lld KVH=%lld (%s); octet's "
               "attention kernels "
               "run it\n",
               static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(C),
               static_cast<long long>(NH), static_cast<long long>(KVH), why_not.c_str());
  return false;
}

// cuDNN reads and writes out, dout and dqkv in bf16, octet's kernels in float32: each is used where it is
// stored so and converted (into attention_bf16_ or attention_f32_) where not. On cuDNN with bf16 storage
// (attention_output_type), nothing is converted.
void CudaBackend::attention_forward_as(void* out, Dtype out_type, float* lse, const void* qkv, Dtype qkv_type,
                                       int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  OCTET_CHECK(out_type == Dtype::f32 || out_type == Dtype::bf16, "attention's output in f32 or bf16, got {}",
              dtype_name(out_type));
  const OpScope scope(*this, OpKind::attention);
  const auto n = static_cast<size_t>(B * T * C);
  const bool bf16_out = out_type == Dtype::bf16 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (use_cudnn(qkv, qkv_type, B, T, C, NH, KVH)) {
    auto* o = bf16_out ? static_cast<uint16_t*>(out) : attention_bf16_[0].as<uint16_t>(n, stream_);
    cudnn_->forward(o, lse, static_cast<const uint16_t*>(qkv), B, T, C, NH, KVH, stream_);
    if (out_type == Dtype::f32) {
      cuda::convert_from_bf16(static_cast<float*>(out), o, static_cast<int64_t>(n), stream_);
    } else if (!bf16_out) {
      OCTET_CUDA_CHECK(cudaMemcpyAsync(out, o, n * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    return;
  }
  float* o = out_type == Dtype::f32 ? static_cast<float*>(out) : attention_f32_[0].as<float>(n, stream_);
  cuda::attention_forward(o, lse, qkv, qkv_type, B, T, C, NH, KVH, attention_workspace_, attention_options_,
                          stream_);
  if (out_type == Dtype::bf16) {
    convert_to_bf16(static_cast<__nv_bfloat16*>(out), o, static_cast<int64_t>(n), stream_);
  }
}

void CudaBackend::attention_backward_as(void* dqkv, const void* dout, const void* qkv, Dtype qkv_type,
                                        const void* out, Dtype out_type, const float* lse, int64_t B,
                                        int64_t T, int64_t C, int64_t NH, int64_t KVH) {
  OCTET_CHECK(out_type == Dtype::f32 || out_type == Dtype::bf16,
              "attention's output and gradients in f32 or bf16, got {}", dtype_name(out_type));
  const OpScope scope(*this, OpKind::attention);
  const auto n = static_cast<size_t>(B * T * C);
  const auto n_qkv = static_cast<size_t>(B * T * (C + 2 * KVH * (C / NH)));  // dqkv's elements
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (use_cudnn(qkv, qkv_type, B, T, C, NH, KVH)) {
    if (out_type == Dtype::bf16 && aligned(dqkv) && aligned(dout) && aligned(out)) {
      cudnn_->backward(static_cast<uint16_t*>(dqkv), static_cast<const uint16_t*>(dout),
                       static_cast<const uint16_t*>(qkv), static_cast<const uint16_t*>(out), lse, B, T, C, NH,
                       KVH, stream_);
      return;
    }
    // Staged in bf16. A float32 out holds bf16 values (the forward's, widened), so its bf16 copy is exact; a
    // float32 dout is rounded to bf16, as octet's kernels round it for their products.
    auto* out_bf16 = attention_bf16_[0].as<uint16_t>(n, stream_);
    auto* dout_bf16 = attention_bf16_[1].as<uint16_t>(n, stream_);
    auto* dqkv_bf16 = attention_bf16_[2].as<uint16_t>(n_qkv, stream_);
    if (out_type == Dtype::f32) {
      cuda::convert_to_bf16(reinterpret_cast<__nv_bfloat16*>(out_bf16), static_cast<const float*>(out),
                            static_cast<int64_t>(n), stream_);
      cuda::convert_to_bf16(reinterpret_cast<__nv_bfloat16*>(dout_bf16), static_cast<const float*>(dout),
                            static_cast<int64_t>(n), stream_);
    } else {
      OCTET_CUDA_CHECK(cudaMemcpyAsync(out_bf16, out, n * 2, cudaMemcpyDeviceToDevice, stream_));
      OCTET_CUDA_CHECK(cudaMemcpyAsync(dout_bf16, dout, n * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    cudnn_->backward(dqkv_bf16, dout_bf16, static_cast<const uint16_t*>(qkv), out_bf16, lse, B, T, C, NH, KVH,
                     stream_);
    if (out_type == Dtype::f32) {
      cuda::convert_from_bf16(static_cast<float*>(dqkv), dqkv_bf16, static_cast<int64_t>(n_qkv), stream_);
    } else {
      OCTET_CUDA_CHECK(cudaMemcpyAsync(dqkv, dqkv_bf16, n_qkv * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    return;
  }
  if (out_type == Dtype::f32) {
    cuda::attention_backward(static_cast<float*>(dqkv), static_cast<const float*>(dout), qkv, qkv_type,
                             static_cast<const float*>(out), lse, B, T, C, NH, KVH, attention_workspace_,
                             attention_options_, stream_);
    return;
  }
  // bf16 storage on octet's kernels (a shape cuDNN refused): float32 staging around them.
  auto* out_f32 = attention_f32_[0].as<float>(n, stream_);
  auto* dout_f32 = attention_f32_[1].as<float>(n, stream_);
  auto* dqkv_f32 = attention_f32_[2].as<float>(n_qkv, stream_);
  cuda::convert_from_bf16(out_f32, static_cast<const uint16_t*>(out), static_cast<int64_t>(n), stream_);
  cuda::convert_from_bf16(dout_f32, static_cast<const uint16_t*>(dout), static_cast<int64_t>(n), stream_);
  cuda::attention_backward(dqkv_f32, dout_f32, qkv, qkv_type, out_f32, lse, B, T, C, NH, KVH,
                           attention_workspace_, attention_options_, stream_);
  convert_to_bf16(static_cast<__nv_bfloat16*>(dqkv), dqkv_f32, static_cast<int64_t>(n_qkv), stream_);
}

}  // namespace octet::cuda::backend_internal
