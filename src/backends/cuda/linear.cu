// The linear layers' GEMMs: the forward (with its bias and residual in the GEMM's epilogue, its rerun from
// kept FP8 input codes, and a bf16 output such as a BF16 LM head's logits), the backward's input-gradient and
// weight-gradient GEMMs (reading a bf16 output gradient as it is); FP8 GEMMs on FP8 tensor cores or emulated
// through BF16 ones (fp8_gemm), and the operands' 16-bit copies (wide_copy, as_wide) and float32 widenings
// (as_f32).
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {
namespace {

// D [M, N] = D_tmp * sa * sb (+ bias [N]) (or D += ...): the FP8 GEMM's dequantization and epilogue where
// the GEMM ran in BF16 on the codes' values (GPUs without FP8 tensor cores).
__global__ void dequantize_product_kernel(float* d, const float* tmp, int64_t M, int64_t N, const float* sa,
                                          const float* sb, const __nv_bfloat16* bias, bool accumulate) {
  const float s = __fmul_rn(*sa, *sb);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = __fmul_rn(tmp[i], s);
    if (bias != nullptr) v = __fadd_rn(v, __bfloat162float(bias[i % N]));
    d[i] = accumulate ? d[i] + v : v;
  }
}

// FP8 codes to their BF16 values (exact: every E4M3 and E5M2 value is a BF16 value).
__global__ void decode_fp8_kernel(__nv_bfloat16* out, const uint8_t* codes, int64_t n, Dtype format) {
  const MinifloatSpec spec = minifloat_spec(format);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(decode(spec, codes[i]));
  }
}

GemmType wide_type(GemmMode m) {
  return m == GemmMode::f16 ? GemmType::f16 : GemmType::bf16;
}
GemmType fp8_type(Dtype d) {
  return d == Dtype::e5m2 ? GemmType::e5m2 : GemmType::e4m3;
}

}  // namespace

void CudaBackend::fp8_gemm(float* d, const uint8_t* a, Dtype a_format, const float* a_scale_inv,
                           const uint8_t* b, Dtype b_format, const float* b_scale_inv, int64_t M, int64_t N,
                           int64_t K, bool accumulate, bool fast_accumulation, const __nv_bfloat16* bias,
                           __nv_bfloat16* d_bf16, const float* addend) {
  const OpScope scope(*this, OpKind::gemm_fp8);
  OCTET_CHECK(d_bf16 == nullptr || (!emulate_fp8_ && d == nullptr && (bias == nullptr || !accumulate)),
              "a bf16 FP8 GEMM output needs FP8 tensor cores, no float32 output, and no bias where it "
              "accumulates");
  OCTET_CHECK(addend == nullptr || !emulate_fp8_,
              "an addend in the FP8 GEMM's epilogue needs FP8 tensor cores");
  if (!emulate_fp8_) {
    GemmProblem p;
    p.M = M;
    p.N = N;
    p.K = K;
    p.a_type = fp8_type(a_format);
    p.b_type = fp8_type(b_format);
    p.a = a;
    p.b = b;
    p.d = d;
    p.d_bf16 = d_bf16;
    p.accumulate = accumulate;
    p.a_scale_inv = a_scale_inv;
    p.b_scale_inv = b_scale_inv;
    p.fast_accumulation = fast_accumulation;
    p.bias = bias;
    p.bias_type = GemmType::bf16;
    p.addend = addend;
    gemm_->run(p, stream_);
    return;
  }
  // No FP8 tensor cores: the same codes, as BF16 values, through a BF16 GEMM; then the two scales.
  auto* a16 = emulation_[0].as<__nv_bfloat16>(static_cast<size_t>(M * K), stream_);
  auto* b16 = emulation_[1].as<__nv_bfloat16>(static_cast<size_t>(N * K), stream_);
  auto* tmp = emulation_[2].as<float>(static_cast<size_t>(M * N), stream_);
  decode_fp8_kernel<<<blocks_for(M * K), 256, 0, stream_>>>(a16, a, M * K, a_format);
  OCTET_CUDA_CHECK_LAUNCH("decode_fp8_kernel");
  decode_fp8_kernel<<<blocks_for(N * K), 256, 0, stream_>>>(b16, b, N * K, b_format);
  OCTET_CUDA_CHECK_LAUNCH("decode_fp8_kernel");
  GemmProblem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a_type = GemmType::bf16;
  p.b_type = GemmType::bf16;
  p.a = a16;
  p.b = b16;
  p.d = tmp;
  p.accumulate = false;
  gemm_->run(p, stream_);
  dequantize_product_kernel<<<blocks_for(M * N), 256, 0, stream_>>>(d, tmp, M, N, a_scale_inv, b_scale_inv,
                                                                    bias, accumulate);
  OCTET_CUDA_CHECK_LAUNCH("dequantize_product_kernel");
}

