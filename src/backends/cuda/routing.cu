// The CUDA backend's mixture-of-experts routing ops (backend.h): the checks the CPU reference makes of shapes
// and dtypes, then the kernels of router_softmax.cu, expert_grouping.cu and expert_rows.cu on the backend's
// stream. group_by_expert and gather_rows on the CPU also refuse an expert or a source row out of range;
// here those indices are in device memory, which the host does not read inside a step, so those kernels
// instead leave such an assignment out of every group and gather a row of NaN (expert_grouping.h,
// expert_rows.h).
#include "cuda_backend_impl.h"
#include "expert_grouping.h"
#include "expert_rows.h"
#include "grouped_casts.h"
#include "octet/check.h"
#include "router_softmax.h"

namespace octet::cuda::backend_internal {

void CudaBackend::top_k_softmax(const TensorView& probs, int32_t* experts, float* weights,
                                const ConstTensorView& logits, int64_t k) {
  check_dtype("top_k_softmax", "logits", logits.dtype, {Dtype::f32});
  check_dtype("top_k_softmax", "probs", probs.dtype, {Dtype::f32});
  const auto [N, E] = routing_sizes("top_k_softmax", logits.shape, k);
  check_shape("top_k_softmax", "probs", probs.shape, logits.shape);
  const OpScope scope(*this, OpKind::other);
  cuda::top_k_softmax(probs.f32(), experts, weights, logits.f32(), N, E, k, stream_);
}

void CudaBackend::top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs,
                                         const int32_t* experts, const float* weights, const float* dweights,
                                         int64_t k, const float* dprobs) {
  check_dtype("top_k_softmax_backward", "probs", probs.dtype, {Dtype::f32});
  check_dtype("top_k_softmax_backward", "dlogits", dlogits.dtype, {Dtype::f32});
  const auto [N, E] = routing_sizes("top_k_softmax_backward", probs.shape, k);
  check_shape("top_k_softmax_backward", "dlogits", dlogits.shape, probs.shape);
  // The kernel stages the probabilities' gradient in dlogits while it still reads probs.
  OCTET_CHECK(dlogits.data == nullptr || dlogits.data != probs.data,
              "top_k_softmax_backward: dlogits is not probs");
  const OpScope scope(*this, OpKind::other);
  cuda::top_k_softmax_backward(dlogits.f32(), probs.f32(), experts, weights, dweights, dprobs, N, E, k,
                               stream_);
}

void CudaBackend::group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions,
                                  const int32_t* experts, int64_t N, int64_t k, int64_t E, int64_t align) {
  const OpScope scope(*this, OpKind::other);
  cuda::group_by_expert(offsets, slots, positions, experts, N, k, E, align, stream_);
}

void CudaBackend::gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                              int64_t divisor, const float* scale, const Fp8CastTarget& cast_for,
                              TensorRole cast_as) {
  check_dtype("gather_rows", "out", out.dtype, {Dtype::f32, Dtype::bf16});
  check_dtype("gather_rows", "src", src.dtype, {Dtype::f32});
  const int64_t M = out.rows(), C = out.cols(), R = src.rows();
  check_matrix("gather_rows", "src", src.shape, R, C);
  OCTET_CHECK(divisor >= 1, "gather_rows: the divisor is at least 1, given {}", divisor);
  const OpScope scope(*this, OpKind::other);
  if (cast_for.given()) {
    gather_rows_cast(out, src, index, divisor, scale, cast_for, cast_as);
    return;
  }
  if (out.dtype == Dtype::bf16) {
    cuda::gather_rows(static_cast<uint16_t*>(out.data), src.f32(), index, scale, M, R, C, divisor, stream_);
  } else {
    cuda::gather_rows(out.f32(), src.f32(), index, scale, M, R, C, divisor, stream_);
  }
}

