// See localization_variants.h.
#include "localization_variants.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <thread>

#include "octet/check.h"

namespace octet {

VariantRunner::VariantRunner(const ModelConfig& model, Backend& backend, const VariantBatches& batches,
                             std::vector<float> weights)
    : model_(model), backend_(backend), batches_(batches), weights_(std::move(weights)) {}

namespace {

// A parameter's gradient fetched to the host, float32 or BF16 as the model keeps it.
struct HostGradient {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  float at(size_t i) const {
    return bf16.empty() ? f32[i] : std::bit_cast<float>(static_cast<uint32_t>(bf16[i]) << 16);
  }
};

// Where a linear layer's weight gradient lies: in which fetched gradient, from which element.
struct SlotSource {
  const HostGradient* gradient = nullptr;
  size_t begin = 0;
};

// The sums of x.y, x.x and y.y over `count` values, x read from `source` and y from `reference`.
CosineSums chunk_sums(const HostGradient& source, size_t begin, const float* reference, size_t count) {
  CosineSums s;
  for (size_t i = 0; i < count; ++i) {
    const double x = source.at(begin + i), y = reference[i];
    s.dot += x * y;
    s.xx += x * x;
    s.yy += y * y;
  }
  s.finite = std::isfinite(s.dot) && std::isfinite(s.xx) && std::isfinite(s.yy);
  return s;
}

// Each range's sums against the reference, in chunks of a fixed size spread over host threads and added in
// chunk order: the same bits for any number of threads.
std::vector<CosineSums> sums_against(const std::vector<SlotSource>& sources,
                                     const std::vector<GradientRange>& ranges, const std::vector<float>& reference) {
  constexpr size_t kChunk = size_t{1} << 20;
  struct Chunk {
    size_t range, offset, count;
  };
  std::vector<Chunk> chunks;
  for (size_t r = 0; r < ranges.size(); ++r) {
    for (size_t at = 0; at < ranges[r].count; at += kChunk) {
      chunks.push_back({r, at, std::min(kChunk, ranges[r].count - at)});
    }
  }
  std::vector<CosineSums> partial(chunks.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c = next++; c < chunks.size(); c = next++) {
      const Chunk& k = chunks[c];
      partial[c] = chunk_sums(*sources[k.range].gradient, sources[k.range].begin + k.offset,
                              reference.data() + ranges[k.range].begin + k.offset, k.count);
    }
  };
  const size_t threads =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16) - 1;  // and this thread
  std::vector<std::thread> pool;
  for (size_t t = 0; t < std::min(threads, chunks.size()); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::vector<CosineSums> sums(ranges.size());
  for (size_t c = 0; c < chunks.size(); ++c) sums[chunks[c].range] += partial[c];
  return sums;
}

}  // namespace

VariantResult VariantRunner::run(PrecisionPolicy policy, bool measure_numerics, const VariantResult* reference) {
  const int64_t B = batches_.batch_size, T = batches_.seq_len;
  const std::unique_ptr<Model> model = make_model(model_, backend_, std::move(policy), B, T);
  OCTET_CHECK(static_cast<size_t>(model->parameter_count()) == weights_.size(),
              "{} weights for the variant's model, got {}", model->parameter_count(), weights_.size());
  // Telemetry first: the weight casts happen when the copies are made.
  model->set_telemetry(measure_numerics, measure_numerics);
  backend_.copy_from_host(model->params(), weights_.data(), weights_.size() * sizeof(float));
  model->refresh_weight_copies();
  model->zero_grad();
  double loss = 0.0;
  for (size_t b = 0; b < batches_.tokens.size(); ++b) {
    loss += model->forward(batches_.tokens[b].data(), batches_.targets[b].data(), B, T, batches_.dloss);
    model->backward(batches_.dloss);
  }
  backend_.synchronize();
  VariantResult result;
  result.loss = loss / static_cast<double>(batches_.tokens.size());

  // Each linear layer's weight gradient, fetched as one run: a fused layer's weight (qkv_proj, gate_up_proj)
  // spans several parameters that lie one after another, as do their gradients; a tied head's is the token
  // embedding's.
  model->grads();  // zeroes the weight gradients no backward wrote
  const std::vector<Model::WeightCopySlot> slots = model->weight_copy_slots();
  const bool first = ranges_.empty();
  size_t at = 0;
  std::vector<HostGradient> fetched(slots.size());
  std::vector<SlotSource> sources;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Model::WeightCopySlot& slot = slots[i];
    const int64_t count = slot.rows * slot.cols;
    const ParameterInfo* holder = nullptr;
    for (const ParameterInfo& p : model->parameters()) {
      if (slot.offset >= p.offset && slot.offset < p.offset + p.count) holder = &p;
    }
    OCTET_CHECK(holder != nullptr, "the parameter holding layer {}'s weight", slot.layer);
    // The parameters the run covers keep their gradients in the holder's type, one after another.
    for (const ParameterInfo& p : model->parameters()) {
      if (p.offset + p.count <= slot.offset || p.offset >= slot.offset + count) continue;
      OCTET_CHECK(p.grad_type == holder->grad_type && p.grad_offset - holder->grad_offset == p.offset - holder->offset,
                  "layer {}'s weight gradient in one run: {} lies apart from {}", slot.layer, p.name, holder->name);
    }
    HostGradient& g = fetched[i];
    const int64_t skip = slot.offset - holder->offset;
    const void* device = model->gradient(*holder);
    if (holder->grad_type == Dtype::f32) {
      g.f32.resize(static_cast<size_t>(count));
      backend_.copy_to_host(g.f32.data(), static_cast<const float*>(device) + skip, g.f32.size() * sizeof(float));
    } else {
      OCTET_CHECK(holder->grad_type == Dtype::bf16, "a gradient in f32 or bf16, got {}", dtype_name(holder->grad_type));
      g.bf16.resize(static_cast<size_t>(count));
      backend_.copy_to_host(g.bf16.data(), static_cast<const uint16_t*>(device) + skip,
                            g.bf16.size() * sizeof(uint16_t));
    }
    sources.push_back({&g, 0});
    const auto n = static_cast<size_t>(count);
    if (first) {
      ranges_.push_back({std::string(slot.layer), at, n});
    } else {
      OCTET_CHECK(i < ranges_.size() && ranges_[i].layer == slot.layer && ranges_[i].count == n,
                  "layer {}'s weight gradient where the first variant had {}", slot.layer,
                  i < ranges_.size() ? ranges_[i].layer : std::string("none"));
    }
    at += n;
  }
  OCTET_CHECK(sources.size() == ranges_.size(), "{} linear layers in the variant, {} in the first",
              sources.size(), ranges_.size());
  if (reference == nullptr) {
    result.gradients.resize(at);
    for (size_t r = 0; r < ranges_.size(); ++r) {
      for (size_t i = 0; i < ranges_[r].count; ++i) {
        result.gradients[ranges_[r].begin + i] = sources[r].gradient->at(sources[r].begin + i);
      }
    }
  } else {
    OCTET_CHECK(reference->gradients.size() == at, "a reference of {} gradients, got {}", at,
                reference->gradients.size());
    result.against = sums_against(sources, ranges_, reference->gradients);
  }
  if (measure_numerics) {
    for (const LinearPlan& p : model->policy().layers()) {
      if (!p.fp8()) continue;
      if (const Fp8LinearTelemetry* t = model->telemetry(p.name)) result.telemetry[p.name] = *t;
    }
  }
  return result;
}

}  // namespace octet