const void* CudaBackend::wide_copy(const float* x, int64_t n, GemmMode mode, int slot) {
  const OpScope scope(*this, OpKind::casts);
  if (mode == GemmMode::f16) {
    auto* out = wide_[slot].as<__half>(static_cast<size_t>(n), stream_);
    convert_to_f16(out, x, n, stream_);
    return out;
  }
  auto* out = wide_[slot].as<__nv_bfloat16>(static_cast<size_t>(n), stream_);
  convert_to_bf16(out, x, n, stream_);
  return out;
}

const void* CudaBackend::epilogue_bias(const float* bias, int64_t OC, GemmMode mode, bool bf16_output,
                                       CudaWeightCopy* copy) {
  const bool aligned = reinterpret_cast<uintptr_t>(bias) % 16 == 0;
  if (bias == nullptr || (mode == GemmMode::f32 && aligned && !bf16_output)) return bias;
  const BiasCopy form = bf16_output || mode == GemmMode::fp8 ? BiasCopy::bf16_bits
                        : mode == GemmMode::bf16             ? BiasCopy::bf16_values
                                                             : BiasCopy::none;
  if (copy != nullptr && form != BiasCopy::none) {
    if (copy->bias_current && copy->bias_source == bias && copy->bias_count == OC && copy->bias_form == form)
      return copy->bias.get(0, stream_);
    copy->bias_source = bias;  // made below, into the copy; AdamW keeps it current from its next pass
    copy->bias_count = OC;
    copy->bias_form = form;
    copy->bias_current = false;
  }
  const bool into_copy = copy != nullptr && form != BiasCopy::none;
  const OpScope scope(*this, OpKind::other);
  switch (bf16_output ? GemmMode::fp8 : mode) {
    case GemmMode::f32: {
      auto* out = bias_.as<float>(static_cast<size_t>(OC), stream_);
      const size_t bytes = static_cast<size_t>(OC) * sizeof(float);
      OCTET_CUDA_CHECK(cudaMemcpyAsync(out, bias, bytes, cudaMemcpyDeviceToDevice, stream_));
      return out;
    }
    case GemmMode::bf16:
    case GemmMode::f16: {
      // Rounded to the operands' type, handed over as float32 (what cuBLASLt takes with a float32 output).
      auto* out = (into_copy ? copy->bias : bias_).as<float>(static_cast<size_t>(OC), stream_);
      cuda::round_copy(out, bias, OC, mode == GemmMode::f16 ? Dtype::f16 : Dtype::bf16, stream_);
      return out;
    }
    case GemmMode::fp8:
      break;
  }
  auto* out = (into_copy ? copy->bias : bias_).as<__nv_bfloat16>(static_cast<size_t>(OC), stream_);
  convert_to_bf16(out, bias, OC, stream_);
  return out;
}

