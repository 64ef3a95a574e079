// The names of the backend's op kinds, the size checks its backends share, the default implementations of
// its optional ops, and the checks of an op's arguments that every backend makes alike.
#include "octet/backend/backend.h"

#include <algorithm>
#include <bit>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

std::string_view normalization_name(Normalization kind) {
  switch (kind) {
    case Normalization::layernorm:
      return "layernorm";
    case Normalization::rmsnorm:
      return "rmsnorm";
  }
  return "unknown";
}

std::string_view activation_name(Activation kind) {
  switch (kind) {
    case Activation::gelu:
      return "gelu";
    case Activation::swiglu:
      return "swiglu";
  }
  return "unknown";
}

int64_t activation_inputs(Activation kind) {
  return kind == Activation::swiglu ? 2 : 1;
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

void MagnitudeCounts::add(std::span<const float> x) {
  values += static_cast<int64_t>(x.size());
  for (const float v : x) {
    const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu;
    if (magnitude == 0) {
      ++zeros;
    } else if (magnitude >= 0x7F800000u) {  // Inf and NaN
      ++non_finite;
    } else {
      ++bins[magnitude >> (23 - kMantissaBits)];
      amax = std::max(amax, std::bit_cast<float>(magnitude));
    }
  }
}

void MagnitudeCounts::add(const MagnitudeCounts& other) {
  for (size_t b = 0; b < kBins; ++b) bins[b] += other.bins[b];
  values += other.values;
  zeros += other.zeros;
  non_finite += other.non_finite;
  amax = std::max(amax, other.amax);
}

void Backend::count_magnitudes(MagnitudeCounts& counts, const ConstTensorView& x) {
  const auto n = static_cast<size_t>(x.numel());
  if (n == 0) return;
  OCTET_CHECK(x.has_data(), "count_magnitudes: a view with data");
  std::vector<float> values(n);
  if (x.dtype == Dtype::f32) {
    copy_to_host(values.data(), x.data, n * sizeof(float));
  } else {
    OCTET_CHECK(x.dtype == Dtype::bf16, "count_magnitudes: x in f32 or bf16, got {}", dtype_name(x.dtype));
    std::vector<uint16_t> bits(n);
    copy_to_host(bits.data(), x.data, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; ++i) values[i] = std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16);
  }
  counts.add(values);
}

FusionSupport Backend::supports(Fusion fusion, const LinearExecution& /*layer*/) const {
  return {false, fmt::format("the {} backend runs each op in passes of its own: {}", name(),
                             separate_passes(fusion))};
}

void check_fp8_operand(std::string_view op, const Fp8Tensor* tensor, const LinearExecution& exec,
                       TensorRole role, int64_t rows, int64_t cols) {
  const bool input = role == TensorRole::activation;
  const Fp8TensorView v = tensor != nullptr ? tensor->view() : Fp8TensorView{};
  const ScalingState* state = exec.state == nullptr ? nullptr
                              : input               ? &exec.state->activation
                                                    : &exec.state->gradient;
  OCTET_CHECK(
      tensor != nullptr && state != nullptr && v.role == role && v.state == state &&
          v.shape == Shape({rows, cols}),
      "{}: the FP8 cast of this layer's {} [{}, {}], given {}", op, input ? "input" : "output gradient", rows,
      cols, tensor == nullptr ? std::string("none") : fmt::format("a cast of shape {}", v.shape.to_string()));
}

LinearSizes linear_sizes(std::string_view op, const Shape& inp, const Shape& weight, const Shape& out,
                         std::string_view out_name) {
  const LinearSizes s{inp.rows(), inp.cols(), weight.rows()};
  check_matrix(op, "weight", weight, s.OC, s.C);
  check_matrix(op, out_name, out, s.N, s.OC);
  return s;
}

