// The FP8 casts of a linear layer's input and output gradient (into the caller's FP8 tensors,
// CudaFp8Tensor), and the LayerNorm and GELU ops that produce those tensors (RMSNorm's and SwiGLU's are
// norm_activation.cu's): where the recipe knows
// the scale before the cast (producer_casts), the producing kernel writes the cast in its own pass
// (producer_cast, gradient_fused_cast; the kernels in fused_*.cu), else the op runs and the cast follows
// (cast_operand).
#include <cstdint>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {

const CudaFp8Tensor& CudaBackend::cast_of(const Fp8Tensor* tensor, const LinearExecution& exec,
                                          TensorRole role, int64_t rows, int64_t cols, std::string_view op) {
  check_fp8_operand(op, tensor, exec, role, rows, cols);
  const auto* t = dynamic_cast<const CudaFp8Tensor*>(tensor);
  OCTET_CHECK(t != nullptr, "{}: an FP8 tensor of the CUDA backend", op);
  return *t;
}

namespace {

// What the cast about to be written into t is: `role` of exec's layer, [rows, cols].
void describe(CudaFp8Tensor& t, const LinearExecution& exec, TensorRole role, int64_t rows, int64_t cols) {
  const bool input = role == TensorRole::activation;
  t.format = input ? exec.formats.activation : exec.formats.gradient;
  t.rows = rows;
  t.cols = cols;
  t.role = role;
  t.state = input ? &exec.state->activation : &exec.state->gradient;
}

}  // namespace

CudaFp8Tensor& CudaBackend::input_tensor(std::unique_ptr<Fp8Tensor>* slot, const LinearExecution& exec,
                                         int64_t N, int64_t C, uint8_t* shared) {
  CudaFp8Tensor& t = fp8_tensor_in<CudaFp8Tensor>(slot, "a linear layer's input");
  const size_t n = static_cast<size_t>(N * C);
  describe(t, exec, TensorRole::activation, N, C);
  t.transposed = t.codes_transposed.as<uint8_t>(n, stream_);
  t.scale_inv = t.own_scale_inv.as<float>(1, stream_);
  if (exec.keep_input_codes) {
    t.row_codes = t.codes.as<uint8_t>(n, stream_);
  } else if (shared != nullptr) {
    t.row_codes = shared;
    input_codes_for_.push_back(&t);
  } else {
    t.row_codes = input_codes_.as<uint8_t>(n, stream_);
    input_codes_for_.assign(1, &t);
  }
  return t;
}

CudaFp8Tensor& CudaBackend::gradient_tensor(std::unique_ptr<Fp8Tensor>* slot, Layer& layer,
                                            const LinearExecution& exec, int64_t N, int64_t OC) {
  CudaFp8Tensor& t = fp8_tensor_in<CudaFp8Tensor>(slot, "a linear layer's output gradient");
  const size_t n = static_cast<size_t>(N * OC);
  describe(t, exec, TensorRole::gradient, N, OC);
  t.row_codes = t.codes.as<uint8_t>(n, stream_);
  t.transposed = t.codes_transposed.as<uint8_t>(n, stream_);
  t.scale_inv = &layer.device->gradient_scale_inv;
  return t;
}

void CudaBackend::cast_input(const float* x, int64_t N, int64_t C, LinearExecution& exec,
                             std::unique_ptr<Fp8Tensor>* slot) {
  Layer& layer = mapped_layer(exec);
  CudaFp8Tensor& t = input_tensor(slot, exec, N, C);
  cast_operand(layer, kActivation, exec.formats.activation, x, N, C, t.row_codes, t.transposed,
               &layer.device->cast_scale[kActivation], t.scale_inv, exec.update_scaling, exec);
}

bool CudaBackend::producer_casts(const LinearExecution& exec) const {
  return supports(Fusion::input_cast, exec).fused;
}

void CudaBackend::layernorm_forward_as(void* out, Dtype out_type, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int64_t N, int64_t C) {
  check_stored(out_type, "LayerNorm's output");
  const OpScope scope(*this, OpKind::norm_activation);
  if (out_type == Dtype::bf16) {
    cuda::layernorm_forward(static_cast<uint16_t*>(out), mean, rstd, inp, weight, bias, N, C, stream_);
  } else {
    cuda::layernorm_forward(static_cast<float*>(out), mean, rstd, inp, weight, bias, N, C, stream_);
  }
}

