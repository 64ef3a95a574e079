// The CPU backend's tensor entries: each checks its tensors' shapes and dtypes (the CPU stores everything in
// float32: storage_type is f32 for every role) and runs the float32 op, fused with the consumer's cast where
// the caller asks for it.
#include "cpu_backend.h"
#include "octet/check.h"

namespace octet::cpu {

namespace {

constexpr std::initializer_list<Dtype> kF32 = {Dtype::f32};

}  // namespace

void CpuBackend::embedding_forward(const TensorView& out, const int32_t* tokens, const ConstTensorView& table,
                                   const ConstTensorView& positions) {
  check_dtype("embedding_forward", "out", out.dtype, kF32);
  check_dtype("embedding_forward", "table", table.dtype, kF32);
  if (positions.has_data()) check_dtype("embedding_forward", "positions", positions.dtype, kF32);
  const auto [B, T, C, V] = embedding_sizes("embedding_forward", out.shape, "out", table.shape,
                                            positions.shape, positions.has_data());
  embedding_forward(out.f32(), tokens, table.f32(), positions.has_data() ? positions.f32() : nullptr, B, T,
                    C);
}

void CpuBackend::embedding_backward(const TensorView& dtable, const TensorView& dpositions,
                                    const ConstTensorView& dout, const int32_t* tokens) {
  check_dtype("embedding_backward", "dout", dout.dtype, kF32);
  check_dtype("embedding_backward", "dtable", dtable.dtype, kF32);
  if (dpositions.has_data()) check_dtype("embedding_backward", "dpositions", dpositions.dtype, kF32);
  const auto [B, T, C, V] = embedding_sizes("embedding_backward", dout.shape, "dout", dtable.shape,
                                            dpositions.shape, dpositions.has_data());
  embedding_backward(dtable.f32(), dpositions.has_data() ? dpositions.f32() : nullptr, dout.f32(), tokens, B,
                     T, C);
}

void CpuBackend::add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) {
  for (const auto& [what, dtype] :
       {std::pair{"out", out.dtype}, std::pair{"a", a.dtype}, std::pair{"b", b.dtype}}) {
    check_dtype("add", what, dtype, kF32);
  }
  check_shape("add", "b", b.shape, a.shape);
  check_shape("add", "out", out.shape, a.shape);
  add(out.f32(), a.f32(), b.f32(), a.numel());
}

void CpuBackend::softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets,
                                       int64_t V, float dloss) {
  check_dtype("softmax_cross_entropy", "logits", logits.dtype, kF32);
  const auto [N, Vp] = loss_sizes("softmax_cross_entropy", logits.shape, V);
  softmax_cross_entropy(losses, logits.f32(), targets, N, V, Vp, dloss);
}

void CpuBackend::normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                                       const ConstTensorView& inp, const float* weight, const float* bias,
                                       const Fp8CastTarget& cast_for) {
  check_dtype("normalization_forward", "inp", inp.dtype, kF32);
  check_dtype("normalization_forward", "out", out.dtype, kF32);
  check_normalization_arguments("normalization_forward", kind, mean, bias);
  const int64_t N = inp.rows(), C = inp.cols();
  check_matrix("normalization_forward", "out", out.shape, N, C);
  if (cast_for.given()) {
    normalize_cast(kind, out.f32(), mean, rstd, inp.f32(), weight, bias, N, C, *cast_for.layer,
                   cast_for.tensor);
  } else {
    normalize(kind, out.f32(), mean, rstd, inp.f32(), weight, bias, N, C);
  }
}

void CpuBackend::normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                                        const ConstTensorView& dout, const float* inp, const float* weight,
                                        const float* mean, const float* rstd) {
  check_dtype("normalization_backward", "dout", dout.dtype, kF32);
  check_normalization_arguments("normalization_backward", kind, mean, dbias);
  if (kind == Normalization::rmsnorm) {
    rmsnorm_backward(dinp, dweight, dout.f32(), inp, weight, rstd, dout.rows(), dout.cols());
  } else {
    layernorm_backward(dinp, dweight, dbias, dout.f32(), inp, weight, mean, rstd, dout.rows(), dout.cols());
  }
}

void CpuBackend::activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                    const Fp8CastTarget& cast_for) {
  check_dtype("activation_forward", "inp", inp.dtype, kF32);
  check_dtype("activation_forward", "out", out.dtype, kF32);
  const int64_t N = inp.rows(), C = activation_width("activation_forward", kind, inp.shape);
  check_matrix("activation_forward", "out", out.shape, N, C);
  if (cast_for.given()) {
    activate_cast(kind, out.f32(), inp.f32(), N, C, *cast_for.layer, cast_for.tensor);
  } else {
    activate(kind, out.f32(), inp.f32(), N, C);
  }
}