AttentionSizes attention_sizes(std::string_view op, const Shape& qkv, const Shape& out,
                               AttentionHeads heads) {
  OCTET_CHECK(qkv.rank() == 3, "{}: qkv is [B, T, (heads + 2 kv_heads) hs], given {}", op, qkv.to_string());
  OCTET_CHECK(heads.heads >= 1 && heads.kv_heads >= 1 && heads.heads % heads.kv_heads == 0,
              "{}: kv_heads ({}) divides heads ({})", op, heads.kv_heads, heads.heads);
  const int64_t C = out.cols();
  OCTET_CHECK(C % heads.heads == 0, "{}: out's width {} is a multiple of heads ({})", op, C, heads.heads);
  const int64_t hs = C / heads.heads;
  const AttentionSizes s{qkv[0], qkv[1], C, hs, heads.kv_heads * hs, C + 2 * heads.kv_heads * hs};
  check_shape(op, "qkv", qkv, {s.B, s.T, s.qkv_C});
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

RotarySizes rotary_sizes(std::string_view op, const Shape& x, const Shape& table, int64_t heads) {
  OCTET_CHECK(x.rank() == 3, "{}: x is [B, T, W], given {}", op, x.to_string());
  OCTET_CHECK(table.rank() == 2, "{}: the table is [positions, head size], given {}", op, table.to_string());
  const RotarySizes s{x[0], x[1], table[1]};
  OCTET_CHECK(s.hs >= 2 && s.hs % 2 == 0, "{}: the head size (the table's width) is even, given {}", op,
              s.hs);
  OCTET_CHECK(table[0] >= s.T, "{}: the table has a row for each of the {} positions, given {}", op, s.T,
              table.to_string());
  OCTET_CHECK(heads >= 1 && heads * s.hs <= x[2], "{}: {} heads of {} fit in a row of x, given {}", op, heads,
              s.hs, x.to_string());
  return s;
}

int64_t activation_width(std::string_view op, Activation kind, const Shape& inp) {
  const int64_t k = activation_inputs(kind);
  OCTET_CHECK(inp.cols() % k == 0, "{}: {}'s input is [N, {} C], given {}", op, activation_name(kind), k,
              inp.to_string());
  return inp.cols() / k;
}

void check_normalization_arguments(std::string_view op, Normalization kind, const float* mean,
                                   const float* bias) {
  const bool layernorm = kind == Normalization::layernorm;
  OCTET_CHECK(layernorm == (mean != nullptr) && layernorm == (bias != nullptr), "{}: {} takes {}", op,
              normalization_name(kind), layernorm ? "a mean and a bias" : "no mean and no bias");
}

RoutingSizes routing_sizes(std::string_view op, const Shape& probs, int64_t k) {
  OCTET_CHECK(probs.rank() == 2, "{}: router probabilities are [N, E], given {}", op, probs.to_string());
  const RoutingSizes s{probs[0], probs[1]};
  OCTET_CHECK(k >= 1 && k <= s.E, "{}: each token chooses 1 .. E = {} experts, given {}", op, s.E, k);
  return s;
}

LossSizes loss_sizes(std::string_view op, const Shape& logits, int64_t V) {
  OCTET_CHECK(logits.rank() == 2, "{}: logits are [N, Vp], given {}", op, logits.to_string());
  const LossSizes s{logits[0], logits[1]};
  OCTET_CHECK(V >= 1 && V <= s.Vp, "{}: the vocabulary V is 1 .. Vp = {} (the logits' row), given {}", op,
              s.Vp, V);
  return s;
}

void check_row_groups(std::string_view op, const RowGroupCasts& casts, int64_t rows) {
  OCTET_CHECK(casts.offsets.size() == casts.targets.size() + 1, "{}: {} row offsets for {} groups", op,
              casts.offsets.size(), casts.targets.size());
  OCTET_CHECK(casts.offsets.front() == 0 && casts.offsets.back() <= rows,
              "{}: the groups cover rows {} to {} of {}; they start at row 0 and end within those rows", op,
              casts.offsets.front(), casts.offsets.back(), rows);
  for (size_t g = 0; g < casts.targets.size(); ++g) {
    OCTET_CHECK(casts.offsets[g] <= casts.offsets[g + 1], "{}: group {} ends before it begins ({} > {})", op, g,
                casts.offsets[g], casts.offsets[g + 1]);
  }
}

namespace {

// Rows [from, from + rows) of a view, or a view without data of that shape where it has none.
TensorView rows_of(const TensorView& v, int64_t from, int64_t rows) {
  void* data = v.has_data() ? static_cast<char*>(v.data) + storage_bytes(v.dtype, from * v.cols()) : nullptr;
  return {data, v.dtype, {rows, v.cols()}};
}
ConstTensorView rows_of(const ConstTensorView& v, int64_t from, int64_t rows) {
  const void* data =
      v.has_data() ? static_cast<const char*>(v.data) + storage_bytes(v.dtype, from * v.cols()) : nullptr;
  return {data, v.dtype, {rows, v.cols()}};
}

// Calls each(g, from, rows) for every group with rows.
template <typename Each>
void for_each_group(const RowGroupCasts& casts, Each each) {
  for (int64_t g = 0; g < casts.groups(); ++g) {
    const int64_t from = casts.offsets[static_cast<size_t>(g)];
    const int64_t rows = casts.offsets[static_cast<size_t>(g) + 1] - from;
    if (rows > 0) each(casts.targets[static_cast<size_t>(g)], from, rows);
  }
}

}  // namespace

void Backend::gather_rows_grouped(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                                  int64_t divisor, const float* scale, const RowGroupCasts& casts,
                                  TensorRole cast_as) {
  check_row_groups("gather_rows_grouped", casts, out.rows());
  for_each_group(casts, [&](const Fp8CastTarget& target, int64_t from, int64_t rows) {
    gather_rows(rows_of(out, from, rows), src, index + from, divisor, scale, target, cast_as);
  });
}

void Backend::activation_forward_grouped(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                         const RowGroupCasts& casts) {
  check_row_groups("activation_forward_grouped", casts, out.rows());
  for_each_group(casts, [&](const Fp8CastTarget& target, int64_t from, int64_t rows) {
    activation_forward(kind, rows_of(out, from, rows), rows_of(inp, from, rows), target);
  });
}

void Backend::activation_backward_grouped(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                          const ConstTensorView& dout, const RowGroupCasts& casts) {
  check_row_groups("activation_backward_grouped", casts, dinp.rows());
  for_each_group(casts, [&](const Fp8CastTarget& target, int64_t from, int64_t rows) {
    activation_backward(kind, rows_of(dinp, from, rows), rows_of(inp, from, rows), rows_of(dout, from, rows),
                        nullptr, target);
  });
}

void Backend::check_segments(std::span<const UpdateSegment> segments, bool bf16_gradients) const {
  for (const UpdateSegment& s : segments) {
    OCTET_CHECK(s.offset >= 0 && s.count >= 0, "backend {}: an optimizer segment at {} of {} elements",
                name(), s.offset, s.count);
    if (!s.is_weight()) {
      OCTET_CHECK(s.grads_bf16 == nullptr || (bf16_gradients && s.bias_of == nullptr),
                  "backend {}: a bf16 gradient only for (part of) a weight, on a backend that stores it so; "
                  "the segment at {}",
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
