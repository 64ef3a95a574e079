// The default implementations of Backend's optional ops.
#include "octet/backend/backend.h"

#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet {

namespace {

void require_f32(const Backend& backend, std::string_view what, Dtype type) {
  OCTET_CHECK(type == Dtype::f32, "backend {}: {} is stored in f32 only, asked for {}", backend.name(), what,
              dtype_name(type));
}

}  // namespace

void Backend::linear_forward_as(void* out, Dtype out_type, const void* inp, Dtype inp_type,
                                const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                                int64_t C, int64_t OC, LinearExecution& exec) {
  require_f32(*this, "a linear layer's output", out_type);
  require_f32(*this, "a linear layer's input", inp_type);
  linear_forward(static_cast<float*>(out), static_cast<const float*>(inp), weight, copy, bias, N, C, OC,
                 exec);
}

void Backend::linear_forward_residual_as(float* out, const float* residual, const void* inp, Dtype inp_type,
                                         const float* weight, const WeightCopy* copy, const float* bias,
                                         int64_t N, int64_t C, int64_t OC, LinearExecution& exec) {
  linear_forward_as(out, Dtype::f32, inp, inp_type, weight, copy, bias, N, C, OC, exec);
  residual_forward(out, residual, out, N * OC);
}

void Backend::linear_recompute_residual(float* out, const float* residual, const float* weight,
                                        const WeightCopy* copy, const float* bias, int64_t N, int64_t C,
                                        int64_t OC, LinearExecution& exec) {
  linear_recompute(out, weight, copy, bias, N, C, OC, exec);
  residual_forward(out, residual, out, N * OC);
}

void Backend::linear_backward_as(void* dinp, Dtype dinp_type, void* dweight, Dtype dweight_type, float* dbias,
                                 const void* dout, Dtype dout_type, const void* inp, Dtype inp_type,
                                 const float* weight, const WeightCopy* copy, int64_t N, int64_t C,
                                 int64_t OC, LinearExecution& exec) {
  require_f32(*this, "a linear layer's input gradient", dinp_type);
  require_f32(*this, "a linear layer's weight gradient", dweight_type);
  require_f32(*this, "a linear layer's output gradient", dout_type);
  require_f32(*this, "a linear layer's input", inp_type);
  linear_backward(static_cast<float*>(dinp), static_cast<float*>(dweight), dbias,
                  static_cast<const float*>(dout), static_cast<const float*>(inp), weight, copy, N, C, OC,
                  exec);
}

double Backend::sum_of_squares_as(const void* x, Dtype type, int64_t n) {
  require_f32(*this, "a gradient", type);
  return sum_of_squares(static_cast<const float*>(x), n);
}

void Backend::require_f32_gradient(const WeightUpdate& w) const {
  OCTET_CHECK(w.grads_bf16 == nullptr, "backend {}: a weight gradient is stored in f32 only, asked for bf16",
              name());
}

void Backend::attention_forward_as(void* out, Dtype out_type, float* lse, const void* qkv, Dtype qkv_type,
                                   int64_t B, int64_t T, int64_t C, int64_t NH) {
  require_f32(*this, "attention's output", out_type);
  attention_forward(static_cast<float*>(out), lse, qkv, qkv_type, B, T, C, NH);
}

void Backend::attention_backward_as(void* dqkv, const void* dout, const void* qkv, Dtype qkv_type,
                                    const void* out, Dtype out_type, const float* lse, int64_t B, int64_t T,
                                    int64_t C, int64_t NH) {
  require_f32(*this, "attention's output and gradients", out_type);
  attention_backward(static_cast<float*>(dqkv), static_cast<const float*>(dout), qkv, qkv_type,
                     static_cast<const float*>(out), lse, B, T, C, NH);
}

void Backend::linear_recompute_as(void* out, Dtype out_type, const float* weight, const WeightCopy* copy,
                                  const float* bias, int64_t N, int64_t C, int64_t OC,
                                  LinearExecution& exec) {
  require_f32(*this, "a linear layer's output", out_type);
  linear_recompute(static_cast<float*>(out), weight, copy, bias, N, C, OC, exec);
}

void Backend::layernorm_forward_as(void* out, Dtype out_type, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C) {
  require_f32(*this, "LayerNorm's output", out_type);
  layernorm_forward(static_cast<float*>(out), mean, rstd, inp, weight, bias, N, C);
}

void Backend::layernorm_backward_as(float* dinp, float* dweight, float* dbias, const void* dout,
                                    Dtype dout_type, const float* inp, const float* weight, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  require_f32(*this, "LayerNorm's output gradient", dout_type);
  layernorm_backward(dinp, dweight, dbias, static_cast<const float*>(dout), inp, weight, mean, rstd, N, C);
}

void Backend::gelu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t n) {
  require_f32(*this, "GELU's output", out_type);
  require_f32(*this, "GELU's input", type);
  gelu_forward(static_cast<float*>(out), static_cast<const float*>(inp), n);
}

void Backend::gelu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                                   LinearExecution& consumer) {
  require_f32(*this, "GELU's input", type);
  gelu_forward_cast(out, static_cast<const float*>(inp), N, C, consumer);
}

void Backend::gelu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                               int64_t n) {
  require_f32(*this, "GELU's input gradient", dinp_type);
  require_f32(*this, "GELU's input and output gradient", type);
  gelu_backward(static_cast<float*>(dinp), static_cast<const float*>(inp), static_cast<const float*>(dout),
                n);
}

void Backend::gelu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N,
                                    int64_t C, float* dbias, LinearExecution& consumer) {
  require_f32(*this, "GELU's input and output gradient", type);
  gelu_backward_cast(dinp, static_cast<const float*>(inp), static_cast<const float*>(dout), N, C, dbias,
                     consumer);
}

}  // namespace octet
