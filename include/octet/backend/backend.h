// The backend interface: the small, explicit set of ops the training engine is written against. The CPU
// backend (cpu_backend.h) is the reference; a GPU backend implements the same ops and is held to it. Buffers
// are allocated by the backend and addressed by raw pointers into them (host memory on the CPU, device memory
// on a GPU). Shape letters as in llm.c: N = B*T rows, C channels, OC output channels, NH heads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "octet/backend/precision.h"

namespace octet {

// Kinds of work in a training step, for the time breakdown of `octet bench train`.
enum class OpKind : uint8_t {
  gemm_fp8,   // FP8 GEMMs
  gemm_wide,  // BF16, FP16 and FP32 GEMMs
  attention,  // fused attention, forward and backward
  casts,      // FP8 casts (with their scaling updates) and BF16/FP16 conversions not fused into a producer
  norm_activation,  // LayerNorm and GELU, with the FP8 casts (and the bias gradient) fused into them
  loss,             // softmax cross-entropy
  optimizer,        // AdamW (with the weight casts fused into it), gradient norm, finiteness checks
  other,            // embeddings, residual adds, biases, zeroing
  count
};
inline constexpr size_t kOpKinds = static_cast<size_t>(OpKind::count);
std::string_view op_kind_name(OpKind kind);
// Device milliseconds per OpKind.
using OpTimes = std::array<double, kOpKinds>;

// Memory owned by a backend; move-only through unique_ptr.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t bytes() const = 0;
  float* floats() { return static_cast<float*>(data()); }
  int32_t* ints() { return static_cast<int32_t*>(data()); }
};

// A linear layer's weight in the form its GEMMs consume (a rounded BF16/FP16 copy, or FP8 codes with their
// transposed copy), made once per optimizer step by Backend::prepare_weight.
class WeightCopy {
 public:
  virtual ~WeightCopy() = default;
};

