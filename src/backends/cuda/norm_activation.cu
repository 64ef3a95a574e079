// The CUDA backend's RMSNorm and SwiGLU: outputs stored as the caller asks (float32 or bf16), inputs read as
// they are stored, and, with a consumer's cast target, the consumer's FP8 cast written in the producing
// kernel's own pass where the recipe knows the scale before the cast (producer_casts: the kernels of
// fused_layernorm.cu and fused_swiglu.cu), else the op followed by the consumer's own cast (cast_input,
// cast_gradient), exactly as LayerNorm's and GELU's entries do (operand_casts.cu).
#include <cstdint>

#include "cuda_backend_impl.h"
#include "grouped_casts.h"

namespace octet::cuda::backend_internal {

namespace {

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

void CudaBackend::rmsnorm_forward_as(void* out, Dtype out_type, float* rstd, const float* inp,
                                     const float* weight, int64_t N, int64_t C) {
  check_stored(out_type, "RMSNorm's output");
  const OpScope scope(*this, OpKind::norm_activation);
  if (out_type == Dtype::bf16) {
    cuda::rmsnorm_forward(static_cast<uint16_t*>(out), rstd, inp, weight, N, C, stream_);
  } else {
    cuda::rmsnorm_forward(static_cast<float*>(out), rstd, inp, weight, N, C, stream_);
  }
}

void CudaBackend::rmsnorm_forward_cast(float* out, float* rstd, const float* inp, const float* weight,
                                       int64_t N, int64_t C, const Fp8CastTarget& target) {
  const OpScope scope(*this, OpKind::norm_activation);
  produce_input(
      out, N, C, target,
      [&](const FusedCast& cast) { cuda::rmsnorm_forward_cast(out, rstd, inp, weight, N, C, cast, stream_); },
      [&](float* y) { cuda::rmsnorm_forward(y, rstd, inp, weight, N, C, stream_); });
}

void CudaBackend::rmsnorm_backward_as(float* dinp, float* dweight, const void* dout, Dtype dout_type,
                                      const float* inp, const float* weight, const float* rstd, int64_t N,
                                      int64_t C) {
  check_stored(dout_type, "RMSNorm's output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  if (dout_type == Dtype::bf16) {
    cuda::rmsnorm_backward(dinp, dweight, static_cast<const uint16_t*>(dout), inp, weight, rstd, N, C,
                           workspace_, stream_);
  } else {
    cuda::rmsnorm_backward(dinp, dweight, static_cast<const float*>(dout), inp, weight, rstd, N, C,
                           workspace_, stream_);
  }
}

void CudaBackend::swiglu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t N,
                                    int64_t C) {
  check_stored(out_type, "SwiGLU's output");
  check_stored(type, "SwiGLU's input");
  const OpScope scope(*this, OpKind::norm_activation);
  auto run = [&](auto* o) {
    if (type == Dtype::bf16) {
      cuda::swiglu_forward(o, static_cast<const uint16_t*>(inp), N, C, stream_);
    } else {
      cuda::swiglu_forward(o, static_cast<const float*>(inp), N, C, stream_);
    }
  };
  if (out_type == Dtype::bf16) {
    run(static_cast<uint16_t*>(out));
  } else {
    run(static_cast<float*>(out));
  }
}

void CudaBackend::swiglu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                                         const Fp8CastTarget& target) {
  check_stored(type, "SwiGLU's input");
  const OpScope scope(*this, OpKind::norm_activation);
  produce_input(
      out, N, C, target,
      [&](const FusedCast& cast) {
        if (type == Dtype::bf16) {
          cuda::swiglu_forward_cast(out, static_cast<const uint16_t*>(inp), N, C, cast, stream_);
        } else {
          cuda::swiglu_forward_cast(out, static_cast<const float*>(inp), N, C, cast, stream_);
        }
      },
      [&](float* y) { swiglu_forward_as(y, Dtype::f32, inp, type, N, C); });
}

void CudaBackend::swiglu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout,
                                     Dtype type, int64_t N, int64_t C) {
  check_stored(dinp_type, "SwiGLU's input gradient");
  check_stored(type, "SwiGLU's input and output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  auto run = [&](auto* d) {
    if (type == Dtype::bf16) {
      cuda::swiglu_backward(d, static_cast<const uint16_t*>(inp), static_cast<const uint16_t*>(dout), N, C,
                            stream_);
    } else {
      cuda::swiglu_backward(d, static_cast<const float*>(inp), static_cast<const float*>(dout), N, C,
                            stream_);
    }
  };
  if (dinp_type == Dtype::bf16) {
    run(static_cast<uint16_t*>(dinp));
  } else {
    run(static_cast<float*>(dinp));
  }
}