// The recomputing GEMM's input: the cast the layer's forward kept, with its codes of x.
const CudaFp8Tensor* CudaBackend::recomputed_input(const Fp8Tensor& input, const LinearExecution& exec,
                                                   int64_t N, int64_t C) {
  OCTET_CHECK(exec.forward == GemmMode::fp8 && exec.keep_input_codes,
              "an FP8 forward whose input codes were kept (keep_input_codes)");
  return &cast_of(&input, exec, TensorRole::activation, N, C, "linear_recompute");
}

void CudaBackend::linear_recompute(float* out, const float* weight, const WeightCopy* copy, const float* bias,
                                   int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                                   const Fp8Tensor& input) {
  forward_gemm(out, nullptr, ConstTensorView(nullptr, Dtype::f32, {N, C}), weight, copy, bias, N, C, OC, exec,
               recomputed_input(input, exec, N, C), true);
}

void CudaBackend::linear_recompute_as(void* out, Dtype out_type, const float* weight, const WeightCopy* copy,
                                      const float* bias, int64_t N, int64_t C, int64_t OC,
                                      LinearExecution& exec, const Fp8Tensor& input) {
  forward_gemm_as(out, out_type, ConstTensorView(nullptr, Dtype::f32, {N, C}), weight, copy, bias, N, C, OC, exec,
                  recomputed_input(input, exec, N, C), true);
}

void CudaBackend::linear_recompute_residual(float* out, const float* residual, const float* weight,
                                            const WeightCopy* copy, const float* bias, int64_t N, int64_t C,
                                            int64_t OC, LinearExecution& exec, const Fp8Tensor& input) {
  if (!supports(Fusion::residual_add, exec).fused) {  // as linear_forward_residual_as: output, then add
    linear_recompute(out, weight, copy, bias, N, C, OC, exec, input);
    add(out, residual, out, N * OC);
    return;
  }
  // The forward's GEMM with the residual as its addend, as linear_forward_residual_as ran it.
  forward_gemm(out, nullptr, ConstTensorView(nullptr, Dtype::f32, {N, C}), weight, copy, bias, N, C, OC, exec,
               recomputed_input(input, exec, N, C), true, residual);
}

const CudaFp8Tensor* CudaBackend::forward_input(const ConstTensorView& inp, const CudaWeightCopy* copy,
                                                LinearExecution& exec, const Fp8Operand& input) {
  const int64_t N = inp.rows(), C = inp.cols();
  if (exec.forward != GemmMode::fp8) return nullptr;
  OCTET_CHECK(copy != nullptr && copy->has_fp8, "an FP8 weight copy (prepare_weight)");
  prepared_layer(exec, copy);
  OCTET_CHECK(input.tensor != nullptr, "linear_forward: a slot for the FP8 input's cast");
  if (!input.cast_by_producer) {
    if (inp.dtype == Dtype::bf16) {
      cast_input_bf16(static_cast<const uint16_t*>(inp.data), N, C, exec, input.tensor);
    } else {
      cast_input(static_cast<const float*>(inp.data), N, C, exec, input.tensor);
    }
  }
  return &cast_of(input.tensor->get(), exec, TensorRole::activation, N, C, "linear_forward");
}

void CudaBackend::linear_forward_as(void* out, Dtype out_type, const void* inp, Dtype inp_type,
                                    const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                                    int64_t C, int64_t OC, LinearExecution& exec, const Fp8Operand& input) {
  check_stored(inp_type, "a linear layer's input");
  const ConstTensorView x(inp, inp_type, {N, C});
  const CudaFp8Tensor* codes = forward_input(x, dynamic_cast<const CudaWeightCopy*>(copy), exec, input);
  forward_gemm_as(out, out_type, x, weight, copy, bias, N, C, OC, exec, codes, false);
}