// Whether lm_head_chunk keeps the logits in BF16: when the head's three GEMMs are BF16.
inline bool logits_in_bf16(const LinearExecution& exec) {
  return exec.forward == GemmMode::bf16 && exec.input_gradient == GemmMode::bf16 &&
         exec.weight_gradient == GemmMode::bf16;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Waits until every op enqueued so far has finished (a GPU backend's ops are asynchronous; a value copied
  // to the host is always complete).
  virtual void synchronize() {}

  // FP8 scaling state that a backend keeps in its own memory (the CUDA backend keeps it on the device so
  // that casts read and update it without the host). fetch_scaling brings the host copy up to date;
  // publish_scaling sends a changed host copy (a restored checkpoint) to the backend. No-ops on the CPU.
  virtual void fetch_scaling(Fp8LinearState& /*state*/) {}
  virtual void publish_scaling(const Fp8LinearState& /*state*/) {}
  // The same for a layer's cast telemetry: adds what the backend counted since the last fetch to the host
  // copy and zeroes its own counters (on the CPU the counts go straight to the host copy: a no-op).
  virtual void fetch_telemetry(Fp8LinearTelemetry& /*telemetry*/) {}

  // Device time per kind of op, when on: take_op_times returns the milliseconds of the work enqueued since
  // the last take (waiting for it) and starts again. Timing adds events around every op; it is for
  // benchmarks. A backend that cannot time returns zeros.
  virtual void set_op_timing(bool /*on*/) {}
  virtual OpTimes take_op_times() { return {}; }

  // Memory. Buffers are zero-filled.
  virtual std::unique_ptr<Buffer> allocate(size_t bytes) = 0;
  virtual void copy_to_host(void* host, const void* source, size_t bytes) = 0;
  virtual void copy_from_host(void* destination, const void* host, size_t bytes) = 0;
  virtual void fill_zero(float* x, int64_t n) = 0;
  // fill_zero of x's elements offset .. offset + count - 1 for each range: the same as one call per range,
  // in one pass where the backend can. Ranges must not overlap.
  struct Range {
    int64_t offset = 0;
    int64_t count = 0;
  };
  virtual void fill_zero_ranges(float* x, std::span<const Range> ranges) {
    for (const Range& r : ranges) fill_zero(x + r.offset, r.count);
  }

  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
  virtual void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                               int64_t B, int64_t T, int64_t C) = 0;
  // Accumulates into dwte and dwpe.
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                                int64_t T, int64_t C) = 0;

  // Per row of inp [N, C]: out = (x - mean) * rstd * weight + bias; saves mean and rstd [N].
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int64_t N, int64_t C) = 0;
  // layernorm_forward with out stored as `out_type` (bf16_storage_type, or f32): a bf16 out is the float32
  // value rounded to bf16 once (to nearest, ties to even). The model stores so the input of a linear layer
  // whose GEMMs round it to bf16 anyway (Gpt2). The default takes f32 only.
  virtual void layernorm_forward_as(void* out, Dtype out_type, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int64_t N, int64_t C);
  // Accumulates into dinp, dweight, dbias.
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean, const float* rstd,
                                  int64_t N, int64_t C) = 0;
  // layernorm_backward with dout stored as `dout_type` (bf16_storage_type, or f32): bf16 values are read as
  // their float32 values. The default takes f32 only.
  virtual void layernorm_backward_as(float* dinp, float* dweight, float* dbias, const void* dout,
                                     Dtype dout_type, const float* inp, const float* weight,
                                     const float* mean, const float* rstd, int64_t N, int64_t C);

  // Makes (or refreshes) the copy of weight [OC, C] that the layer's GEMMs use, as `exec` says.
  virtual void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                              LinearExecution& exec) = 0;
  // out [N, OC] = inp [N, C] x W^T + bias (bias may be null), in float32: the GEMM's float32 result (after
  // its operands were rounded or cast as exec says) plus the bias, not rounded afterwards. For BF16, FP16 and
  // FP8 GEMMs the bias is first rounded to the GEMM's 16-bit type (BF16 for FP8), as PyTorch autocast rounds
  // it and as cuBLASLt's FP8 epilogue takes it; a float32 GEMM adds it as it is.
  virtual void linear_forward(float* out, const float* inp, const float* weight, const WeightCopy* copy,
                              const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec) = 0;
  // The last linear_forward of an FP8 layer again, for a backward that needs its output but did not keep it:
  // the same out, bit for bit, from the input cast that forward kept (exec.keep_input_codes: the codes of
  // x [N, C] besides the transposed ones), the same weight copy and the same bias. Casts nothing, changes
  // no scaling state and counts no GEMM.
  virtual void linear_recompute(float* out, const float* weight, const WeightCopy* copy, const float* bias,
                                int64_t N, int64_t C, int64_t OC, LinearExecution& exec) = 0;
  // The last linear_forward_residual_as of an FP8 layer again (attn.c_proj, whose output joins the
  // residual stream): out = residual + the layer's output, the same bits as that forward wrote, given the
  // same residual, from the input codes it kept (exec.keep_input_codes). Casts nothing, changes no scaling
  // state and counts no GEMM. The default runs linear_recompute into out, then residual_forward(out,
  // residual, out), as the default linear_forward_residual_as does; a backend that overrides one overrides
  // both.
  virtual void linear_recompute_residual(float* out, const float* residual, const float* weight,
                                         const WeightCopy* copy, const float* bias, int64_t N, int64_t C,
                                         int64_t OC, LinearExecution& exec);
  // dinp [N, C] = dout x W (overwritten, the GEMM's float32 result, not rounded); dweight [OC, C] += dout^T x
  // inp; dbias [OC] += column sums of dout (dbias may be null). With exec.gradient_cast_ready, dout's FP8
  // cast comes from its producer (gelu_backward_cast), which also added the bias gradient: dbias is then
  // null, and so is dout where gradient_cast_suffices(exec).
  virtual void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                               LinearExecution& exec) = 0;

  // How this backend stores a tensor whose values the model rounds to bf16 (the MLP's hidden activation
  // and the gradient that reaches it, see Gpt2): Dtype::bf16 where its ops read and write bf16 themselves
  // (the *_as ops), which halves those tensors' bytes; Dtype::f32 otherwise (the default), the model then
  // rounding the float32 values in place (round_in_place), so that both hold the same numbers.
  virtual Dtype bf16_storage_type() const { return Dtype::f32; }
  // linear_recompute with its output stored as `out_type`: a bf16 output is the float32 result, bias
  // included, rounded to bf16 once, as linear_forward_as writes it. The default takes f32 only.
  virtual void linear_recompute_as(void* out, Dtype out_type, const float* weight, const WeightCopy* copy,
                                   const float* bias, int64_t N, int64_t C, int64_t OC,
                                   LinearExecution& exec);

  // The type attention's input qkv is stored in: Dtype::bf16 where this backend's attention multiplies q, k
  // and v rounded to bf16 anyway (the CUDA backend's tensor-core attention), so that storing them rounded
  // changes no result and halves their bytes; Dtype::f32 otherwise (the default).
  virtual Dtype attention_input_type(int64_t /*C*/, int64_t /*NH*/) const { return Dtype::f32; }
  // The type attention's output `out` and the gradients on either side of it (its dout, and its dqkv, which
  // attn.c_attn's backward reads) are stored in: Dtype::bf16 where this backend's attention reads and writes
  // them in bf16 anyway (the CUDA backend on cuDNN), so that storing them so changes no result and saves
  // their conversions; Dtype::f32 otherwise (the default). Only where attention_input_type is bf16.
  virtual Dtype attention_output_type(int64_t /*C*/, int64_t /*NH*/) const { return Dtype::f32; }

  // linear_forward with its input stored as `inp_type` and its output as `out_type`. Dtype::f32 for both is
  // linear_forward itself. A bf16 input (attention's output, where attention_output_type says so) gives the
  // results of its float32 values. A bf16 output (attention's input, where attention_input_type says so) is
  // the float32 result, bias included, rounded to bf16 once. The default takes f32 only.
  virtual void linear_forward_as(void* out, Dtype out_type, const void* inp, Dtype inp_type,
                                 const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                                 int64_t C, int64_t OC, LinearExecution& exec);
  // out [N, OC] = residual [N, OC] + the float32 output of linear_forward_as: a linear layer whose output
  // joins the residual stream (attn.c_proj and mlp.c_proj). The default runs linear_forward_as into out and
  // then residual_forward(out, residual, out), rounding the layer's output, then the sum. A backend may add
  // the residual inside the GEMM instead (the CUDA backend's epilogue), in an order of its own. out must not
  // overlap residual or inp.
  virtual void linear_forward_residual_as(float* out, const float* residual, const void* inp, Dtype inp_type,
                                          const float* weight, const WeightCopy* copy, const float* bias,
                                          int64_t N, int64_t C, int64_t OC, LinearExecution& exec);
  // linear_backward with dinp, dweight, dout and inp stored as the given types: bf16 values are read as their
  // float32 values, and a bf16 dinp is the float32 result rounded to bf16 once. A bf16 dweight (only where
  // weight_gradient_type says so) is the GEMM's float32 result, plus dweight's old value where it adds to it,
  // rounded to bf16 once. The default takes f32 only.
  virtual void linear_backward_as(void* dinp, Dtype dinp_type, void* dweight, Dtype dweight_type,
                                  float* dbias, const void* dout, Dtype dout_type, const void* inp,
                                  Dtype inp_type, const float* weight, const WeightCopy* copy, int64_t N,
                                  int64_t C, int64_t OC, LinearExecution& exec);
  // How this backend stores a linear layer's weight gradient that the model keeps rounded to bf16
  // (train.weight_gradients = "bf16", for layers whose weight-gradient GEMM is BF16 or FP8, as PyTorch
  // autocast's weight gradients are the BF16 GEMM's output): Dtype::bf16 where that GEMM writes and adds to
  // it in bf16 itself, which halves the gradient's bytes in the GEMM, the gradient norm and AdamW; Dtype::f32
  // otherwise (the default), the model then rounding the float32 gradient in place after each backward, so
  // that both hold the same numbers. It must stay bf16 if the layer moves to BF16 (move_layer_to_bf16).
  virtual Dtype weight_gradient_type(const LinearExecution& /*exec*/) const { return Dtype::f32; }

  // Causal multi-head self-attention over qkv [B, T, 3C] (q, k, v each [C], NH heads of C/NH) stored as
  // qkv_type (attention_input_type, or f32), writing out [B, T, C] and the softmax log-sum-exp per row, lse
  // [B, NH, T]; no T x T matrix is kept.
  virtual void attention_forward(float* out, float* lse, const void* qkv, Dtype qkv_type, int64_t B,
                                 int64_t T, int64_t C, int64_t NH) = 0;
  // dqkv [B, T, 3C] (float32) is overwritten.
  virtual void attention_backward(float* dqkv, const float* dout, const void* qkv, Dtype qkv_type,
                                  const float* out, const float* lse, int64_t B, int64_t T, int64_t C,
                                  int64_t NH) = 0;
  // The same with out (and, in the backward, dout and dqkv) stored as out_type (attention_output_type, or
  // f32). The defaults take f32 only.
  virtual void attention_forward_as(void* out, Dtype out_type, float* lse, const void* qkv, Dtype qkv_type,
                                    int64_t B, int64_t T, int64_t C, int64_t NH);
  virtual void attention_backward_as(void* dqkv, const void* dout, const void* qkv, Dtype qkv_type,
                                     const void* out, Dtype out_type, const float* lse, int64_t B, int64_t T,
                                     int64_t C, int64_t NH);

  // GELU, tanh approximation.
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;

  // The producer of an FP8 linear layer's input casting it for that layer. layernorm_forward_cast and
  // gelu_forward_cast do what layernorm_forward and gelu_forward do and also cast their output [N, C] for the
  // forward GEMM of `consumer`, exactly as its linear_forward would (same scale, same scaling-state update,
  // same counts and telemetry). The cast is kept in consumer.saved_input with consumer.input_cast_ready set;
  // the next linear_forward on `consumer` takes it instead of casting its input. A GPU backend writes the
  // codes in the same pass as the output. `out` may be null when nothing else reads the output
  // (input_cast_suffices(consumer)); then the float32 output is not written at all.
  virtual void layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp,
                                      const float* weight, const float* bias, int64_t N, int64_t C,
                                      LinearExecution& consumer) = 0;
  virtual void gelu_forward_cast(float* out, const float* inp, int64_t N, int64_t C,
                                 LinearExecution& consumer) = 0;
  // dinp = dout * gelu'(inp), overwritten.
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // The same for the backward: the producer of an FP8 linear layer's output gradient casting it for that
  // layer. gelu_backward_cast does what gelu_backward does over [N, C] and also casts dinp for the backward
  // GEMMs of `consumer` (casts_gradient(consumer)), exactly as its linear_backward would cast its dout (same
  // scale, same scaling-state update, same counts and telemetry), and adds the column sums of dinp to dbias
  // [C] (when not null) as that linear_backward would. The backend keeps the one cast (a GPU backend writes
  // it in the same pass as dinp) and sets consumer.gradient_cast_ready; the next linear_backward on
  // `consumer` must come before any other gradient cast, and takes it with a null dbias. `dinp` may be
  // null when nothing else reads the gradient (gradient_cast_suffices(consumer)); then the float32 gradient
  // is not written at all and linear_backward gets a null dout.
  virtual void gelu_backward_cast(float* dinp, const float* inp, const float* dout, int64_t N, int64_t C,
                                  float* dbias, LinearExecution& consumer) = 0;
  // The four GELU ops with their input (and, in the backward, dout) stored as `type` (bf16_storage_type,
  // or f32): bf16 values are read as their float32 values. The outputs are float32, except gelu_forward_as's
  // out and gelu_backward_as's dinp, stored as `out_type` and `dinp_type` (bf16: the float32 value rounded
  // once, as layernorm_forward_as's). The defaults take f32 only.
  virtual void gelu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t n);
  virtual void gelu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                                    LinearExecution& consumer);
  virtual void gelu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                                int64_t n);
  virtual void gelu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N,
                                     int64_t C, float* dbias, LinearExecution& consumer);
  virtual void residual_forward(float* out, const float* a, const float* b, int64_t n) = 0;
  // a += b
  virtual void accumulate(float* a, const float* b, int64_t n) = 0;
  // x [n] rounded in place to `dtype`, Dtype::bf16 or Dtype::f16 (to nearest, ties to even), kept as float32.
  virtual void round_in_place(float* x, int64_t n, Dtype dtype) = 0;

  // Softmax cross-entropy over the first V of Vp logits per row: losses [N] = -log p[target]. When
  // dloss != 0, logits are overwritten with d(dloss * sum(losses))/dlogits (zero in the padded columns).
  virtual void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N,
                                     int64_t V, int64_t Vp, float dloss) = 0;

  // One chunk of the LM head in training: logits [n, Vp] = inp [n, C] x weight [Vp, C]^T (the head's forward
  // GEMM, no bias), losses [n] from softmax_cross_entropy, and, when dloss != 0, the head's backward from
  // the logits' gradient: dinp [n, C] overwritten, dweight accumulated, as linear_backward. `logits` is
  // scratch of [n, Vp] floats. A head whose three GEMMs are BF16 (logits_in_bf16) rounds its logits to BF16
  // before the loss, unlike linear_forward, so that a backend may keep the logits and their gradient in BF16
  // throughout (its GEMM writes BF16 logits, and its backward GEMMs read the gradient in BF16, which
  // linear_backward would round it to anyway) and still compute the same values. The default runs those
  // ops: linear_forward, round_in_place where the logits are BF16, softmax_cross_entropy, linear_backward.
  virtual void lm_head_chunk(float* losses, float* logits, const int32_t* targets, float* dinp,
                             float* dweight, const float* inp, const float* weight, const WeightCopy* copy,
                             int64_t n, int64_t C, int64_t V, int64_t Vp, float dloss,
                             LinearExecution& exec) {
    linear_forward(logits, inp, weight, copy, nullptr, n, C, Vp, exec);
    if (logits_in_bf16(exec)) round_in_place(logits, n * Vp, Dtype::bf16);
    softmax_cross_entropy(losses, logits, targets, n, V, Vp, dloss);
    if (dloss != 0.0f) linear_backward(dinp, dweight, nullptr, logits, inp, weight, copy, n, C, Vp, exec);
  }

  // Optimizer and gradient utilities.
  virtual double sum_of_squares(const float* x, int64_t n) = 0;
  // sum_of_squares of x [n] stored as `type` (f32, or bf16 where weight_gradient_type says so): bf16 values
  // are summed as their float32 values, in the order sum_of_squares takes for n floats. The default takes
  // f32 only.
  virtual double sum_of_squares_as(const void* x, Dtype type, int64_t n);
  virtual bool all_finite(const float* x, int64_t n) = 0;
  virtual void scale(float* x, int64_t n, float factor) = 0;
  // AdamW on float32 master weights: g = grads * grad_scale; m, v moments; decoupled weight decay.
  virtual void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                            float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                            int64_t step, float grad_scale) = 0;
  // adamw_update on each segment of the four tensors (the elements offset .. offset + count - 1 of each,
  // with the segment's weight decay): the same results as one call per segment. A GPU backend updates them
  // all in one pass (one launch for the model's many small tensors). Segments must not overlap.
  struct AdamWSegment {
    int64_t offset = 0;
    int64_t count = 0;
    float weight_decay = 0.0f;
    // Where the segment is a linear layer's bias: that layer's weight copy, in which a GPU backend keeps the
    // bias as its forward GEMM's epilogue reads it (rounded to BF16) and writes it again in the AdamW pass.
    // Null otherwise, and ignored by backends that keep no such copy.
    WeightCopy* bias_of = nullptr;
    // Where the segment's gradient starts in grads; -1: at offset, as in the other three tensors.
    int64_t grad_offset = -1;
    int64_t grad_at() const { return grad_offset < 0 ? offset : grad_offset; }
  };
  virtual void adamw_update_segments(float* params, float* m, float* v, const float* grads,
                                     std::span<const AdamWSegment> segments, float learning_rate, float beta1,
                                     float beta2, float eps, int64_t step, float grad_scale) {
    for (const AdamWSegment& s : segments) {
      adamw_update(params + s.offset, m + s.offset, v + s.offset, grads + s.grad_at(), s.count, learning_rate,
                   beta1, beta2, eps, s.weight_decay, step, grad_scale);
    }
  }
  // AdamW on a linear layer's weight [OC, C], then prepare_weight of its copy: the same results as the two
  // calls in turn. A GPU backend writes the FP8 copy and its transpose, or a BF16 layer's BF16 copy, in the
  // AdamW pass.
  virtual void adamw_update_weight(float* params, float* m, float* v, const float* grads, int64_t OC,
                                   int64_t C, float learning_rate, float beta1, float beta2, float eps,
                                   float weight_decay, int64_t step, float grad_scale,
                                   std::unique_ptr<WeightCopy>& copy, LinearExecution& exec) {
    adamw_update(params, m, v, grads, OC * C, learning_rate, beta1, beta2, eps, weight_decay, step,
                 grad_scale);
    prepare_weight(copy, params, OC, C, exec);
  }
  // adamw_update_weight on each of `weights` (linear layers' weights at their offsets in the four tensors;
  // they must not overlap): the same results as one call per weight. A GPU backend updates the weights whose
  // FP8 copies it writes in one launch across them all.
  struct WeightUpdate {
    int64_t offset = 0;
    int64_t rows = 0;  // OC
    int64_t cols = 0;  // C
    float weight_decay = 0.0f;
    std::unique_ptr<WeightCopy>* copy = nullptr;
    LinearExecution* exec = nullptr;
    // Where the weight's gradient is: at grad_offset in grads (-1: at offset), or, where grads_bf16 is set,
    // there, stored as bf16 (weight_gradient_type), read as its float32 values.
    int64_t grad_offset = -1;
    const void* grads_bf16 = nullptr;
    int64_t grad_at() const { return grad_offset < 0 ? offset : grad_offset; }
  };
  virtual void adamw_update_weights(float* params, float* m, float* v, const float* grads,
                                    std::span<const WeightUpdate> weights, float learning_rate, float beta1,
                                    float beta2, float eps, int64_t step, float grad_scale) {
    for (const WeightUpdate& w : weights) {
      require_f32_gradient(w);
      adamw_update_weight(params + w.offset, m + w.offset, v + w.offset, grads + w.grad_at(), w.rows, w.cols,
                          learning_rate, beta1, beta2, eps, w.weight_decay, step, grad_scale, *w.copy,
                          *w.exec);
    }
  }

 protected:
  // Refuses a bf16 weight gradient (WeightUpdate::grads_bf16) where a backend's update reads float32 only.
  void require_f32_gradient(const WeightUpdate& w) const;
};

}  // namespace octet
