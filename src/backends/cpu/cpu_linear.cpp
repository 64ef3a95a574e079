// Linear layers on the CPU in every GEMM mode: float32; BF16 or FP16 operands with float32 accumulation (the
// operands rounded as the GPU stores them); FP8 operands cast by the layer's scaling recipe and multiplied by
// the numerics core's emulated FP8 GEMM. Every GEMM's output is its float32 result: the forward adds the bias
// to it, rounded to the GEMM's 16-bit type first in BF16, FP16 and FP8 modes (BF16 for FP8), as the GPU's
// GEMM epilogue adds it, and nothing is rounded afterwards.
#include <cmath>
#include <utility>
#include <vector>

#include "cpu_backend.h"
#include "octet/check.h"
#include "octet/numerics/fp8_gemm.h"

#if defined(OCTET_HAVE_BLAS)
#include <cblas.h>
#endif

namespace octet::cpu {
namespace {

// C [M, N] = op(A) op(B) (+ C when accumulate); op(A) is [M, K], op(B) is [K, N]; row-major.
void sgemm(bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const float* a,
           const float* b, float* c, bool accumulate) {
#if defined(OCTET_HAVE_BLAS)
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), 1.0f, a,
              static_cast<int>(transpose_a ? M : K), b, static_cast<int>(transpose_b ? K : N),
              accumulate ? 1.0f : 0.0f, c, static_cast<int>(N));
#else
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < K; ++p) {
        const float x = transpose_a ? a[p * M + i] : a[i * K + p];
        const float y = transpose_b ? b[j * K + p] : b[p * N + j];
        acc += x * y;
      }
      c[i * N + j] = accumulate ? c[i * N + j] + acc : acc;
    }
  }
#endif
}

Dtype storage_of(GemmMode m) {
  return m == GemmMode::f16 ? Dtype::f16 : Dtype::bf16;
}

// Rounds to BF16 or FP16 and back with the bit-level forms of minifloat.h (the hot path of the emulation).
void round_into(const float* x, float* out, int64_t n, Dtype d) {
  if (d == Dtype::f16) {
    for (int64_t i = 0; i < n; ++i) out[i] = round_to_f16(x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = round_to_bf16(x[i]);
  }
}

// A rounded copy of x in a per-thread scratch buffer (slot 0 or 1; a GEMM needs at most two at once), reused
// from call to call: the LM head's operands are large, and allocating them anew each time costs more than
// the rounding.
const float* rounded(const float* x, int64_t n, Dtype d, int slot = 0) {
  thread_local std::vector<float> scratch[2];
  std::vector<float>& buffer = scratch[slot];
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
  round_into(x, buffer.data(), n, d);
  return buffer.data();
}

std::vector<float> transpose(const float* x, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = x[r * cols + c];
  }
  return t;
}

// The K-major copy of a quantized [rows, cols] tensor's transpose. Per-tensor scales carry over unchanged,
// so the codes are simply transposed; block scales are laid along the other dimension, so the transposed
// values are quantized afresh (block recipes keep no state).
QuantizedTensor transposed(const QuantizedTensor& q, const float* values, TensorRole role,
                           const ScalingRecipe& recipe) {
  if (q.granularity == ScaleGranularity::per_tensor) {
    QuantizedTensor t = q;
    t.rows = q.cols;
    t.cols = q.rows;
    for (int64_t r = 0; r < q.rows; ++r) {
      for (int64_t c = 0; c < q.cols; ++c)
        t.data[static_cast<size_t>(c * q.rows + r)] = q.data[static_cast<size_t>(r * q.cols + c)];
    }
    return t;
  }
  ScalingState unused;
  return quantize(transpose(values, q.rows, q.cols), q.cols, q.rows, q.format, role, recipe, unused);
}

// The CPU's FP8 tensor: the emulated codes of x [rows, cols] with their scales (the transposed codes are
// made where a GEMM reads them: transposed).
struct CpuFp8Tensor final : public Fp8Tensor {
  QuantizedTensor q;
  TensorRole role = TensorRole::activation;
  const ScalingState* state = nullptr;
  Fp8TensorView view() const override {
    Fp8TensorView v;
    v.codes = q.data.empty() ? nullptr : q.data.data();
    v.scale_inv = q.scale_inv.empty() ? nullptr : q.scale_inv.data();
    v.format = q.format;
    if (!q.data.empty()) v.shape = Shape{q.rows, q.cols};
    v.role = role;
    v.granularity = q.granularity;
    v.state = state;
    return v;
  }
};

