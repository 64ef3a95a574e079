// The weights' copies and their updates: prepare_weight's FP8 cast and BF16/FP16 copy of a linear layer's
// weight, the optimizer update (optimizer_update), whose AdamW passes also write those copies and the rounded
// bias copies, and the segmented zeroing (fill_zero_ranges).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_backend_impl.h"

namespace octet::cuda::backend_internal {
namespace {

// Elements offset .. offset + count - 1, split into chunks of at most kChunkElements.
void append_chunks(std::vector<Chunk>& chunks, int64_t offset, int64_t count, bool flag) {
  OCTET_CHECK(offset >= 0 && count >= 0, "a segment at {} of {} elements", offset, count);
  for (int64_t at = 0; at < count; at += kChunkElements) {
    chunks.push_back({offset + at, static_cast<int32_t>(std::min(kChunkElements, count - at)), flag ? 1 : 0});
  }
}

// Whether the AdamW pass over this layer's weight writes its FP8 copy: delayed or static scaling (the scale
// is known before the update), and no SQNR measurement (which needs the unfused cast).
bool fuses_weight_cast(const LinearExecution& exec) {
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  const bool sqnr = exec.telemetry != nullptr && exec.measure_sqnr;
  return any_fp8 && !sqnr && exec.recipe != nullptr &&
         (exec.recipe->kind() == RecipeKind::delayed || exec.recipe->kind() == RecipeKind::static_scale);
}

// Whether the AdamW pass over this layer's weight writes its BF16 copy (a layer with no FP8 GEMM on the
// weight and a BF16 one).
bool writes_bf16_copy(const LinearExecution& exec) {
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  const GemmMode wide = exec.forward != GemmMode::fp8 ? exec.forward : exec.input_gradient;
  return !any_fp8 && wide == GemmMode::bf16;
}

// An optimizer step has begun on the layer: its bias is current again only where AdamW's pass over it writes
// the rounded copy (update_tensors).
void forget_bias_copy(std::unique_ptr<WeightCopy>& copy) {
  if (auto* w = dynamic_cast<CudaWeightCopy*>(copy.get())) w->bias_current = false;
}

// Where a batched AdamW weight reads its gradient: float32 in grads, or bf16 (UpdateSegment::grads_bf16).
template <typename Weight>
void set_gradient(Weight& w, const float* grads, const Backend::UpdateSegment& u) {
  if (u.grads_bf16 != nullptr) {
    w.grads_bf16 = static_cast<const uint16_t*>(u.grads_bf16);
  } else {
    w.grads = grads + u.grad_at();
  }
}

}  // namespace

CudaWeightCopy& cuda_weight_copy(std::unique_ptr<WeightCopy>& copy) {
  auto* w = dynamic_cast<CudaWeightCopy*>(copy.get());
  if (w == nullptr) {
    copy = std::make_unique<CudaWeightCopy>();
    w = static_cast<CudaWeightCopy*>(copy.get());
  }
  return *w;
}

void CudaBackend::optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                                   std::span<const UpdateSegment> segments) {
  check_segments(segments, true);
  // Every layer's rounded bias changes: current again only where update_tensors writes it.
  for (const UpdateSegment& s : segments) {
    if (s.is_weight()) {
      forget_bias_copy(*s.copy);
    } else if (auto* copy = dynamic_cast<CudaWeightCopy*>(s.bias_of)) {
      copy->bias_current = false;
    }
  }
  // One learning-rate multiplier at a time (parameter groups, UpdateSegment::learning_rate_scale), each
  // group's segments with the step's rate times its multiplier, as the CPU backend scales it: without groups
  // a single pass over every segment, as before.
  std::vector<float> scales;
  for (const UpdateSegment& s : segments) {
    if (std::find(scales.begin(), scales.end(), s.learning_rate_scale) == scales.end())
      scales.push_back(s.learning_rate_scale);
  }
  for (const float scale : scales) {
    AdamWStep scaled = step;
    scaled.learning_rate = step.learning_rate * scale;
    if (scales.size() == 1) {
      update_segments(scaled, tensors, segments);
      break;
    }
    std::vector<UpdateSegment> group;
    for (const UpdateSegment& s : segments) {
      if (s.learning_rate_scale == scale) group.push_back(s);
    }
    update_segments(scaled, tensors, group);
  }
}

