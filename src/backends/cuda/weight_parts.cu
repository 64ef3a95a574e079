// Weights gathered as FP8 codes (Backend::weight_part_amaxes, cast_weight_parts, weight_copies_from_codes):
// each rank casts its part of a weight with the scale of the weight's amax over every rank, and makes the
// weight's copy from the gathered codes, as prepare_weight would have made it from the whole weight.
#include <cstdint>
#include <span>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {
namespace {

__global__ void take_amaxes_kernel(const CastResults* results, float* amaxes, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    amaxes[i] = results[i].amax;
  }
}

void check_part(const Backend::WeightPart& p) {
  OCTET_CHECK(p.copy != nullptr && p.exec != nullptr && p.exec->recipe != nullptr && p.exec->state != nullptr &&
                  p.exec->forward == GemmMode::fp8 && p.exec->input_gradient == GemmMode::fp8 &&
                  p.exec->recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor &&
                  0 <= p.begin && p.begin <= p.end && p.end <= p.rows * p.cols,
              "a part {}..{} of a [{}, {}] weight whose GEMMs are all FP8 with one scale per tensor", p.begin,
              p.end, p.rows, p.cols);
  OCTET_REQUIRE(fp8_shape_supported(p.rows, p.cols, p.cols) && fp8_shape_supported(p.cols, p.rows, p.rows),
                "an FP8 layer of {} x {} weights: FP8 GEMMs need both dimensions multiples of 16 (the "
                "precision policy keeps such layers in BF16)",
                p.rows, p.cols);
}

}  // namespace

void CudaBackend::weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) {
  const OpScope scope(*this, OpKind::casts);
  if (parts.empty()) return;
  auto* results = part_results_.as<CastResults>(parts.size(), stream_);
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightPart& p = parts[i];
    check_part(p);
    amax_only(p.weight + p.begin, p.end - p.begin, results + i, stream_);
  }
  const auto n = static_cast<int64_t>(parts.size());
  take_amaxes_kernel<<<blocks_for(n), 256, 0, stream_>>>(results, amaxes, n);
  OCTET_CUDA_CHECK_LAUNCH("take_amaxes_kernel");
}

void CudaBackend::cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) {
  for (size_t i = 0; i < parts.size(); ++i) {
    const WeightPart& p = parts[i];
    check_part(p);
    CudaWeightCopy& w = cuda_weight_copy(*p.copy);
    Layer& layer = layer_of(*p.exec, w);
    DeviceLayerState* s = layer.device;
    cast_operand_part(layer, kWeight, p.exec->formats.weight, amaxes + i, p.weight + p.begin, p.end - p.begin,
                      codes + (p.codes_offset + p.begin), &s->weight_copy_scale, &s->weight_scale_inv, *p.exec);
  }
}

void CudaBackend::weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) {
  const OpScope scope(*this, OpKind::casts);
  for (const WeightPart& p : parts) {
    check_part(p);
    CudaWeightCopy& w = cuda_weight_copy(*p.copy);
    layer_of(*p.exec, w);
    const auto n = static_cast<size_t>(p.rows * p.cols);
    // In the stream's order from the device's pool: a fully sharded weight's copy is made and given back
    // (release_weight_copies) every step, and most of them hold none between their uses.
    auto* own = static_cast<uint8_t*>(w.fp8.get_in_order(n, stream_));
    OCTET_CUDA_CHECK(cudaMemcpyAsync(own, codes + p.codes_offset, n, cudaMemcpyDeviceToDevice, stream_));
    if (!p.exec->transpose_weight_per_use) {
      auto* transposed = static_cast<uint8_t*>(w.fp8_transposed.get_in_order(n, stream_));
      cuda::transpose_codes(own, transposed, p.rows, p.cols, stream_);
    } else {
      weight_codes_transposed(w, n, *p.exec);  // checks the recipe, gives back any transposed copy
    }
    w.has_fp8 = true;
    w.has_wide = false;
    w.bias_current = false;  // the gather brought the bias's new values too
  }
}

void CudaBackend::weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) {
  for (const WeightPart& p : parts) {
    check_part(p);
    CudaWeightCopy& w = cuda_weight_copy(*p.copy);
    OCTET_CHECK(w.has_fp8 && !w.fp8.empty(), "the FP8 copy of a [{}, {}] weight to take its codes from", p.rows,
                p.cols);
    if (p.end > p.begin) {
      const auto* from = static_cast<const uint8_t*>(w.fp8.get(0, stream_));
      OCTET_CUDA_CHECK(cudaMemcpyAsync(codes + (p.codes_offset + p.begin), from + p.begin,
                                       static_cast<size_t>(p.end - p.begin), cudaMemcpyDeviceToDevice, stream_));
    }
  }
}

void CudaBackend::release_weight_copies(std::span<const WeightPart> parts) {
  for (const WeightPart& p : parts) {
    check_part(p);
    CudaWeightCopy& w = cuda_weight_copy(*p.copy);
    w.fp8.release_in_order(stream_);
    w.fp8_transposed.release_in_order(stream_);
    w.has_fp8 = false;  // the GEMMs check for it
  }
}

}  // namespace octet::cuda::backend_internal