// The codes a cast left in `tensor` for a GEMM of `exec`'s layer: [rows, cols], cast as `role` of that
// layer.
const QuantizedTensor& cast_codes(const Fp8Tensor* tensor, const LinearExecution& exec, TensorRole role,
                                  int64_t rows, int64_t cols, std::string_view what) {
  check_fp8_operand(what, tensor, exec, role, rows, cols);
  const auto* t = dynamic_cast<const CpuFp8Tensor*>(tensor);
  OCTET_CHECK(t != nullptr, "{}: an FP8 tensor of the CPU backend", what);
  return t->q;
}

// D = A x B^T through the emulated FP8 GEMM (float32 values out); counts the GEMM.
std::vector<float> fp8_product(const QuantizedTensor& a, const QuantizedTensor& b, LinearExecution& exec) {
  Fp8GemmArguments args;
  args.a = &a;
  args.b = &b;
  args.accumulation = blas_available() ? GemmAccumulation::blas : GemmAccumulation::reference;
  GemmOutput out = fp8_gemm(args);
  if (exec.fp8_gemms) *exec.fp8_gemms += 1;
  return std::move(out.values);
}

void count_cast(const QuantizedTensor& q, LinearExecution& exec) {
  if (exec.saturated) *exec.saturated += q.stats.saturated;
  if (exec.underflowed) *exec.underflowed += q.stats.underflowed;
}

// Adds one cast of x [n] to its operand's telemetry (when collected): the counts, and with measure_sqnr the
// signal and noise energies over the finite inputs (noise = x - dequantized).
void record_cast(const QuantizedTensor& q, const float* x, int64_t n,
                 CastTelemetry Fp8LinearTelemetry::*operand, const LinearExecution& exec) {
  if (exec.telemetry == nullptr) return;
  CastTelemetry& t = exec.telemetry->*operand;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += (x[i] != 0.0f && std::isfinite(x[i])) ? 1 : 0;
  t.casts += 1;
  t.elements += n;
  t.nonzero += nonzero;
  t.saturated += q.stats.saturated;
  t.underflowed += q.stats.underflowed;
  if (exec.measure_sqnr) {
    const std::vector<float> back = dequantize(q);
    double signal = 0.0, noise = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(x[i])) continue;
      const double e = static_cast<double>(x[i]) - static_cast<double>(back[static_cast<size_t>(i)]);
      signal += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      noise += e * e;
    }
    t.signal_energy += signal;
    t.noise_energy += noise;
  }
}

void count_other(LinearExecution& exec) {
  if (exec.other_gemms) *exec.other_gemms += 1;
}

// The forward's FP8 cast of its input x [N, C], into the slot the layer's GEMMs read it from.
void cast_input(const float* x, int64_t N, int64_t C, LinearExecution& exec,
                std::unique_ptr<Fp8Tensor>* slot) {
  OCTET_CHECK(exec.recipe != nullptr && exec.state != nullptr, "an FP8 layer with a recipe and a state");
  CpuFp8Tensor& t = fp8_tensor_in<CpuFp8Tensor>(slot, "a linear layer's input");
  ScalingState frozen = exec.state->activation;
  t.q = quantize(std::span<const float>(x, static_cast<size_t>(N * C)), N, C, exec.formats.activation,
                 TensorRole::activation, *exec.recipe, exec.update_scaling ? exec.state->activation : frozen);
  t.role = TensorRole::activation;
  t.state = &exec.state->activation;
  count_cast(t.q, exec);
  record_cast(t.q, x, N * C, &Fp8LinearTelemetry::activation, exec);
}

