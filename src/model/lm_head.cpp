// The LM head's chunk (lm_head.h) on the backend's ops: linear_forward, round_in_place where the backend
// keeps BF16-rounded logits in float32, softmax_cross_entropy, linear_backward.
#include "lm_head.h"

#include "octet/check.h"

namespace octet {

Dtype lm_head_logits_type(const Backend& backend, const LinearExecution& exec) {
  if (!logits_in_bf16(exec)) return Dtype::f32;
  const Dtype type = backend.storage_type({.role = StorageRole::logits, .layer = &exec});
  OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "logits stored in f32 or bf16, got {}",
              dtype_name(type));
  return type;
}

void lm_head_chunk(Backend& backend, const LmHeadChunk& chunk, LinearExecution& exec) {
  const int64_t n = chunk.inp.rows(), Vp = chunk.weight.rows();
  const Dtype type = lm_head_logits_type(backend, exec);
  // A BF16 backend's GEMM writes the rounded logits itself, its loss writes their gradient back in BF16 and
  // its backward GEMMs read that as it is; otherwise the float32 logits are rounded here.
  const TensorView logits(chunk.logits, type, {n, Vp});
  backend.linear_forward(logits, chunk.inp, chunk.weight, chunk.copy, {}, exec, chunk.input);
  if (logits_in_bf16(exec) && type == Dtype::f32) {
    backend.round_in_place(static_cast<float*>(chunk.logits), n * Vp, Dtype::bf16);
  }
  backend.softmax_cross_entropy(chunk.losses, logits, chunk.targets, chunk.V, chunk.dloss);
  if (chunk.dloss == 0.0f) return;
  const Fp8Tensor* input_codes = chunk.input.tensor != nullptr ? chunk.input.tensor->get() : nullptr;
  backend.linear_backward(chunk.dinp, chunk.dweight, nullptr, logits, chunk.inp, chunk.weight, chunk.copy,
                          exec, input_codes, chunk.gradient);
}

}  // namespace octet