void CudaBackend::update_segments(const AdamWStep& step, const OptimizerTensors& tensors,
                                  std::span<const UpdateSegment> segments) {
  // The segments by what their pass writes besides params, m and v: a weight's FP8 copy and transpose (one
  // launch), a weight's BF16 copy (another), nothing (a third, update_tensors). A launch takes one weight
  // decay besides none; a weight with another, or whose copy is made apart, goes by itself, first.
  float decay = 0.0f;
  std::vector<const UpdateSegment*> casts, converts, plain;
  for (const UpdateSegment& u : segments) {
    if (!u.is_weight() && u.grads_bf16 != nullptr) {  // part of a weight, in a sharded optimizer's shard
      const OpScope scope(*this, OpKind::optimizer);
      cuda::adamw_update(tensors.params + u.offset, tensors.m + u.offset, tensors.v + u.offset,
                         static_cast<const uint16_t*>(u.grads_bf16), u.count, step.learning_rate, step.beta1,
                         step.beta2, step.eps, u.weight_decay, step.step, step.grad_scale, stream_);
      continue;
    }
    if (!u.is_weight()) {
      plain.push_back(&u);
      continue;
    }
    const bool cast = fuses_weight_cast(*u.exec), convert = writes_bf16_copy(*u.exec);
    const bool other_decay = u.weight_decay != 0.0f && decay != 0.0f && u.weight_decay != decay;
    if ((!cast && !convert) || other_decay) {
      update_weight_alone(step, tensors, u);
      continue;
    }
    if (u.weight_decay != 0.0f) decay = u.weight_decay;
    (cast ? casts : converts).push_back(&u);
  }
  float* params = tensors.params;
  float* m = tensors.m;
  float* v = tensors.v;
  if (!converts.empty() || !casts.empty()) {
    const OpScope scope(*this, OpKind::optimizer);
    if (!converts.empty()) {
      std::vector<cuda::AdamWConvertWeight> batch;
      for (const UpdateSegment* u : converts) {
        cuda::AdamWConvertWeight w{params + u->offset,
                                   m + u->offset,
                                   v + u->offset,
                                   nullptr,
                                   bf16_weight_copy(*u->copy, u->count),
                                   u->count,
                                   u->weight_decay != 0.0f};
        set_gradient(w, tensors.grads, *u);
        batch.push_back(w);
      }
      cuda::adamw_update_converts(batch, step.learning_rate, step.beta1, step.beta2, step.eps, decay,
                                  step.step, step.grad_scale, adamw_converts_, stream_);
    }
    if (!casts.empty()) {
      std::vector<cuda::AdamWCastWeight> batch;
      for (const UpdateSegment* u : casts) {
        cuda::AdamWCastWeight w{params + u->offset,
                                m + u->offset,
                                v + u->offset,
                                nullptr,
                                u->rows,
                                u->cols,
                                u->weight_decay != 0.0f,
                                begin_weight_cast(*u->copy, u->rows, u->cols, *u->exec)};
        set_gradient(w, tensors.grads, *u);
        batch.push_back(w);
      }
      cuda::adamw_update_casts(batch, step.learning_rate, step.beta1, step.beta2, step.eps, decay, step.step,
                               step.grad_scale, adamw_casts_, stream_);
      for (const UpdateSegment* u : casts)
        end_weight_cast(**u->copy, params + u->offset, u->rows, u->cols, *u->exec);
    }
  }
  update_tensors(step, tensors, plain);
}

void CudaBackend::update_tensors(const AdamWStep& step, const OptimizerTensors& tensors,
                                 std::span<const UpdateSegment* const> segments) {
  // The chunk kernel takes one weight decay besides none (the optimizer's case); others go one by one.
  float decay = 0.0f;
  for (const UpdateSegment* s : segments) {
    if (s->weight_decay == 0.0f) continue;
    if (decay != 0.0f && s->weight_decay != decay) {
      for (const UpdateSegment* each : segments) update_segment_alone(step, tensors, *each);
      return;
    }
    decay = s->weight_decay;
  }
  std::vector<Chunk> chunks;
  for (const UpdateSegment* s : segments) {
    const size_t first = chunks.size();
    append_chunks(chunks, s->offset, s->count, s->weight_decay != 0.0f);
    for (size_t i = first; i < chunks.size(); ++i)
      chunks[i].grad_offset = chunks[i].offset - s->offset + s->grad_at();
    // A bias whose rounded copy the forward reads: written in the same pass, current until the weight's
    // next update.
    auto* copy = dynamic_cast<CudaWeightCopy*>(s->bias_of);
    if (copy == nullptr || copy->bias_form == BiasCopy::none ||
        copy->bias_source != tensors.params + s->offset || copy->bias_count != s->count) {
      continue;
    }
    const bool bits = copy->bias_form == BiasCopy::bf16_bits;
    auto* rounded =
        static_cast<char*>(copy->bias.get(static_cast<size_t>(s->count) * (bits ? 2 : 4), stream_));
    for (size_t i = first; i < chunks.size(); ++i) {
      chunks[i].rounded = rounded + (chunks[i].offset - s->offset) * (bits ? 2 : 4);
      chunks[i].rounded_bits = bits ? 1 : 0;
    }
    copy->bias_current = true;
  }
  if (chunks.empty()) return;
  const Chunk* table = adamw_chunks_.upload(std::move(chunks), stream_);
  const OpScope scope(*this, OpKind::optimizer);
  cuda::adamw_update_chunks(tensors.params, tensors.m, tensors.v, tensors.grads, table, adamw_chunks_.size(),
                            step.learning_rate, step.beta1, step.beta2, step.eps, decay, step.step,
                            step.grad_scale, stream_);
}

