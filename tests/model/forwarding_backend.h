// A backend that passes every op to another backend: the base of the test wrappers that change a few ops
// of the CPU reference (undoing a fusion, storing tensors another way) and must leave the rest alone.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "octet/backend/backend.h"

namespace octet::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  std::unique_ptr<Buffer> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void copy_to_host(void* host, const void* source, size_t bytes) override {
    inner_.copy_to_host(host, source, bytes);
  }
  void copy_from_host(void* destination, const void* host, size_t bytes) override {
    inner_.copy_from_host(destination, host, bytes);
  }
  void fill_zero(float* x, int64_t n) override { inner_.fill_zero(x, n); }
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C) override {
    inner_.encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) override {
    inner_.encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int64_t N, int64_t C) override {
    inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N,
                          int64_t C) override {
    inner_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override {
    inner_.prepare_weight(copy, weight, OC, C, exec);
  }
  void linear_forward(float* out, const float* inp, const float* weight, const WeightCopy* copy,
                      const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec) override {
    inner_.linear_forward(out, inp, weight, copy, bias, N, C, OC, exec);
  }
  void linear_recompute(float* out, const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                        int64_t C, int64_t OC, LinearExecution& exec) override {
    inner_.linear_recompute(out, weight, copy, bias, N, C, OC, exec);
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                       LinearExecution& exec) override {
    inner_.linear_backward(dinp, dweight, dbias, dout, inp, weight, copy, N, C, OC, exec);
  }
  void attention_forward(float* out, float* lse, const void* qkv, Dtype qkv_type, int64_t B, int64_t T,
                         int64_t C, int64_t NH) override {
    inner_.attention_forward(out, lse, qkv, qkv_type, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const void* qkv, Dtype qkv_type, const float* out,
                          const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) override {
    inner_.attention_backward(dqkv, dout, qkv, qkv_type, out, lse, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override { inner_.gelu_forward(out, inp, n); }
  void layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int64_t N, int64_t C, LinearExecution& consumer) override {
    inner_.layernorm_forward_cast(out, mean, rstd, inp, weight, bias, N, C, consumer);
  }
  void gelu_forward_cast(float* out, const float* inp, int64_t N, int64_t C,
                         LinearExecution& consumer) override {
    inner_.gelu_forward_cast(out, inp, N, C, consumer);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    inner_.gelu_backward(dinp, inp, dout, n);
  }
  void gelu_backward_cast(float* dinp, const float* inp, const float* dout, int64_t N, int64_t C,
                          float* dbias, LinearExecution& consumer) override {
    inner_.gelu_backward_cast(dinp, inp, dout, N, C, dbias, consumer);
  }
  void residual_forward(float* out, const float* a, const float* b, int64_t n) override {
    inner_.residual_forward(out, a, b, n);
  }
  void accumulate(float* a, const float* b, int64_t n) override { inner_.accumulate(a, b, n); }
  void round_in_place(float* x, int64_t n, Dtype dtype) override { inner_.round_in_place(x, n, dtype); }
  void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                             int64_t Vp, float dloss) override {
    inner_.softmax_cross_entropy(losses, logits, targets, N, V, Vp, dloss);
  }
  double sum_of_squares(const float* x, int64_t n) override { return inner_.sum_of_squares(x, n); }
  bool all_finite(const float* x, int64_t n) override { return inner_.all_finite(x, n); }
  void scale(float* x, int64_t n, float factor) override { inner_.scale(x, n, factor); }
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float learning_rate,
                    float beta1, float beta2, float eps, float weight_decay, int64_t step,
                    float grad_scale) override {
    inner_.adamw_update(params, m, v, grads, n, learning_rate, beta1, beta2, eps, weight_decay, step,
                        grad_scale);
  }

 protected:
  Backend& inner_;
};

}  // namespace octet::testing