// The backward's FP8 cast of the output gradient dout [N, OC] into the slot: the gradient's scaling state
// moves on with every cast (the backward never runs with frozen scaling).
void cast_gradient(const float* dout, int64_t N, int64_t OC, LinearExecution& exec,
                   std::unique_ptr<Fp8Tensor>* slot) {
  OCTET_CHECK(exec.recipe != nullptr && exec.state != nullptr, "an FP8 layer with a recipe and a state");
  CpuFp8Tensor& t = fp8_tensor_in<CpuFp8Tensor>(slot, "a linear layer's output gradient");
  t.q = quantize(std::span<const float>(dout, static_cast<size_t>(N * OC)), N, OC, exec.formats.gradient,
                 TensorRole::gradient, *exec.recipe, exec.state->gradient);
  t.role = TensorRole::gradient;
  t.state = &exec.state->gradient;
  count_cast(t.q, exec);
  record_cast(t.q, dout, N * OC, &Fp8LinearTelemetry::gradient, exec);
}

// dbias [OC] += column sums of dout [N, OC], each column summed in row order.
void add_column_sums(float* dbias, const float* dout, int64_t N, int64_t OC) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) dbias[o] += dout[n * OC + o];
  }
}

// out [N, OC] += bias (when not null) as linear_forward adds it: in the 16-bit type of `mode`'s GEMM (BF16
// for FP8 GEMMs), a float32 GEMM's as it is.
void add_forward_bias(float* out, const float* bias, int64_t N, int64_t OC, GemmMode mode) {
  if (bias == nullptr) return;
  const float* b = mode == GemmMode::f32 ? bias : rounded(bias, OC, storage_of(mode));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < OC; ++o) out[n * OC + o] += b[o];
  }
}

// Where a producer writes its output before casting it: `out`, or scratch when the output is not kept.
float* output_or_scratch(float* out, int64_t n) {
  if (out != nullptr) return out;
  thread_local std::vector<float> scratch;
  if (scratch.size() < static_cast<size_t>(n)) scratch.resize(static_cast<size_t>(n));
  return scratch.data();
}

}  // namespace

void CpuBackend::normalize_cast(Normalization kind, float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int64_t N, int64_t C,
                                LinearExecution& consumer, std::unique_ptr<Fp8Tensor>* into) {
  OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
  OCTET_CHECK(out != nullptr || input_cast_suffices(consumer),
              "the output kept for a consumer that reads it");
  float* y = output_or_scratch(out, N * C);
  normalize(kind, y, mean, rstd, inp, weight, bias, N, C);
  cast_input(y, N, C, consumer, into);
}

void CpuBackend::activate_cast(Activation kind, float* out, const float* inp, int64_t N, int64_t C,
                               LinearExecution& consumer, std::unique_ptr<Fp8Tensor>* into) {
  OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
  OCTET_CHECK(out != nullptr || input_cast_suffices(consumer),
              "the output kept for a consumer that reads it");
  float* y = output_or_scratch(out, N * C);
  activate(kind, y, inp, N, C);
  cast_input(y, N, C, consumer, into);
}

void CpuBackend::cast_produced(const float* y, int64_t N, int64_t C, LinearExecution& consumer, TensorRole role,
                               std::unique_ptr<Fp8Tensor>* into) {
  if (role == TensorRole::activation) {
    OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
    cast_input(y, N, C, consumer, into);
  } else {
    OCTET_CHECK(role == TensorRole::gradient && casts_gradient(consumer),
                "a consumer with an FP8 backward GEMM for a produced gradient");
    cast_gradient(y, N, C, consumer, into);
  }
}

// The activation's backward, then linear_backward's bias sum and gradient cast, in that order: the same bits
// as the two ops in turn.
void CpuBackend::activate_backward_cast(Activation kind, float* dinp, const float* inp, const float* dout,
                                        int64_t N, int64_t C, float* dbias, LinearExecution& consumer,
                                        std::unique_ptr<Fp8Tensor>* into) {
  OCTET_CHECK(casts_gradient(consumer), "a consumer with an FP8 backward GEMM");
  OCTET_CHECK(dinp != nullptr || gradient_cast_suffices(consumer),
              "the gradient kept for a consumer that reads it");
  const int64_t width = activation_inputs(kind) * C;
  float* d = output_or_scratch(dinp, N * width);
  activate_backward(kind, d, inp, dout, N, C);
  if (dbias != nullptr) add_column_sums(dbias, d, N, width);
  cast_gradient(d, N, width, consumer, into);
}