void CudaBackend::linear_forward_residual_as(float* out, const float* residual, const void* inp,
                                             Dtype inp_type, const float* weight, const WeightCopy* copy,
                                             const float* bias, int64_t N, int64_t C, int64_t OC,
                                             LinearExecution& exec, const Fp8Operand& input) {
  check_stored(inp_type, "a linear layer's input");
  if (!supports(Fusion::residual_add, exec).fused) {
    // The emulated FP8 product is not cuBLASLt's: the layer's output, then the residual add.
    linear_forward_as(out, Dtype::f32, inp, inp_type, weight, copy, bias, N, C, OC, exec, input);
    add(out, residual, out, N * OC);
    return;
  }
  // The residual as the GEMM's addend: the stream is read and written once, in the GEMM's epilogue.
  const ConstTensorView x(inp, inp_type, {N, C});
  const CudaFp8Tensor* codes = forward_input(x, dynamic_cast<const CudaWeightCopy*>(copy), exec, input);
  forward_gemm(out, nullptr, x, weight, copy, bias, N, C, OC, exec, codes, false, residual);
}

void CudaBackend::forward_gemm_as(void* out, Dtype out_type, const ConstTensorView& x, const float* weight,
                                  const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                                  LinearExecution& exec, const CudaFp8Tensor* codes, bool recompute) {
  check_stored(out_type, "a linear layer's output");
  if (out_type == Dtype::f32) {
    forward_gemm(static_cast<float*>(out), nullptr, x, weight, copy, bias, N, C, OC, exec, codes, recompute);
    return;
  }
  auto* out_bf16 = static_cast<__nv_bfloat16*>(out);
  const bool direct = reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                      (exec.forward == GemmMode::bf16 || (exec.forward == GemmMode::fp8 && !emulate_fp8_));
  if (direct) {
    forward_gemm(nullptr, out_bf16, x, weight, copy, bias, N, C, OC, exec, codes, recompute);
    return;
  }
  // Modes whose GEMMs cannot write bf16 (float32, FP16, FP8 without FP8 tensor cores): the float32 result,
  // then rounded to bf16 (to nearest even), as the epilogue's bf16 output rounds it.
  auto* y = producer_output_.as<float>(static_cast<size_t>(N * OC), stream_);
  forward_gemm(y, nullptr, x, weight, copy, bias, N, C, OC, exec, codes, recompute);
  const OpScope scope(*this, OpKind::casts);
  convert_to_bf16(out_bf16, y, N * OC, stream_);
}

const float* CudaBackend::as_f32(const ConstTensorView& x, int slot) {
  if (x.dtype == Dtype::f32 || x.data == nullptr) return static_cast<const float*>(x.data);
  const int64_t n = x.numel();
  const OpScope scope(*this, OpKind::casts);
  auto* out = widened_[slot].as<float>(static_cast<size_t>(n), stream_);
  cuda::convert_from_bf16(out, static_cast<const uint16_t*>(x.data), n, stream_);
  return out;
}

const void* CudaBackend::as_wide(const ConstTensorView& x, GemmMode mode, int slot) {
  if (x.dtype == Dtype::bf16 && mode == GemmMode::bf16 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0) {
    return x.data;
  }
  return wide_copy(as_f32(x, slot), x.numel(), mode, slot);
}

