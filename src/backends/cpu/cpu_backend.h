// The CPU backend's class, shared by its source files (one per op family).
#pragma once

#include "octet/backend/backend.h"
#include "octet/numerics/quantize.h"

namespace octet::cpu {

class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(size_t bytes);
  ~CpuBuffer() override;
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

// A linear layer's weight as its GEMMs consume it.
struct CpuWeightCopy final : public WeightCopy {
  std::vector<float> rounded;      // BF16/FP16 modes: the weight rounded to the GEMM's type, [OC, C]
  QuantizedTensor fp8;             // FP8: codes of W [OC, C]
  QuantizedTensor fp8_transposed;  // FP8: codes of W^T [C, OC], the K-major operand of the input gradient
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  std::unique_ptr<Buffer> allocate(size_t bytes) override;
  std::unique_ptr<Buffer> allocate_releasable(size_t bytes) override;  // cpu_pages.cpp
  void copy_to_host(void* host, const void* source, size_t bytes) override;
  void copy_from_host(void* destination, const void* host, size_t bytes) override;
  void fill_zero(float* x, int64_t n) override;

  void embedding_forward(const TensorView& out, const int32_t* tokens, const ConstTensorView& table,
                         const ConstTensorView& positions) override;
  void embedding_backward(const TensorView& dtable, const TensorView& dpositions, const ConstTensorView& dout,
                          const int32_t* tokens) override;
  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             const Fp8CastTarget& cast_for) override;
  void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                              const ConstTensorView& dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd) override;

  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override;
  void weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) override;
  void cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) override;
  void weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) override;
  void weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) override;
  void release_weight_copies(std::span<const WeightPart> parts) override;
  void copy(void* destination, const void* source, size_t bytes) override;
  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override;
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) override;
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override;

  void attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                         AttentionHeads heads) override;
  void attention_backward(const TensorView& dqkv, const ConstTensorView& dout, const ConstTensorView& qkv,
                          const ConstTensorView& out, const float* lse, AttentionHeads heads) override;
  void rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                        bool inverse) override;

  void top_k_softmax(const TensorView& probs, int32_t* experts, float* weights, const ConstTensorView& logits,
                     int64_t k) override;
  void top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs, const int32_t* experts,
                              const float* weights, const float* dweights, int64_t k,
                              const float* dprobs) override;
  void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts, int64_t N,
                       int64_t k, int64_t E, int64_t align) override;
  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override;
  void combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                    const int32_t* positions, int64_t k, const float* weights) override;
  void scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) override;
  void row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src, const int32_t* positions,
                int64_t k) override;
  void column_sums(float* out, const ConstTensorView& x) override;

  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override;
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias, const Fp8CastTarget& cast_for) override;
  void add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) override;
  void round_in_place(float* x, int64_t n, Dtype dtype) override;
  void softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets, int64_t V,
                             float dloss) override;

  double sum_of_squares(const ConstTensorView& x) override;
  bool all_finite(const float* x, int64_t n) override;
  void scale(float* x, int64_t n, float factor) override;
  void optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                        std::span<const UpdateSegment> segments) override;

 private:
  // AdamW on the n elements of one segment.
  static void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                           const AdamWStep& step, float weight_decay);
  // The ops on float32 tensors, as the entries above take them apart (cpu_backend.cpp, cpu_linear.cpp,
  // cpu_attention.cpp).
  void embedding_forward(float* out, const int32_t* tokens, const float* table, const float* positions,
                         int64_t B, int64_t T, int64_t C);
  void embedding_backward(float* dtable, float* dpositions, const float* dout, const int32_t* tokens,
                          int64_t B, int64_t T, int64_t C);
  void add(float* out, const float* a, const float* b, int64_t n);
  void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                             int64_t Vp, float dloss);
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int64_t N, int64_t C);
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C);
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int64_t N, int64_t C);
  // Normalization or activation of `kind`, as the entries take them (the float32 op, no cast).
  void normalize(Normalization kind, float* out, float* mean, float* rstd, const float* inp,
                 const float* weight, const float* bias, int64_t N, int64_t C);
  void activate(Activation kind, float* out, const float* inp, int64_t N, int64_t C);
  void activate_backward(Activation kind, float* dinp, const float* inp, const float* dout, int64_t N,
                         int64_t C);
  void gelu_forward(float* out, const float* inp, int64_t n);
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
  // SwiGLU over rows of inp [N, 2C] (gate, up) into out [N, C], and its backward into dinp [N, 2C].
  void swiglu_forward(float* out, const float* inp, int64_t N, int64_t C);
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t C);
  // The producer-fused casts: the op, then the consumer's cast as its linear_forward or linear_backward
  // would make it (N rows of C output columns).
  void normalize_cast(Normalization kind, float* out, float* mean, float* rstd, const float* inp,
                      const float* weight, const float* bias, int64_t N, int64_t C, LinearExecution& consumer,
                      std::unique_ptr<Fp8Tensor>* into);
  void activate_cast(Activation kind, float* out, const float* inp, int64_t N, int64_t C,
                     LinearExecution& consumer, std::unique_ptr<Fp8Tensor>* into);
  // The consumer's cast of y [N, C] that a producer wrote (gather_rows' target): as its input (`role`
  // activation) or its output gradient (gradient), as its linear_forward or linear_backward would make it.
  void cast_produced(const float* y, int64_t N, int64_t C, LinearExecution& consumer, TensorRole role,
                     std::unique_ptr<Fp8Tensor>* into);
  // dinp [N, k C] (k = activation_inputs(kind)).
  void activate_backward_cast(Activation kind, float* dinp, const float* inp, const float* dout, int64_t N,
                              int64_t C, float* dbias, LinearExecution& consumer,
                              std::unique_ptr<Fp8Tensor>* into);
  void linear_forward(float* out, const float* inp, const float* weight, const WeightCopy* copy,
                      const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                      const Fp8Operand& input);
  void linear_recompute(float* out, const WeightCopy* copy, const float* bias, int64_t N, int64_t C,
                        int64_t OC, LinearExecution& exec, const Fp8Tensor& input);
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                       LinearExecution& exec, const Fp8Tensor* input, const Fp8Operand& gradient);
  void attention_forward(float* out, float* lse, const float* qkv, const AttentionSizes& s,
                         AttentionHeads heads);
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, const AttentionSizes& s, AttentionHeads heads);
};

// out [M, N] = a [M, K] x b [N, K]^T (+= when accumulate), float32 accumulation; BLAS when present.
void gemm_abt(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, bool accumulate);

}  // namespace octet::cpu