void CpuBackend::round_in_place(float* x, int64_t n, Dtype dtype) {
  OCTET_CHECK(dtype == Dtype::bf16 || dtype == Dtype::f16, "round_in_place: bf16 or f16, got {}",
              dtype_name(dtype));
  round_into(x, x, n, dtype);
}

void gemm_abt(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, bool accumulate) {
  sgemm(false, true, M, N, K, a, b, out, accumulate);
}

void CpuBackend::prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                                LinearExecution& exec) {
  auto* cpu_copy = dynamic_cast<CpuWeightCopy*>(copy.get());
  if (cpu_copy == nullptr) {
    copy = std::make_unique<CpuWeightCopy>();
    cpu_copy = static_cast<CpuWeightCopy*>(copy.get());
  }
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  if (any_fp8) {
    OCTET_CHECK(exec.recipe != nullptr && exec.state != nullptr, "an FP8 layer with a recipe and a state");
    const std::span<const float> values(weight, static_cast<size_t>(OC * C));
    if (exec.recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor) {
      exec.state->weight_copy_scale =
          exec.recipe->cast_scale(exec.state->weight, compute_amax(values), exec.formats.weight);
    }
    cpu_copy->fp8 =
        quantize(values, OC, C, exec.formats.weight, TensorRole::weight, *exec.recipe, exec.state->weight);
    count_cast(cpu_copy->fp8, exec);
    record_cast(cpu_copy->fp8, weight, OC * C, &Fp8LinearTelemetry::weight, exec);
    cpu_copy->fp8_transposed = transposed(cpu_copy->fp8, weight, TensorRole::weight, *exec.recipe);
  }
  const GemmMode wide = exec.forward != GemmMode::fp8 ? exec.forward : exec.input_gradient;
  if (wide == GemmMode::bf16 || wide == GemmMode::f16) {
    cpu_copy->rounded.resize(static_cast<size_t>(OC * C));
    round_into(weight, cpu_copy->rounded.data(), OC * C, storage_of(wide));
  } else {
    cpu_copy->rounded.clear();
  }
}

namespace {

void check_weight_part(const Backend::WeightPart& part) {
  OCTET_CHECK(part.copy != nullptr && part.exec != nullptr && part.exec->recipe != nullptr &&
                  part.exec->state != nullptr && part.exec->forward == GemmMode::fp8 &&
                  part.exec->input_gradient == GemmMode::fp8 &&
                  part.exec->recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor &&
                  0 <= part.begin && part.begin <= part.end && part.end <= part.rows * part.cols,
              "a part {}..{} of a [{}, {}] weight whose GEMMs are all FP8 with one scale per tensor",
              part.begin, part.end, part.rows, part.cols);
}

}  // namespace

void CpuBackend::weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) {
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightPart& p = parts[i];
    check_weight_part(p);
    amaxes[i] = compute_amax(std::span<const float>(p.weight + p.begin, static_cast<size_t>(p.end - p.begin)));
  }
}

void CpuBackend::cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) {
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightPart& p = parts[i];
    check_weight_part(p);
    LinearExecution& exec = *p.exec;
    const Dtype format = exec.formats.weight;
    // As quantize() casts the whole weight, with the whole weight's amax.
    const float scale = exec.recipe->cast_scale(exec.state->weight, amaxes[i], format);
    exec.state->weight_copy_scale = scale;
    const std::span<const float> values(p.weight + p.begin, static_cast<size_t>(p.end - p.begin));
    const QuantizedTensor part = quantize_with_scale(values, 1, p.end - p.begin, format, scale);
    exec.recipe->update(exec.state->weight, amaxes[i], format);
    std::copy(part.data.begin(), part.data.end(), codes + (p.codes_offset + p.begin));
    count_cast(part, exec);
    record_cast(part, values.data(), p.end - p.begin, &Fp8LinearTelemetry::weight, exec);
  }
}