void CudaBackend::forward_gemm(float* out, __nv_bfloat16* out_bf16, const ConstTensorView& inp, const float* weight,
                               const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                               LinearExecution& exec, const CudaFp8Tensor* codes, bool recompute,
                               const float* addend) {
  const auto* w = dynamic_cast<const CudaWeightCopy*>(copy);
  const bool bf16_output = out_bf16 != nullptr;
  // The bias goes into the GEMM's epilogue: the output is written once, in the GEMM.
  const void* gemm_bias = epilogue_bias(bias, OC, exec.forward, bf16_output, const_cast<CudaWeightCopy*>(w));
  GemmProblem p;
  p.M = N;
  p.N = OC;
  p.K = C;
  p.d = out;
  p.d_bf16 = out_bf16;
  p.bias = gemm_bias;
  p.addend = addend;
  switch (exec.forward) {
    case GemmMode::f32:
      p.bias_type = GemmType::f32;
      p.a_type = p.b_type = GemmType::f32;
      p.a = as_f32(inp, 0);
      p.b = weight;
      wide_gemm(p);
      if (exec.other_gemms) *exec.other_gemms += 1;
      break;
    case GemmMode::bf16:
    case GemmMode::f16:
      OCTET_CHECK(w != nullptr && w->has_wide, "a rounded weight copy (prepare_weight)");
      p.a_type = p.b_type = wide_type(exec.forward);
      p.bias_type = bf16_output ? GemmType::bf16 : GemmType::f32;
      p.a = as_wide(inp, exec.forward, 0);
      p.b = const_cast<CudaWeightCopy*>(w)->wide.get(0, stream_);
      wide_gemm(p);
      if (exec.other_gemms) *exec.other_gemms += 1;
      break;
    case GemmMode::fp8: {
      OCTET_CHECK(w != nullptr && w->has_fp8, "an FP8 weight copy (prepare_weight)");
      Layer& layer = prepared_layer(exec, w);
      OCTET_CHECK(codes != nullptr && codes->row_codes != nullptr, "the forward's FP8 input cast");
      // Shared codes are the last cast's: this layer's own, right before its forward GEMM.
      OCTET_CHECK(exec.keep_input_codes ||
                      (!recompute && std::find(input_codes_for_.begin(), input_codes_for_.end(), codes) !=
                                         input_codes_for_.end()),
                  "input codes that this layer's own cast wrote");
      fp8_gemm(out, codes->row_codes, codes->format, codes->scale_inv,
               static_cast<const uint8_t*>(const_cast<CudaWeightCopy*>(w)->fp8.get(0, stream_)),
               exec.formats.weight, &layer.device->weight_scale_inv, N, OC, C, false,
               exec.fast_accumulation_forward, static_cast<const __nv_bfloat16*>(gemm_bias), out_bf16,
               addend);
      if (exec.fp8_gemms && !recompute) *exec.fp8_gemms += 1;
      break;
    }
  }
}

