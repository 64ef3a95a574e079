// CudaBackend::produce_grouped: a grouped op's casts of its row groups, each for its own layer (routing.cu,
// norm_activation.cu). Internal to the CUDA backend: include only from its .cu files.
#pragma once

#include <span>
#include <vector>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {

template <typename Fused, typename Plain>
void CudaBackend::produce_grouped(float* out, int64_t M, int64_t width, const RowGroupCasts& casts,
                                  TensorRole role, Fused fused, Plain plain) {
  const bool input = role == TensorRole::activation;
  const int operand = input ? kActivation : kGradient;
  uint8_t* shared = nullptr;
  if (input) {
    shared = input_codes_.as<uint8_t>(static_cast<size_t>(M * width), stream_);
    input_codes_for_.clear();
  }
  struct Ended {
    Layer* layer;
    const LinearExecution* exec;
    int64_t n;
  };
  std::vector<cuda::FusedCastGroup> groups;
  std::vector<Ended> ended;
  for (int64_t g = 0; g < casts.groups(); ++g) {
    const int64_t from = casts.offsets[static_cast<size_t>(g)];
    const int64_t rows = casts.offsets[static_cast<size_t>(g) + 1] - from;
    if (rows == 0) continue;
    float* rows_out = out != nullptr ? out + from * width : nullptr;
    const Fp8CastTarget& target = casts.targets[static_cast<size_t>(g)];
    if (!target.given()) {
      OCTET_CHECK(rows_out != nullptr, "a grouped op's output for group {}, which is not cast", g);
      plain(from, rows, rows_out);
      continue;
    }
    LinearExecution& consumer = *target.layer;
    Layer& layer = mapped_layer(consumer);
    const int64_t n = rows * width;
    float* const y =
        rows_out != nullptr ? rows_out : producer_output_.as<float>(static_cast<size_t>(n), stream_);
    if (input) {
      OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
      OCTET_CHECK(rows_out != nullptr || input_cast_suffices(consumer),
                  "the output kept for a consumer that reads it");
      CudaFp8Tensor& t = input_tensor(target.tensor, consumer, rows, width, shared + from * width);
      if (producer_casts(consumer)) {
        groups.push_back({from, rows, fused_cast_into(layer, kActivation, consumer.formats.activation, t, n)});
        ended.push_back({&layer, &consumer, n});
      } else {
        plain(from, rows, y);
        cast_operand(layer, kActivation, consumer.formats.activation, y, rows, width, t.row_codes, t.transposed,
                     &layer.device->cast_scale[kActivation], t.scale_inv, consumer.update_scaling, consumer);
      }
      continue;
    }
    OCTET_CHECK(casts_gradient(consumer), "a consumer with an FP8 backward GEMM");
    OCTET_CHECK(rows_out != nullptr || gradient_cast_suffices(consumer),
                "the gradient kept for a consumer that reads it");
    if (producer_casts(consumer)) {
      groups.push_back({from, rows, gradient_fused_cast(layer, consumer, rows, width, target.tensor)});
      ended.push_back({&layer, &consumer, n});
    } else {
      plain(from, rows, y);
      cast_gradient(layer, y, rows, width, consumer, target.tensor);
    }
  }
  // One call per format (every group's, unless the layers' recipes differ), then each cast's end.
  for (const Dtype format : {Dtype::e4m3, Dtype::e5m2}) {
    std::vector<cuda::FusedCastGroup> of_format;
    for (const cuda::FusedCastGroup& group : groups) {
      if (group.cast.format == format) of_format.push_back(group);
    }
    if (!of_format.empty()) fused(std::span<const cuda::FusedCastGroup>(of_format));
  }
  for (size_t i = 0; i < ended.size(); ++i) {
    const LinearExecution& exec = *ended[i].exec;
    end_cast(*ended[i].layer, operand, groups[i].cast.format, ended[i].n, input ? exec.update_scaling : true,
             exec.telemetry != nullptr);
  }
}

}  // namespace octet::cuda::backend_internal