void CudaBackend::update_segment_alone(const AdamWStep& step, const OptimizerTensors& tensors,
                                       const UpdateSegment& s) {
  const OpScope scope(*this, OpKind::optimizer);
  cuda::adamw_update(tensors.params + s.offset, tensors.m + s.offset, tensors.v + s.offset,
                     tensors.grads + s.grad_at(), s.count, step.learning_rate, step.beta1, step.beta2,
                     step.eps, s.weight_decay, step.step, step.grad_scale, stream_);
}

void CudaBackend::fill_zero_ranges(float* x, std::span<const Range> ranges) {
  std::vector<Chunk> chunks;
  for (const Range& r : ranges) append_chunks(chunks, r.offset, r.count, false);
  if (chunks.empty()) return;
  const Chunk* table = zero_chunks_.upload(std::move(chunks), stream_);
  const OpScope scope(*this, OpKind::other);
  cuda::fill_zero_chunks(x, table, zero_chunks_.size(), stream_);
}

void CudaBackend::update_weight_alone(const AdamWStep& step, const OptimizerTensors& tensors,
                                      const UpdateSegment& u) {
  float* params = tensors.params + u.offset;
  float* m = tensors.m + u.offset;
  float* v = tensors.v + u.offset;
  const bool cast = fuses_weight_cast(*u.exec), convert = writes_bf16_copy(*u.exec);
  if (u.grads_bf16 != nullptr && !cast && !convert) {
    // A weight whose copy is made apart (the current recipe's cast, say): AdamW over the bf16 gradient as it
    // lies, then the copy.
    {
      const OpScope scope(*this, OpKind::optimizer);
      cuda::adamw_update(params, m, v, static_cast<const uint16_t*>(u.grads_bf16), u.count,
                         step.learning_rate, step.beta1, step.beta2, step.eps, u.weight_decay, step.step,
                         step.grad_scale, stream_);
    }
    prepare_weight(*u.copy, params, u.rows, u.cols, *u.exec);
    return;
  }
  // A bf16 gradient of a weight with another weight decay than the launch's: widened to float32 first, for
  // the one-weight passes that read float32.
  const float* grads = tensors.grads + u.grad_at();
  if (u.grads_bf16 != nullptr) {
    const OpScope scope(*this, OpKind::optimizer);
    auto* widened = widened_gradient_.as<float>(static_cast<size_t>(u.count), stream_);
    convert_from_bf16(widened, static_cast<const uint16_t*>(u.grads_bf16), u.count, stream_);
    grads = widened;
  }
  const OpScope scope(*this, OpKind::optimizer);
  if (convert) {
    // prepare_weight's BF16 copy, written by the AdamW kernel from the updated weights.
    cuda::adamw_update_convert(params, m, v, grads, bf16_weight_copy(*u.copy, u.count), u.count,
                               step.learning_rate, step.beta1, step.beta2, step.eps, u.weight_decay,
                               step.step, step.grad_scale, stream_);
    return;
  }
  if (!cast) {
    cuda::adamw_update(params, m, v, grads, u.count, step.learning_rate, step.beta1, step.beta2, step.eps,
                       u.weight_decay, step.step, step.grad_scale, stream_);
    prepare_weight(*u.copy, params, u.rows, u.cols, *u.exec);
    return;
  }
  const FusedCast fused = begin_weight_cast(*u.copy, u.rows, u.cols, *u.exec);
  cuda::adamw_update_cast(params, m, v, grads, u.rows, u.cols, step.learning_rate, step.beta1, step.beta2,
                          step.eps, u.weight_decay, step.step, step.grad_scale, fused, stream_);
  end_weight_cast(**u.copy, params, u.rows, u.cols, *u.exec);
}

// prepare_weight's BF16 copy of n values, for the AdamW kernel that writes it from the updated weights.
__nv_bfloat16* CudaBackend::bf16_weight_copy(std::unique_ptr<WeightCopy>& copy, int64_t n) {
  CudaWeightCopy& w = cuda_weight_copy(copy);
  w.has_fp8 = false;
  w.has_wide = true;
  return w.wide.as<__nv_bfloat16>(static_cast<size_t>(n), stream_);
}