void CudaBackend::swiglu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type,
                                          int64_t N, int64_t C, float* dbias, const Fp8CastTarget& target) {
  check_stored(type, "SwiGLU's input and output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  LinearExecution& consumer = *target.layer;
  OCTET_CHECK(casts_gradient(consumer), "a consumer with an FP8 backward GEMM");
  OCTET_CHECK(dinp != nullptr || gradient_cast_suffices(consumer),
              "the gradient kept for a consumer that reads it");
  Layer& layer = mapped_layer(consumer);
  const int64_t width = 2 * C;  // dinp [N, 2C]: the consumer's output gradient
  const size_t n = static_cast<size_t>(N * width);
  const size_t element = type == Dtype::bf16 ? 2 : 4;
  // fused.h keeps the fused kernel's dinp apart from its inputs, so a dinp written over them takes the
  // unfused kernel, which reads a pair before it writes the pair's gradients.
  const bool in_place = dinp != nullptr && (overlap(dinp, n * 4, inp, n * element) ||
                                            overlap(dinp, n * 4, dout, n / 2 * element));
  if (producer_casts(consumer) && !in_place) {
    // linear_backward's cast_operand, with the codes written by the SwiGLU backward kernel.
    const Dtype format = consumer.formats.gradient;
    const FusedCast cast = gradient_fused_cast(layer, consumer, N, width, target.tensor);
    float* partials = dbias == nullptr ? nullptr
                                       : column_partials_.as<float>(
                                             static_cast<size_t>(column_partial_rows(N) * width), stream_);
    const cuda::PartialSums sums = dbias != nullptr ? sums_aside_.next() : cuda::PartialSums{};
    if (type == Dtype::bf16) {
      cuda::swiglu_backward_cast(dinp, static_cast<const uint16_t*>(inp), static_cast<const uint16_t*>(dout),
                                 N, C, cast, dbias, partials, workspace_, stream_, sums);
    } else {
      cuda::swiglu_backward_cast(dinp, static_cast<const float*>(inp), static_cast<const float*>(dout), N, C,
                                 cast, dbias, partials, workspace_, stream_, sums);
    }
    end_cast(layer, kGradient, format, N * width, true, consumer.telemetry != nullptr);
  } else {
    // The unfused ops, in linear_backward's order: the bias gradient, then the cast.
    float* d = dinp != nullptr ? dinp : producer_output_.as<float>(n, stream_);
    swiglu_backward_as(d, Dtype::f32, inp, dout, type, N, C);
    if (dbias != nullptr) bias_backward(dbias, d, N, width, workspace_, stream_);
    cast_gradient(layer, d, N, width, consumer, target.tensor);
  }
}

void CudaBackend::activation_forward_grouped(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                             const RowGroupCasts& casts) {
  const int64_t M = inp.rows(), C = activation_width("activation_forward_grouped", kind, inp.shape);
  check_matrix("activation_forward_grouped", "out", out.shape, M, C);
  check_dtype("activation_forward_grouped", "out (with cast targets)", out.dtype, {Dtype::f32});
  check_stored(inp.dtype, "the activation's input");
  check_row_groups("activation_forward_grouped", casts, M);
  OCTET_CHECK(out.data == nullptr || out.data != inp.data, "activation_forward_grouped: out is not inp");
  const OpScope scope(*this, OpKind::norm_activation);
  float* o = out.has_data() ? out.f32() : nullptr;
  const int64_t width = inp.cols();  // of an input row
  const size_t element = inp.dtype == Dtype::bf16 ? 2 : 4;
  auto input_rows = [&](int64_t from) { return static_cast<const char*>(inp.data) + from * width * element; };
  produce_grouped(
      o, M, C, casts, TensorRole::activation,
      [&](std::span<const cuda::FusedCastGroup> groups) {
        if (kind == Activation::swiglu) {
          if (inp.dtype == Dtype::bf16) {
            cuda::swiglu_forward_cast_grouped(o, static_cast<const uint16_t*>(inp.data), C, groups, stream_);
          } else {
            cuda::swiglu_forward_cast_grouped(o, inp.f32(), C, groups, stream_);
          }
          return;
        }
        for (const cuda::FusedCastGroup& g : groups) {  // GELU: a launch per group
          float* rows_out = o != nullptr ? o + g.row0 * C : nullptr;
          if (inp.dtype == Dtype::bf16) {
            cuda::gelu_forward_cast(rows_out, reinterpret_cast<const uint16_t*>(input_rows(g.row0)), g.rows, C,
                                    g.cast, stream_);
          } else {
            cuda::gelu_forward_cast(rows_out, reinterpret_cast<const float*>(input_rows(g.row0)), g.rows, C,
                                    g.cast, stream_);
          }
        }
      },
      [&](int64_t from, int64_t rows, float* y) {
        if (kind == Activation::swiglu) {
          swiglu_forward_as(y, Dtype::f32, input_rows(from), inp.dtype, rows, C);
        } else {
          gelu_forward_as(y, Dtype::f32, input_rows(from), inp.dtype, rows * C);
        }
      });
}

void CudaBackend::activation_backward_grouped(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                              const ConstTensorView& dout, const RowGroupCasts& casts) {
  const int64_t M = inp.rows(), C = activation_width("activation_backward_grouped", kind, inp.shape);
  const int64_t width = inp.cols();
  check_matrix("activation_backward_grouped", "dout", dout.shape, M, C);
  check_matrix("activation_backward_grouped", "dinp", dinp.shape, M, width);
  check_dtype("activation_backward_grouped", "dinp (with cast targets)", dinp.dtype, {Dtype::f32});
  OCTET_CHECK(dout.dtype == inp.dtype, "activation_backward_grouped: dout ({}) is stored as inp is ({})",
              dtype_name(dout.dtype), dtype_name(inp.dtype));
  check_stored(inp.dtype, "the activation's input and output gradient");
  check_row_groups("activation_backward_grouped", casts, M);
  const size_t element = inp.dtype == Dtype::bf16 ? 2 : 4;
  const size_t n = static_cast<size_t>(M * width);
  OCTET_CHECK(!dinp.has_data() || (!overlap(dinp.data, n * 4, inp.data, n * element) &&
                                   !overlap(dinp.data, n * 4, dout.data, static_cast<size_t>(M * C) * element)),
              "activation_backward_grouped: dinp apart from inp and dout");
  const OpScope scope(*this, OpKind::norm_activation);
  float* d = dinp.has_data() ? dinp.f32() : nullptr;
  auto input_rows = [&](int64_t from) { return static_cast<const char*>(inp.data) + from * width * element; };
  auto dout_rows = [&](int64_t from) { return static_cast<const char*>(dout.data) + from * C * element; };
  produce_grouped(
      d, M, width, casts, TensorRole::gradient,
      [&](std::span<const cuda::FusedCastGroup> groups) {
        if (kind == Activation::swiglu) {
          if (inp.dtype == Dtype::bf16) {
            cuda::swiglu_backward_cast_grouped(d, static_cast<const uint16_t*>(inp.data),
                                               static_cast<const uint16_t*>(dout.data), C, groups, stream_);
          } else {
            cuda::swiglu_backward_cast_grouped(d, inp.f32(), dout.f32(), C, groups, stream_);
          }
          return;
        }
        for (const cuda::FusedCastGroup& g : groups) {  // GELU: a launch per group
          float* rows_out = d != nullptr ? d + g.row0 * width : nullptr;
          if (inp.dtype == Dtype::bf16) {
            cuda::gelu_backward_cast(rows_out, reinterpret_cast<const uint16_t*>(input_rows(g.row0)),
                                     reinterpret_cast<const uint16_t*>(dout_rows(g.row0)), g.rows, width, g.cast,
                                     nullptr, nullptr, workspace_, stream_);
          } else {
            cuda::gelu_backward_cast(rows_out, reinterpret_cast<const float*>(input_rows(g.row0)),
                                     reinterpret_cast<const float*>(dout_rows(g.row0)), g.rows, width, g.cast,
                                     nullptr, nullptr, workspace_, stream_);
          }
        }
      },
      [&](int64_t from, int64_t rows, float* y) {
        if (kind == Activation::swiglu) {
          swiglu_backward_as(y, Dtype::f32, input_rows(from), dout_rows(from), inp.dtype, rows, C);
        } else {
          gelu_backward_as(y, Dtype::f32, input_rows(from), dout_rows(from), inp.dtype, rows * C);
        }
      });
}

}  // namespace octet::cuda::backend_internal