void CpuBackend::weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) {
  for (const WeightPart& p : parts) {
    check_weight_part(p);
    auto* cpu_copy = dynamic_cast<CpuWeightCopy*>(p.copy->get());
    if (cpu_copy == nullptr) {
      *p.copy = std::make_unique<CpuWeightCopy>();
      cpu_copy = static_cast<CpuWeightCopy*>(p.copy->get());
    }
    QuantizedTensor& q = cpu_copy->fp8;
    q = QuantizedTensor{};
    q.format = p.exec->formats.weight;
    q.rows = p.rows;
    q.cols = p.cols;
    q.granularity = ScaleGranularity::per_tensor;
    q.data.assign(codes + p.codes_offset, codes + (p.codes_offset + p.rows * p.cols));
    q.scale_inv = {1.0f / p.exec->state->weight_copy_scale};  // as quantize_with_scale stores it
    q.amax = p.exec->state->weight.last_amax;
    cpu_copy->fp8_transposed = transposed(q, nullptr, TensorRole::weight, *p.exec->recipe);
    cpu_copy->rounded.clear();
  }
}

void CpuBackend::weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) {
  for (const WeightPart& p : parts) {
    check_weight_part(p);
    const auto* cpu_copy = dynamic_cast<const CpuWeightCopy*>(p.copy->get());
    OCTET_CHECK(cpu_copy != nullptr && cpu_copy->fp8.rows == p.rows && cpu_copy->fp8.cols == p.cols &&
                    cpu_copy->fp8.data.size() == static_cast<size_t>(p.rows * p.cols),
                "the FP8 copy of a [{}, {}] weight to take its codes from", p.rows, p.cols);
    std::copy(cpu_copy->fp8.data.begin() + p.begin, cpu_copy->fp8.data.begin() + p.end,
              codes + (p.codes_offset + p.begin));
  }
}

void CpuBackend::release_weight_copies(std::span<const WeightPart> parts) {
  for (const WeightPart& p : parts) {
    check_weight_part(p);
    auto* cpu_copy = dynamic_cast<CpuWeightCopy*>(p.copy->get());
    if (cpu_copy == nullptr) continue;
    // Empty tensors: the GEMMs check for a copy's codes, so a read of a released copy fails.
    cpu_copy->fp8 = QuantizedTensor{};
    cpu_copy->fp8_transposed = QuantizedTensor{};
  }
}

void CpuBackend::linear_forward(float* out, const float* inp, const float* weight, const WeightCopy* copy,
                                const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                                const Fp8Operand& input) {
  const auto* w = dynamic_cast<const CpuWeightCopy*>(copy);
  switch (exec.forward) {
    case GemmMode::f32:
      sgemm(false, true, N, OC, C, inp, weight, out, false);
      count_other(exec);
      break;
    case GemmMode::bf16:
    case GemmMode::f16: {
      OCTET_CHECK(w != nullptr && !w->rounded.empty(), "a rounded weight copy (prepare_weight)");
      const Dtype d = storage_of(exec.forward);
      sgemm(false, true, N, OC, C, rounded(inp, N * C, d), w->rounded.data(), out, false);
      count_other(exec);
      break;
    }
    case GemmMode::fp8: {
      OCTET_CHECK(w != nullptr && !w->fp8.data.empty(), "an FP8 weight copy (prepare_weight)");
      OCTET_CHECK(input.tensor != nullptr, "a slot for the FP8 input's cast");
      if (!input.cast_by_producer) cast_input(inp, N, C, exec, input.tensor);
      const QuantizedTensor& x =
          cast_codes(input.tensor->get(), exec, TensorRole::activation, N, C, "linear_forward");
      const std::vector<float> d = fp8_product(x, w->fp8, exec);
      std::copy(d.begin(), d.end(), out);
      break;
    }
  }
  add_forward_bias(out, bias, N, OC, exec.forward);
}