// prepare_weight's FP8 half, for the AdamW kernel that writes the cast from the updated weights: the copy's
// buffers and the layer's scale, before the kernel; its scaling update and BF16 half after it.
FusedCast CudaBackend::begin_weight_cast(std::unique_ptr<WeightCopy>& copy, int64_t OC, int64_t C,
                                         LinearExecution& exec) {
  CudaWeightCopy* w = &cuda_weight_copy(copy);
  OCTET_REQUIRE(fp8_shape_supported(OC, C, C) && fp8_shape_supported(C, OC, OC),
                "an FP8 layer of {} x {} weights: FP8 GEMMs need both dimensions multiples of 16 (the "
                "precision policy keeps such layers in BF16)",
                OC, C);
  const size_t n = static_cast<size_t>(OC * C);
  Layer& layer = layer_of(exec, *w);
  DeviceLayerState* s = layer.device;
  FusedCast cast;
  cast.format = exec.formats.weight;
  cast.scale = begin_cast(layer, kWeight, exec.formats.weight, nullptr, OC * C, &s->weight_copy_scale);
  cast.output = w->fp8.as<uint8_t>(n, stream_);
  cast.output_transposed = weight_codes_transposed(*w, n, exec);
  cast.scale_inv = &s->weight_scale_inv;
  cast.results = &s->results[kWeight];
  cast.results_zeroed = layer.take_zeroed_results(kWeight);
  return cast;
}

uint8_t* CudaBackend::weight_codes_transposed(CudaWeightCopy& w, size_t n, const LinearExecution& exec) {
  if (!exec.transpose_weight_per_use) return w.fp8_transposed.as<uint8_t>(n, stream_);
  OCTET_CHECK(
      exec.recipe != nullptr && exec.recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor,
      "weight transposes per use need a per-tensor weight scale");
  w.fp8_transposed.release(stream_);
  return nullptr;
}

const uint8_t* CudaBackend::weight_transposed_for_gemm(CudaWeightCopy& w, int64_t OC, int64_t C,
                                                       const LinearExecution& exec) {
  if (!exec.transpose_weight_per_use) return static_cast<const uint8_t*>(w.fp8_transposed.get(0, stream_));
  const OpScope scope(*this, OpKind::casts);
  auto* transposed = weight_transposed_.as<uint8_t>(static_cast<size_t>(OC * C), stream_);
  cuda::transpose_codes(static_cast<const uint8_t*>(w.fp8.get(0, stream_)), transposed, OC, C, stream_);
  return transposed;
}

void CudaBackend::end_weight_cast(WeightCopy& copy, const float* params, int64_t OC, int64_t C,
                                  LinearExecution& exec) {
  auto& w = static_cast<CudaWeightCopy&>(copy);
  end_cast(*w.layer, kWeight, exec.formats.weight, OC * C, true, exec.telemetry != nullptr);
  w.has_fp8 = true;
  make_wide_weight(w, params, OC, C, exec);
}

void CudaBackend::make_wide_weight(CudaWeightCopy& w, const float* weight, int64_t OC, int64_t C,
                                   const LinearExecution& exec) {
  const size_t n = static_cast<size_t>(OC * C);
  const GemmMode wide = exec.forward != GemmMode::fp8 ? exec.forward : exec.input_gradient;
  w.has_wide = wide == GemmMode::bf16 || wide == GemmMode::f16;
  if (w.has_wide) {
    if (wide == GemmMode::f16) {
      convert_to_f16(w.wide.as<__half>(n, stream_), weight, OC * C, stream_);
    } else {
      convert_to_bf16(w.wide.as<__nv_bfloat16>(n, stream_), weight, OC * C, stream_);
    }
  }
}

void CudaBackend::prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC,
                                 int64_t C, LinearExecution& exec) {
  const OpScope scope(*this, OpKind::casts);
  CudaWeightCopy* w = &cuda_weight_copy(copy);
  w->bias_current = false;  // the parameters may have changed in any way: the next forward rounds the bias
  const size_t n = static_cast<size_t>(OC * C);
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  w->has_fp8 = any_fp8;
  if (any_fp8) {
    OCTET_REQUIRE(fp8_shape_supported(OC, C, C) && fp8_shape_supported(C, OC, OC),
                  "an FP8 layer of {} x {} weights: FP8 GEMMs need both dimensions multiples of 16 (the "
                  "precision policy keeps such layers in BF16)",
                  OC, C);
    Layer& layer = layer_of(exec, *w);
    DeviceLayerState* s = layer.device;
    // The weight's state moves on with every cast, as on the CPU (prepare_weight there updates it always).
    cast_operand(layer, kWeight, exec.formats.weight, weight, OC, C, w->fp8.as<uint8_t>(n, stream_),
                 weight_codes_transposed(*w, n, exec), &s->weight_copy_scale, &s->weight_scale_inv, true,
                 exec);
  }
  make_wide_weight(*w, weight, OC, C, exec);
}

}  // namespace octet::cuda::backend_internal