void CpuBackend::activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                     const ConstTensorView& dout, float* dbias,
                                     const Fp8CastTarget& cast_for) {
  check_dtype("activation_backward", "inp", inp.dtype, kF32);
  check_dtype("activation_backward", "dout", dout.dtype, kF32);
  check_dtype("activation_backward", "dinp", dinp.dtype, kF32);
  const int64_t N = inp.rows(), C = activation_width("activation_backward", kind, inp.shape);
  check_matrix("activation_backward", "dout", dout.shape, N, C);
  check_matrix("activation_backward", "dinp", dinp.shape, N, inp.cols());
  if (cast_for.given()) {
    activate_backward_cast(kind, dinp.f32(), inp.f32(), dout.f32(), N, C, dbias, *cast_for.layer,
                           cast_for.tensor);
  } else {
    OCTET_CHECK(dbias == nullptr, "activation_backward sums a bias gradient only with the consumer's cast");
    activate_backward(kind, dinp.f32(), inp.f32(), dout.f32(), N, C);
  }
}

void CpuBackend::linear_forward(const TensorView& out, const ConstTensorView& inp,
                                const ConstTensorView& weight, const WeightCopy* copy,
                                const Epilogue& epilogue, LinearExecution& exec, const Fp8Operand& input) {
  check_dtype("linear_forward", "inp", inp.dtype, kF32);
  check_dtype("linear_forward", "out", out.dtype, kF32);
  const auto [N, C, OC] = linear_sizes("linear_forward", inp.shape, weight.shape, out.shape, "out");
  linear_forward(out.f32(), inp.f32(), weight.f32(), copy, epilogue.bias, N, C, OC, exec, input);
  if (epilogue.residual != nullptr) add(out.f32(), epilogue.residual, out.f32(), N * OC);
}

void CpuBackend::linear_recompute(const TensorView& out, const ConstTensorView& weight,
                                  const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                                  const Fp8Tensor& input) {
  check_dtype("linear_recompute", "out", out.dtype, kF32);
  const int64_t N = out.rows(), C = weight.cols(), OC = weight.rows();
  check_matrix("linear_recompute", "out", out.shape, N, OC);
  linear_recompute(out.f32(), copy, epilogue.bias, N, C, OC, exec, input);
  if (epilogue.residual != nullptr) add(out.f32(), epilogue.residual, out.f32(), N * OC);
}

void CpuBackend::linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                                 const ConstTensorView& dout, const ConstTensorView& inp,
                                 const ConstTensorView& weight, const WeightCopy* copy, LinearExecution& exec,
                                 const Fp8Tensor* input, const Fp8Operand& gradient) {
  check_dtype("linear_backward", "dinp", dinp.dtype, kF32);
  check_dtype("linear_backward", "dweight", dweight.dtype, kF32);
  check_dtype("linear_backward", "dout", dout.dtype, kF32);
  check_dtype("linear_backward", "inp", inp.dtype, kF32);
  const auto [N, C, OC] = linear_sizes("linear_backward", inp.shape, weight.shape, dout.shape, "dout");
  check_matrix("linear_backward", "dweight", dweight.shape, OC, C);
  check_matrix("linear_backward", "dinp", dinp.shape, N, C);
  linear_backward(dinp.f32(), dweight.f32(), dbias, dout.f32(), inp.f32(), weight.f32(), copy, N, C, OC, exec,
                  input, gradient);
}

void CpuBackend::attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                                   AttentionHeads heads) {
  check_dtype("attention_forward", "qkv", qkv.dtype, kF32);
  check_dtype("attention_forward", "out", out.dtype, kF32);
  attention_forward(out.f32(), lse, qkv.f32(),
                    attention_sizes("attention_forward", qkv.shape, out.shape, heads), heads);
}

void CpuBackend::attention_backward(const TensorView& dqkv, const ConstTensorView& dout,
                                    const ConstTensorView& qkv, const ConstTensorView& out, const float* lse,
                                    AttentionHeads heads) {
  for (const auto& [what, dtype] : {std::pair{"dqkv", dqkv.dtype}, std::pair{"dout", dout.dtype},
                                    std::pair{"qkv", qkv.dtype}, std::pair{"out", out.dtype}}) {
    check_dtype("attention_backward", what, dtype, kF32);
  }
  const AttentionSizes s = attention_sizes("attention_backward", qkv.shape, out.shape, heads);
  check_shape("attention_backward", "dqkv", dqkv.shape, qkv.shape);
  check_shape("attention_backward", "dout", dout.shape, out.shape);
  attention_backward(dqkv.f32(), dout.f32(), qkv.f32(), out.f32(), lse, s, heads);
}

void CpuBackend::rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                                  bool inverse) {
  check_dtype("rotary_embedding", "x", x.dtype, kF32);
  check_dtype("rotary_embedding", "table", table.dtype, kF32);
  const auto [B, T, hs] = rotary_sizes("rotary_embedding", x.shape, table.shape, heads);
  const int64_t W = x.shape[2], half = hs / 2;
  float* data = x.f32();
  const float* cos_sin = table.f32();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* cos = cos_sin + t * hs;
      const float* sin = cos + half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = data + (b * T + t) * W + h * hs;
        for (int64_t i = 0; i < half; ++i) {
          const float s = inverse ? -sin[i] : sin[i];
          const float x1 = v[i], x2 = v[half + i];
          v[i] = x1 * cos[i] - x2 * s;
          v[half + i] = x2 * cos[i] + x1 * s;
        }
      }
    }
  }
}

}  // namespace octet::cpu