void CpuBackend::linear_recompute(float* out, const WeightCopy* copy, const float* bias, int64_t N, int64_t C,
                                  int64_t OC, LinearExecution& exec, const Fp8Tensor& input) {
  const auto* w = dynamic_cast<const CpuWeightCopy*>(copy);
  OCTET_CHECK(exec.forward == GemmMode::fp8 && exec.keep_input_codes && w != nullptr && w->fp8.rows == OC,
              "an FP8 forward of [{}, {}] x [{}, {}]^T whose input codes were kept", N, C, OC, C);
  const QuantizedTensor& x = cast_codes(&input, exec, TensorRole::activation, N, C, "linear_recompute");
  int64_t* const counted = std::exchange(exec.fp8_gemms, nullptr);
  const std::vector<float> d = fp8_product(x, w->fp8, exec);
  exec.fp8_gemms = counted;
  std::copy(d.begin(), d.end(), out);
  add_forward_bias(out, bias, N, OC, exec.forward);
}

void CpuBackend::linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const WeightCopy* copy, int64_t N,
                                 int64_t C, int64_t OC, LinearExecution& exec, const Fp8Tensor* input,
                                 const Fp8Operand& gradient) {
  const auto* w = dynamic_cast<const CpuWeightCopy*>(copy);
  const bool fp8 = casts_gradient(exec);
  check_gradient_cast(exec, gradient.cast_by_producer, dout, dbias);
  if (dbias != nullptr) add_column_sums(dbias, dout, N, OC);
  const QuantizedTensor* dy_codes = nullptr;
  if (fp8) {
    OCTET_CHECK(gradient.tensor != nullptr, "linear_backward: a slot for the FP8 output gradient's cast");
    if (!gradient.cast_by_producer) cast_gradient(dout, N, OC, exec, gradient.tensor);
    dy_codes = &cast_codes(gradient.tensor->get(), exec, TensorRole::gradient, N, OC, "linear_backward");
  }
  static const QuantizedTensor kNoCast;
  const QuantizedTensor& dy = fp8 ? *dy_codes : kNoCast;

  // Input gradient: dinp [N, C] = dout [N, OC] x W [OC, C].
  switch (exec.input_gradient) {
    case GemmMode::f32:
      sgemm(false, false, N, C, OC, dout, weight, dinp, false);
      count_other(exec);
      break;
    case GemmMode::bf16:
    case GemmMode::f16: {
      const Dtype d = storage_of(exec.input_gradient);
      sgemm(false, false, N, C, OC, rounded(dout, N * OC, d), w->rounded.data(), dinp, false);
      count_other(exec);
      break;
    }
    case GemmMode::fp8: {
      OCTET_CHECK(w != nullptr && w->fp8_transposed.rows == C && w->fp8_transposed.cols == OC,
                  "an FP8 weight copy (prepare_weight) of a [{}, {}] weight", OC, C);
      // K-major operands: A = dy [N, OC], B = W^T [C, OC].
      const std::vector<float> d = fp8_product(dy, w->fp8_transposed, exec);
      std::copy(d.begin(), d.end(), dinp);
      break;
    }
  }

  // Weight gradient, accumulated in float32: dweight [OC, C] += dout^T [OC, N] x inp [N, C] (= where
  // exec.accumulate_weight_gradient is false).
  switch (exec.weight_gradient) {
    case GemmMode::f32:
      sgemm(true, false, OC, C, N, dout, inp, dweight, exec.accumulate_weight_gradient);
      count_other(exec);
      break;
    case GemmMode::bf16:
    case GemmMode::f16: {
      const Dtype d = storage_of(exec.weight_gradient);
      sgemm(true, false, OC, C, N, rounded(dout, N * OC, d, 0), rounded(inp, N * C, d, 1), dweight,
            exec.accumulate_weight_gradient);
      count_other(exec);
      break;
    }
    case GemmMode::fp8: {
      const QuantizedTensor& x = cast_codes(input, exec, TensorRole::activation, N, C, "linear_backward");
      // K-major operands: A = dy^T [OC, N], B = x^T [C, N].
      const QuantizedTensor dy_t = transposed(dy, dout, TensorRole::gradient, *exec.recipe);
      const QuantizedTensor x_t = transposed(x, inp, TensorRole::activation, *exec.recipe);
      const std::vector<float> d = fp8_product(dy_t, x_t, exec);
      if (exec.accumulate_weight_gradient) {
        for (size_t i = 0; i < d.size(); ++i) dweight[i] += d[i];
      } else {
        std::copy(d.begin(), d.end(), dweight);
      }
      break;
    }
  }
}

}  // namespace octet::cpu