void CudaBackend::linear_backward_as(void* dinp, Dtype dinp_type, void* dweight, Dtype dweight_type,
                                     float* dbias, const void* dout_data, Dtype dout_type,
                                     const void* inp_data, Dtype inp_type, const float* weight,
                                     const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                                     LinearExecution& exec, const Fp8Tensor* input,
                                     const Fp8Operand& gradient) {
  check_stored(dinp_type, "a linear layer's input gradient");
  OCTET_CHECK(dweight_type == Dtype::f32 || dweight_type == weight_gradient_type(exec),
              "a linear layer's weight gradient is stored as {} only where its GEMM writes it so",
              dtype_name(dweight_type));
  check_stored(dout_type, "a linear layer's output gradient");
  check_stored(inp_type, "a linear layer's input");
  auto* w = const_cast<CudaWeightCopy*>(dynamic_cast<const CudaWeightCopy*>(copy));
  const ConstTensorView dout(dout_data, dout_type, {N, OC});
  const ConstTensorView inp(inp_data, inp_type, {N, C});
  const auto* dout_bf16 = dout_type == Dtype::bf16 ? static_cast<const uint16_t*>(dout_data) : nullptr;
  const auto* dout_f32 = dout_type == Dtype::f32 ? static_cast<const float*>(dout_data) : nullptr;
  const bool fp8 = casts_gradient(exec);
  check_gradient_cast(exec, gradient.cast_by_producer, dout_data, dbias);
  const void* dout_wide = nullptr;  // dout rounded to BF16/FP16 (slot 0), once for both GEMMs
  // An FP8 backward sums the bias gradient with its gradient cast (cast_gradient), in one pass over dout
  // where it can; a BF16 one with the conversion of a float32 dout for its input-gradient GEMM.
  if (dbias != nullptr && !fp8) {
    if (dout_f32 != nullptr && exec.input_gradient == GemmMode::bf16) {
      const OpScope scope(*this, OpKind::casts);
      auto* converted = wide_[0].as<__nv_bfloat16>(static_cast<size_t>(N * OC), stream_);
      bias_backward_convert(dbias, converted, dout_f32, N, OC, workspace_, stream_);
      dout_wide = converted;
    } else {
      const OpScope scope(*this, OpKind::other);
      if (dout_bf16 != nullptr) {
        bias_backward(dbias, dout_bf16, N, OC, workspace_, stream_);
      } else {
        bias_backward(dbias, dout_f32, N, OC, workspace_, stream_);
      }
    }
  }
  const uint8_t* dy = nullptr;
  const uint8_t* dy_t = nullptr;
  Layer* layer = nullptr;
  if (fp8) {
    layer = &prepared_layer(exec, w);
    OCTET_CHECK(gradient.tensor != nullptr, "linear_backward: a slot for the FP8 output gradient's cast");
    if (!gradient.cast_by_producer) {
      if (dout_bf16 != nullptr) {
        cast_gradient_bf16(*layer, dout_bf16, N, OC, exec, gradient.tensor, dbias);
      } else {
        cast_gradient(*layer, dout_f32, N, OC, exec, gradient.tensor, dbias);
      }
    }
    const CudaFp8Tensor& g =
        cast_of(gradient.tensor->get(), exec, TensorRole::gradient, N, OC, "linear_backward");
    dy = g.row_codes;
    dy_t = g.transposed;
  }

  // dinp: float32, or bf16, which BF16 GEMMs and FP8 ones on FP8 tensor cores write themselves (rounding
  // their float32 result once); the others write float32 to widened_[2], rounded to bf16 afterwards.
  auto* dinp_f32 = dinp_type == Dtype::f32 ? static_cast<float*>(dinp) : nullptr;
  auto* dinp_bf16 = dinp_type == Dtype::bf16 ? static_cast<__nv_bfloat16*>(dinp) : nullptr;
  const bool bf16_direct =
      dinp_bf16 != nullptr && reinterpret_cast<uintptr_t>(dinp) % 16 == 0 &&
      (exec.input_gradient == GemmMode::bf16 || (exec.input_gradient == GemmMode::fp8 && !emulate_fp8_));
  if (dinp_bf16 != nullptr && !bf16_direct) {
    dinp_f32 = widened_[2].as<float>(static_cast<size_t>(N * C), stream_);
  }
  __nv_bfloat16* gemm_bf16 = bf16_direct ? dinp_bf16 : nullptr;

  // Input gradient: dinp [N, C] = dout [N, OC] x W [OC, C], i.e. A = dout (K = OC), B = W^T.
  switch (exec.input_gradient) {
    case GemmMode::f32: {
      GemmProblem p;
      p.M = N;
      p.N = C;
      p.K = OC;
      p.a_type = p.b_type = GemmType::f32;
      p.a = as_f32(dout, 0);
      p.b = weight;
      p.b_transposed = true;
      p.d = dinp_f32;
      wide_gemm(p);
      if (exec.other_gemms) *exec.other_gemms += 1;
      break;
    }
    case GemmMode::bf16:
    case GemmMode::f16: {
      OCTET_CHECK(w != nullptr && w->has_wide, "a rounded weight copy (prepare_weight)");
      if (dout_wide == nullptr) dout_wide = as_wide(dout, exec.input_gradient, 0);
      wide_input_gradient(gemm_bf16 != nullptr ? nullptr : dinp_f32, dout_wide, w->wide.get(0, stream_), N, C,
                          OC, exec.input_gradient, exec, gemm_bf16);
      break;
    }
    case GemmMode::fp8:
      OCTET_CHECK(w != nullptr && w->has_fp8, "an FP8 weight copy (prepare_weight)");
      fp8_gemm(gemm_bf16 != nullptr ? nullptr : dinp_f32, dy, exec.formats.gradient,
               &layer->device->gradient_scale_inv, weight_transposed_for_gemm(*w, OC, C, exec),
               exec.formats.weight, &layer->device->weight_scale_inv, N, C, OC, false,
               exec.fast_accumulation_backward, nullptr, gemm_bf16);
      if (exec.fp8_gemms) *exec.fp8_gemms += 1;
      break;
  }
  if (dinp_bf16 != nullptr && !bf16_direct) {
    const OpScope scope(*this, OpKind::casts);
    convert_to_bf16(dinp_bf16, dinp_f32, N * C, stream_);
  }

  // Weight gradient, accumulated in float32: dweight [OC, C] += dout^T [OC, N] x inp [N, C] (K = N); written
  // (=) where exec.accumulate_weight_gradient is false. A bf16 dweight is the GEMM's own bf16 output (the
  // float32 sum, old value included, rounded once).
  auto* dweight_f32 = dweight_type == Dtype::f32 ? static_cast<float*>(dweight) : nullptr;
  auto* dweight_bf16 = dweight_type == Dtype::bf16 ? static_cast<__nv_bfloat16*>(dweight) : nullptr;
  switch (exec.weight_gradient) {
    case GemmMode::f32:
    case GemmMode::bf16:
    case GemmMode::f16: {
      if (exec.weight_gradient == GemmMode::f32) {
        weight_gradient_gemm(dweight_f32, GemmType::f32, as_f32(dout, 0), as_f32(inp, 1), N, C,
                             OC, exec);
      } else {
        // The input gradient's rounded copy of dout, when it made one of the same type.
        const void* a = exec.input_gradient == exec.weight_gradient
                            ? dout_wide
                            : as_wide(dout, exec.weight_gradient, 0);
        weight_gradient_gemm(dweight_f32, wide_type(exec.weight_gradient), a,
                             as_wide(inp, exec.weight_gradient, 1), N, C, OC, exec, dweight_bf16);
      }
      break;
    }
    case GemmMode::fp8: {
      const CudaFp8Tensor& saved = cast_of(input, exec, TensorRole::activation, N, C, "linear_backward");
      // Evaluation and generation run any number of rows; only this GEMM has them as K.
      OCTET_REQUIRE(fp8_shape_supported(OC, C, N),
                    "an FP8 weight gradient over {} rows: FP8 GEMMs need a multiple of 16 (the precision "
                    "policy keeps such layers in BF16)",
                    N);
      fp8_gemm(dweight_f32, dy_t, exec.formats.gradient, &layer->device->gradient_scale_inv,
               saved.transposed, saved.format, saved.scale_inv, OC, C, N,
               exec.accumulate_weight_gradient, exec.fast_accumulation_backward, nullptr, dweight_bf16);
      if (exec.fp8_gemms) *exec.fp8_gemms += 1;
      break;
    }
  }
}