void CudaBackend::layernorm_backward_as(float* dinp, float* dweight, float* dbias, const void* dout,
                                        Dtype dout_type, const float* inp, const float* weight,
                                        const float* mean, const float* rstd, int64_t N, int64_t C) {
  check_stored(dout_type, "LayerNorm's output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  if (dout_type == Dtype::bf16) {
    cuda::layernorm_backward(dinp, dweight, dbias, static_cast<const uint16_t*>(dout), inp, weight, mean,
                             rstd, N, C, workspace_, stream_);
  } else {
    cuda::layernorm_backward(dinp, dweight, dbias, static_cast<const float*>(dout), inp, weight, mean, rstd,
                             N, C, workspace_, stream_);
  }
}

void CudaBackend::layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t N, int64_t C,
                                         const Fp8CastTarget& target) {
  const OpScope scope(*this, OpKind::norm_activation);
  produce_input(
      out, N, C, target,
      [&](const FusedCast& cast) {
        cuda::layernorm_forward_cast(out, mean, rstd, inp, weight, bias, N, C, cast, stream_);
      },
      [&](float* y) { cuda::layernorm_forward(y, mean, rstd, inp, weight, bias, N, C, stream_); });
}

void CudaBackend::gelu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t n) {
  check_stored(out_type, "GELU's output");
  check_stored(type, "GELU's input");
  const OpScope scope(*this, OpKind::norm_activation);
  auto run = [&](auto* o) {
    if (type == Dtype::bf16) {
      cuda::gelu_forward(o, static_cast<const uint16_t*>(inp), n, stream_);
    } else {
      cuda::gelu_forward(o, static_cast<const float*>(inp), n, stream_);
    }
  };
  if (out_type == Dtype::bf16) {
    run(static_cast<uint16_t*>(out));
  } else {
    run(static_cast<float*>(out));
  }
}

void CudaBackend::gelu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                                       const Fp8CastTarget& target) {
  check_stored(type, "GELU's input");
  const OpScope scope(*this, OpKind::norm_activation);
  produce_input(
      out, N, C, target,
      [&](const FusedCast& cast) {
        if (type == Dtype::bf16) {
          cuda::gelu_forward_cast(out, static_cast<const uint16_t*>(inp), N, C, cast, stream_);
        } else {
          cuda::gelu_forward_cast(out, static_cast<const float*>(inp), N, C, cast, stream_);
        }
      },
      [&](float* y) { gelu_forward_as(y, Dtype::f32, inp, type, N * C); });
}

FusedCast CudaBackend::gradient_fused_cast(Layer& layer, const LinearExecution& exec, int64_t N, int64_t C,
                                           std::unique_ptr<Fp8Tensor>* slot) {
  return fused_cast_into(layer, kGradient, exec.formats.gradient, gradient_tensor(slot, layer, exec, N, C),
                         N * C);
}

FusedCast CudaBackend::fused_cast_into(Layer& layer, int operand, Dtype format, const CudaFp8Tensor& t,
                                       int64_t n) {
  DeviceLayerState* s = layer.device;
  FusedCast cast;
  cast.format = format;
  cast.scale = begin_cast(layer, operand, format, nullptr, n, &s->cast_scale[operand]);
  cast.output = t.row_codes;
  cast.output_transposed = t.transposed;
  cast.scale_inv = t.scale_inv;
  cast.results = &s->results[operand];
  cast.results_zeroed = layer.take_zeroed_results(operand);
  return cast;
}

void CudaBackend::cast_gradient(Layer& layer, const float* dout, int64_t N, int64_t OC,
                                const LinearExecution& exec, std::unique_ptr<Fp8Tensor>* slot, float* dbias) {
  // The backward never runs with frozen scaling: the gradient's state moves on with every cast, as on the
  // CPU.
  if (dbias != nullptr && producer_casts(exec)) {
    // cast_operand's cast (the same codes, scale, scaling update, counts and telemetry), with the bias
    // gradient summed in the same pass over dout: per-tile column sums, then those added up, so its float32
    // additions come in another order than bias_backward's. The whole pass counts as a cast.
    const OpScope scope(*this, OpKind::casts);
    const Dtype format = exec.formats.gradient;
    const FusedCast cast = gradient_fused_cast(layer, exec, N, OC, slot);
    float* partials = column_partials_.as<float>(static_cast<size_t>(column_partial_rows(N) * OC), stream_);
    cuda::bias_backward_cast(dbias, dout, N, OC, cast, partials, workspace_, stream_, sums_aside_.next());
    end_cast(layer, kGradient, format, N * OC, true, exec.telemetry != nullptr);
  } else {
    if (dbias != nullptr) {
      const OpScope scope(*this, OpKind::other);
      bias_backward(dbias, dout, N, OC, workspace_, stream_);
    }
    CudaFp8Tensor& t = gradient_tensor(slot, layer, exec, N, OC);
    cast_operand(layer, kGradient, exec.formats.gradient, dout, N, OC, t.row_codes, t.transposed,
                 &layer.device->cast_scale[kGradient], t.scale_inv, true, exec);
  }
}

