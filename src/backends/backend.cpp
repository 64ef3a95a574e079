// The names of the backend's op kinds and the default implementations of its optional ops.
#include "octet/backend/backend.h"

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

std::string_view normalization_name(Normalization kind) {
  switch (kind) {
    case Normalization::layernorm:
      return "layernorm";
  }
  return "unknown";
}

std::string_view activation_name(Activation kind) {
  switch (kind) {
    case Activation::gelu:
      return "gelu";
  }
  return "unknown";
}

std::string_view fusion_name(Fusion fusion) {
  switch (fusion) {
    case Fusion::input_cast:
      return "input_cast";
    case Fusion::gradient_cast:
      return "gradient_cast";
    case Fusion::residual_add:
      return "residual_add";
  }
  return "unknown";
}

std::string separate_passes(Fusion fusion) {
  switch (fusion) {
    case Fusion::input_cast:
      return "the producer writes its output, then the FP8 cast reads it in a pass of its own";
    case Fusion::gradient_cast:
      return "the producer writes the gradient, then the bias sum and the FP8 cast read it in passes of "
             "their own";
    case Fusion::residual_add:
      return "the GEMM writes the layer's output, then a residual add reads it in a pass of its own";
  }
  return "separate passes";
}

FusionSupport Backend::supports(Fusion fusion, const LinearExecution& /*layer*/) const {
  return {false, fmt::format("the {} backend runs each op in passes of its own: {}", name(),
                             separate_passes(fusion))};
}

LinearSizes linear_sizes(std::string_view op, const Shape& inp, const Shape& weight, const Shape& out,
                         std::string_view out_name) {
  const LinearSizes s{inp.rows(), inp.cols(), weight.rows()};
  check_matrix(op, "weight", weight, s.OC, s.C);
  check_matrix(op, out_name, out, s.N, s.OC);
  return s;
}

AttentionSizes attention_sizes(std::string_view op, const Shape& qkv, const Shape& out) {
  OCTET_CHECK(qkv.rank() == 3, "{}: qkv is [B, T, 3C], given {}", op, qkv.to_string());
  const AttentionSizes s{qkv[0], qkv[1], out.cols()};
  check_shape(op, "qkv", qkv, {s.B, s.T, 3 * s.C});
  check_shape(op, "out", out, {s.B, s.T, s.C});
  return s;
}

void Backend::lm_head_chunk(float* losses, float* logits, const int32_t* targets, float* dinp, float* dweight,
                            const float* inp, const float* weight, const WeightCopy* copy, int64_t n,
                            int64_t C, int64_t V, int64_t Vp, float dloss, LinearExecution& exec) {
  const ConstTensorView w(weight, {Vp, C});
  const ConstTensorView x(inp, {n, C});
  std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
  linear_forward(TensorView(logits, {n, Vp}), x, w, copy, {}, exec, {&input_codes});
  if (logits_in_bf16(exec)) round_in_place(logits, n * Vp, Dtype::bf16);
  softmax_cross_entropy(losses, logits, targets, n, V, Vp, dloss);
  if (dloss != 0.0f) {
    linear_backward(TensorView(dinp, {n, C}), TensorView(dweight, {Vp, C}), nullptr,
                    ConstTensorView(logits, {n, Vp}), x, w, copy, exec, input_codes.get(), {&gradient_codes});
  }
}

void Backend::require_f32_gradient(const WeightUpdate& w) const {
  OCTET_CHECK(w.grads_bf16 == nullptr, "backend {}: a weight gradient is stored in f32 only, asked for bf16",
              name());
}

}  // namespace octet