void CudaBackend::wide_input_gradient(float* dinp, const void* dout_wide, const void* weight_wide, int64_t N,
                                      int64_t C, int64_t OC, GemmMode mode, LinearExecution& exec,
                                      __nv_bfloat16* dinp_bf16) {
  GemmProblem p;
  p.M = N;
  p.N = C;
  p.K = OC;
  p.a_type = p.b_type = wide_type(mode);
  p.a = dout_wide;
  p.b = weight_wide;
  p.b_transposed = true;
  p.d = dinp;
  p.d_bf16 = dinp_bf16;
  wide_gemm(p);
  if (exec.other_gemms) *exec.other_gemms += 1;
}

void CudaBackend::weight_gradient_gemm(float* dweight, GemmType type, const void* dout, const void* inp,
                                       int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                                       __nv_bfloat16* dweight_bf16) {
  GemmProblem p;
  p.M = OC;
  p.N = C;
  p.K = N;
  p.a_type = p.b_type = type;
  p.a = dout;
  p.a_transposed = true;
  p.b = inp;
  p.b_transposed = true;
  p.d = dweight;
  p.d_bf16 = dweight_bf16;
  p.accumulate = exec.accumulate_weight_gradient;
  wide_gemm(p);
  if (exec.other_gemms) *exec.other_gemms += 1;
}

}  // namespace octet::cuda::backend_internal
