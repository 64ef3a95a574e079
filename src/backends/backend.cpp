// The names of the backend's op kinds, the size checks its backends share, and the default implementations
// of its optional ops.
#include "octet/backend/backend.h"

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

void Backend::require_f32_gradient(const WeightUpdate& w) const {
  OCTET_CHECK(w.grads_bf16 == nullptr, "backend {}: a weight gradient is stored in f32 only, asked for bf16",
              name());
}

}  // namespace octet