void CudaBackend::gather_rows_cast(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                                   int64_t divisor, const float* scale, const Fp8CastTarget& cast_for,
                                   TensorRole cast_as) {
  check_dtype("gather_rows", "out (with a cast target)", out.dtype, {Dtype::f32});
  const int64_t M = out.rows(), C = out.cols(), R = src.rows();
  float* o = out.has_data() ? out.f32() : nullptr;
  LinearExecution& consumer = *cast_for.layer;
  auto gather = [&](float* y) { cuda::gather_rows(y, src.f32(), index, scale, M, R, C, divisor, stream_); };
  auto fused = [&](const FusedCast& cast) {
    cuda::gather_rows_cast(o, src.f32(), index, scale, M, R, C, divisor, cast, stream_);
  };
  if (cast_as == TensorRole::activation) {
    produce_input(o, M, C, cast_for, fused, gather);
    return;
  }
  // The output gradient: as activation_backward's target casts it (gelu_backward_cast_as), without a bias.
  OCTET_CHECK(cast_as == TensorRole::gradient && casts_gradient(consumer),
              "gather_rows: a gradient cast for a consumer with an FP8 backward GEMM");
  OCTET_CHECK(o != nullptr || gradient_cast_suffices(consumer),
              "gather_rows: the rows kept for a consumer "
              "that reads them");
  Layer& layer = mapped_layer(consumer);
  if (producer_casts(consumer)) {
    fused(gradient_fused_cast(layer, consumer, M, C, cast_for.tensor));
    end_cast(layer, kGradient, consumer.formats.gradient, M * C, true, consumer.telemetry != nullptr);
  } else {
    float* y = o != nullptr ? o : producer_output_.as<float>(static_cast<size_t>(M * C), stream_);
    gather(y);
    cast_gradient(layer, y, M, C, consumer, cast_for.tensor);
  }
}

void CudaBackend::gather_rows_grouped(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                                      int64_t divisor, const float* scale, const RowGroupCasts& casts,
                                      TensorRole cast_as) {
  check_dtype("gather_rows_grouped", "out (with cast targets)", out.dtype, {Dtype::f32});
  check_dtype("gather_rows_grouped", "src", src.dtype, {Dtype::f32});
  const int64_t M = out.rows(), C = out.cols(), R = src.rows();
  check_matrix("gather_rows_grouped", "src", src.shape, R, C);
  check_row_groups("gather_rows_grouped", casts, M);
  OCTET_CHECK(divisor >= 1, "gather_rows_grouped: the divisor is at least 1, given {}", divisor);
  const OpScope scope(*this, OpKind::other);
  float* o = out.has_data() ? out.f32() : nullptr;
  produce_grouped(
      o, M, C, casts, cast_as,
      [&](std::span<const cuda::FusedCastGroup> groups) {
        cuda::gather_rows_cast_grouped(o, src.f32(), index, scale, R, C, divisor, groups, stream_);
      },
      [&](int64_t from, int64_t rows, float* y) {
        cuda::gather_rows(y, src.f32(), index + from, scale, rows, R, C, divisor, stream_);
      });
}

void CudaBackend::combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                               const int32_t* positions, int64_t k, const float* weights) {
  check_dtype("combine_rows", "out", out.dtype, {Dtype::f32});
  check_dtype("combine_rows", "src", src.dtype, {Dtype::f32});
  const int64_t R = out.rows(), C = out.cols(), M = src.rows();
  check_matrix("combine_rows", "src", src.shape, M, C);
  const OpScope scope(*this, OpKind::other);
  cuda::combine_rows(out.f32(), base, src.f32(), positions, weights, R, C, k, stream_);
}

void CudaBackend::scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) {
  check_dtype("scatter_rows", "out", out.dtype, {Dtype::f32});
  check_dtype("scatter_rows", "src", src.dtype, {Dtype::f32});
  const int64_t R = out.rows(), C = out.cols(), M = src.rows();
  check_matrix("scatter_rows", "src", src.shape, M, C);
  const OpScope scope(*this, OpKind::other);
  cuda::scatter_rows(out.f32(), src.f32(), index, M, R, C, stream_);
}

void CudaBackend::row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src,
                           const int32_t* positions, int64_t k) {
  check_dtype("row_dots", "a", a.dtype, {Dtype::f32});
  check_dtype("row_dots", "src", src.dtype, {Dtype::f32});
  const int64_t R = a.rows(), C = a.cols(), M = src.rows();
  check_matrix("row_dots", "src", src.shape, M, C);
  const OpScope scope(*this, OpKind::other);
  cuda::row_dots(out, a.f32(), src.f32(), positions, R, C, k, stream_);
}

void CudaBackend::column_sums(float* out, const ConstTensorView& x) {
  check_dtype("column_sums", "x", x.dtype, {Dtype::f32});
  const OpScope scope(*this, OpKind::other);
  // bias_backward's column sums (column_sum.cu: float32, in an order fixed by the shape) added to zeros.
  cuda::fill_zero(out, x.cols(), stream_);
  cuda::bias_backward(out, x.f32(), x.rows(), x.cols(), workspace_, stream_);
}

}  // namespace octet::cuda::backend_internal
