// A backend that passes every op to another backend: the base of the test wrappers that change a few ops
// of the CPU reference (undoing a fusion, storing tensors another way) and must leave the rest alone.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "octet/backend/backend.h"

namespace octet::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  FusionSupport supports(Fusion fusion, const LinearExecution& layer) const override {
    return inner_.supports(fusion, layer);
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void copy_to_host(void* host, const void* source, size_t bytes) override {
    inner_.copy_to_host(host, source, bytes);
  }
  void copy_from_host(void* destination, const void* host, size_t bytes) override {
    inner_.copy_from_host(destination, host, bytes);
  }
  void fill_zero(float* x, int64_t n) override { inner_.fill_zero(x, n); }
  void embedding_forward(const TensorView& out, const int32_t* tokens, const ConstTensorView& table,
                         const ConstTensorView& positions) override {
    inner_.embedding_forward(out, tokens, table, positions);
  }
  void embedding_backward(const TensorView& dtable, const TensorView& dpositions, const ConstTensorView& dout,
                          const int32_t* tokens) override {
    inner_.embedding_backward(dtable, dpositions, dout, tokens);
  }
  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             const Fp8CastTarget& cast_for) override {
    inner_.normalization_forward(kind, out, mean, rstd, inp, weight, bias, cast_for);
  }
  void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                              const ConstTensorView& dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd) override {
    inner_.normalization_backward(kind, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  }
  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override {
    inner_.prepare_weight(copy, weight, OC, C, exec);
  }
  void weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) override {
    inner_.weight_part_amaxes(parts, amaxes);
  }
  void cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) override {
    inner_.cast_weight_parts(parts, amaxes, codes);
  }
  void weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) override {
    inner_.weight_copies_from_codes(parts, codes);
  }
  void weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) override {
    inner_.weight_part_codes(parts, codes);
  }
  void release_weight_copies(std::span<const WeightPart> parts) override {
    inner_.release_weight_copies(parts);
  }
  void copy(void* destination, const void* source, size_t bytes) override {
    inner_.copy(destination, source, bytes);
  }

  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override {
    inner_.linear_forward(out, inp, weight, copy, epilogue, exec, input);
  }
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) override {
    inner_.linear_recompute(out, weight, copy, epilogue, exec, input);
  }
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override {
    inner_.linear_backward(dinp, dweight, dbias, dout, inp, weight, copy, exec, input, gradient);
  }
  void attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                         AttentionHeads heads) override {
    inner_.attention_forward(out, lse, qkv, heads);
  }
  void attention_backward(const TensorView& dqkv, const ConstTensorView& dout, const ConstTensorView& qkv,
                          const ConstTensorView& out, const float* lse, AttentionHeads heads) override {
    inner_.attention_backward(dqkv, dout, qkv, out, lse, heads);
  }
  void rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                        bool inverse) override {
    inner_.rotary_embedding(x, table, heads, inverse);
  }
  void top_k_softmax(const TensorView& probs, int32_t* experts, float* weights, const ConstTensorView& logits,
                     int64_t k) override {
    inner_.top_k_softmax(probs, experts, weights, logits, k);
  }
  void top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs, const int32_t* experts,
                              const float* weights, const float* dweights, int64_t k,
                              const float* dprobs) override {
    inner_.top_k_softmax_backward(dlogits, probs, experts, weights, dweights, k, dprobs);
  }
  void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts, int64_t N,
                       int64_t k, int64_t E, int64_t align) override {
    inner_.group_by_expert(offsets, slots, positions, experts, N, k, E, align);
  }
  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override {
    inner_.gather_rows(out, src, index, divisor, scale, cast_for, cast_as);
  }
  void combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                    const int32_t* positions, int64_t k, const float* weights) override {
    inner_.combine_rows(out, base, src, positions, k, weights);
  }
  void scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) override {
    inner_.scatter_rows(out, src, index);
  }
  void row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src, const int32_t* positions,
                int64_t k) override {
    inner_.row_dots(out, a, src, positions, k);
  }
  void column_sums(float* out, const ConstTensorView& x) override { inner_.column_sums(out, x); }
  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override {
    inner_.activation_forward(kind, out, inp, cast_for);
  }
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias,
                           const Fp8CastTarget& cast_for) override {
    inner_.activation_backward(kind, dinp, inp, dout, dbias, cast_for);
  }
  void add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) override {
    inner_.add(out, a, b);
  }
  void round_in_place(float* x, int64_t n, Dtype dtype) override { inner_.round_in_place(x, n, dtype); }
  void softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets, int64_t V,
                             float dloss) override {
    inner_.softmax_cross_entropy(losses, logits, targets, V, dloss);
  }
  double sum_of_squares(const ConstTensorView& x) override { return inner_.sum_of_squares(x); }
  bool all_finite(const float* x, int64_t n) override { return inner_.all_finite(x, n); }
  void scale(float* x, int64_t n, float factor) override { inner_.scale(x, n, factor); }
  void optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                        std::span<const UpdateSegment> segments) override {
    inner_.optimizer_update(step, tensors, segments);
  }

 protected:
  Backend& inner_;
};

}  // namespace octet::testing