void CudaBackend::gelu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                                   int64_t n) {
  check_stored(dinp_type, "GELU's input gradient");
  check_stored(type, "GELU's input and output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  auto run = [&](auto* d) {
    if (type == Dtype::bf16) {
      cuda::gelu_backward(d, static_cast<const uint16_t*>(inp), static_cast<const uint16_t*>(dout), n,
                          stream_);
    } else {
      cuda::gelu_backward(d, static_cast<const float*>(inp), static_cast<const float*>(dout), n, stream_);
    }
  };
  if (dinp_type == Dtype::bf16) {
    run(static_cast<uint16_t*>(dinp));
  } else {
    run(static_cast<float*>(dinp));
  }
}

void CudaBackend::gelu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N,
                                        int64_t C, float* dbias, const Fp8CastTarget& target) {
  check_stored(type, "GELU's input and output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  LinearExecution& consumer = *target.layer;
  OCTET_CHECK(casts_gradient(consumer), "a consumer with an FP8 backward GEMM");
  OCTET_CHECK(dinp != nullptr || gradient_cast_suffices(consumer),
              "the gradient kept for a consumer that reads it");
  Layer& layer = mapped_layer(consumer);
  const size_t n = static_cast<size_t>(N * C);
  if (producer_casts(consumer)) {
    // linear_backward's cast_operand, with the codes written by the GELU backward kernel.
    const Dtype format = consumer.formats.gradient;
    const FusedCast cast = gradient_fused_cast(layer, consumer, N, C, target.tensor);
    float* partials = dbias == nullptr ? nullptr
                                       : column_partials_.as<float>(
                                             static_cast<size_t>(column_partial_rows(N) * C), stream_);
    const cuda::PartialSums sums = dbias != nullptr ? sums_aside_.next() : cuda::PartialSums{};
    if (type == Dtype::bf16) {
      cuda::gelu_backward_cast(dinp, static_cast<const uint16_t*>(inp), static_cast<const uint16_t*>(dout), N,
                               C, cast, dbias, partials, workspace_, stream_, sums);
    } else {
      cuda::gelu_backward_cast(dinp, static_cast<const float*>(inp), static_cast<const float*>(dout), N, C,
                               cast, dbias, partials, workspace_, stream_, sums);
    }
    end_cast(layer, kGradient, format, N * C, true, consumer.telemetry != nullptr);
  } else {
    // The unfused ops, in linear_backward's order: the bias gradient, then the cast.
    float* d = dinp != nullptr ? dinp : producer_output_.as<float>(n, stream_);
    gelu_backward_as(d, Dtype::f32, inp, dout, type, N * C);
    if (dbias != nullptr) bias_backward(dbias, d, N, C, workspace_, stream_);
    cast_gradient(layer, d, N, C, consumer, target.tensor);
  }
}

void CudaBackend::cast_input_bf16(const uint16_t* x, int64_t N, int64_t C, LinearExecution& exec,
                                  std::unique_ptr<Fp8Tensor>* slot) {
  if (!producer_casts(exec)) {
    cast_input(as_f32(ConstTensorView(x, Dtype::bf16, {N, C}), 0), N, C, exec, slot);
    return;
  }
  const OpScope scope(*this, OpKind::casts);
  producer_cast(N, C, exec, slot, [&](const FusedCast& cast) { cuda::cast_bf16(x, N, C, cast, stream_); });
}

void CudaBackend::cast_gradient_bf16(Layer& layer, const uint16_t* dout, int64_t N, int64_t OC,
                                     const LinearExecution& exec, std::unique_ptr<Fp8Tensor>* slot,
                                     float* dbias) {
  if (!producer_casts(exec)) {
    cast_gradient(layer, as_f32(ConstTensorView(dout, Dtype::bf16, {N, OC}), 0), N, OC, exec, slot, dbias);
    return;
  }
  // cast_gradient's fused cast (and bias gradient), reading the bf16 values.
  const OpScope scope(*this, OpKind::casts);
  const Dtype format = exec.formats.gradient;
  const FusedCast cast = gradient_fused_cast(layer, exec, N, OC, slot);
  if (dbias != nullptr) {
    float* partials = column_partials_.as<float>(static_cast<size_t>(column_partial_rows(N) * OC), stream_);
    cuda::bias_backward_cast(dbias, dout, N, OC, cast, partials, workspace_, stream_, sums_aside_.next());
  } else {
    cuda::cast_bf16(dout, N, OC, cast, stream_);
  }
  end_cast(layer, kGradient, format, N * OC, true, exec.telemetry != nullptr);
}

}  // namespace octet::cuda::backend_internal
