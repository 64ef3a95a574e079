// The names of the backend's op kinds, the size checks its backends share, the default implementations of
// its optional ops, and the checks of an op's arguments that every backend makes alike.
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

void check_fp8_operand(std::string_view op, const Fp8Tensor* tensor, const LinearExecution& exec,
                       TensorRole role, int64_t rows, int64_t cols) {
  const bool input = role == TensorRole::activation;
  const Fp8TensorView v = tensor != nullptr ? tensor->view() : Fp8TensorView{};
  const ScalingState* state = exec.state == nullptr ? nullptr : input ? &exec.state->activation
                                                                      : &exec.state->gradient;
  OCTET_CHECK(tensor != nullptr && state != nullptr && v.role == role && v.state == state &&
                  v.shape == Shape({rows, cols}),
              "{}: the FP8 cast of this layer's {} [{}, {}], given {}", op, input ? "input" : "output gradient",
              rows, cols,
              tensor == nullptr ? std::string("none") : fmt::format("a cast of shape {}", v.shape.to_string()));
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

EmbeddingSizes embedding_sizes(std::string_view op, const Shape& out, std::string_view out_name,
                               const Shape& table, const Shape& positions, bool has_positions) {
  OCTET_CHECK(out.rank() == 3, "{}: {} is [B, T, C], given {}", op, out_name, out.to_string());
  OCTET_CHECK(table.rank() == 2, "{}: the table is [V, C], given {}", op, table.to_string());
  const EmbeddingSizes s{out[0], out[1], out[2], table[0]};
  check_shape(op, "table", table, {s.V, s.C});
  if (has_positions) check_shape(op, "positions", positions, {s.T, s.C});
  return s;
}

LossSizes loss_sizes(std::string_view op, const Shape& logits, int64_t V) {
  OCTET_CHECK(logits.rank() == 2, "{}: logits are [N, Vp], given {}", op, logits.to_string());
  const LossSizes s{logits[0], logits[1]};
  OCTET_CHECK(V >= 1 && V <= s.Vp, "{}: the vocabulary V is 1 .. Vp = {} (the logits' row), given {}", op,
              s.Vp, V);
  return s;
}

void Backend::check_segments(std::span<const UpdateSegment> segments, bool bf16_gradients) const {
  for (const UpdateSegment& s : segments) {
    OCTET_CHECK(s.offset >= 0 && s.count >= 0, "backend {}: an optimizer segment at {} of {} elements",
                name(), s.offset, s.count);
    if (!s.is_weight()) {
      OCTET_CHECK(s.grads_bf16 == nullptr, "backend {}: a bf16 gradient only for a weight, the segment at {}",
                  name(), s.offset);
      continue;
    }
    OCTET_CHECK(s.exec != nullptr && s.bias_of == nullptr,
                "backend {}: the weight at {} with its layer's execution, and not a bias", name(), s.offset);
    OCTET_CHECK(s.rows >= 0 && s.cols >= 0 && s.rows * s.cols == s.count,
                "backend {}: the weight at {} of [{}, {}] covers its {} elements", name(), s.offset, s.rows,
                s.cols, s.count);
    OCTET_CHECK(bf16_gradients || s.grads_bf16 == nullptr,
                "backend {}: a weight gradient is stored in f32 only, asked for bf16", name());
  }
}

}  // namespace octet
