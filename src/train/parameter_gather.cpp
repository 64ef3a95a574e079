// The gather of a sharded optimizer's parameters (see parameter_gather.h).
#include "parameter_gather.h"

#include <algorithm>
#include <span>

#include "octet/check.h"

namespace octet {

namespace {

// The elements of [begin, end) that lie before `at`.
int64_t before(int64_t begin, int64_t end, int64_t at) {
  return std::clamp(at, begin, end) - begin;
}

bool gathered_as_codes(const Model::WeightCopySlot& slot) {
  const LinearExecution& e = *slot.exec;
  return !slot.shared && e.forward == GemmMode::fp8 && e.input_gradient == GemmMode::fp8 &&
         e.recipe != nullptr && e.state != nullptr &&
         e.recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor;
}

}  // namespace

ParameterGather::ParameterGather(Model& model, dist::Communicator& ranks, bool fp8_weights)
    : model_(model), ranks_(ranks), fp8_weights_(fp8_weights) {}

ParameterGather::Plan ParameterGather::plan() {
  const int64_t total = model_.parameter_count();
  const int n = ranks_.size();
  std::vector<dist::ShardRange> shards;
  for (int r = 0; r < n; ++r) shards.push_back(dist::shard_range(total, r, n));
  const dist::ShardRange& mine = shards[static_cast<size_t>(ranks_.rank())];

  Plan p;
  std::vector<Model::WeightCopySlot> slots;
  for (const Model::WeightCopySlot& s : model_.weight_copy_slots()) {
    (fp8_weights_ && gathered_as_codes(s) ? slots : p.others).push_back(s);
  }
  std::sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });

  p.code_bounds.assign(static_cast<size_t>(n) + 1, 0);
  p.packed_bounds.assign(static_cast<size_t>(n) + 1, 0);
  int64_t codes = 0, packed = 0, at = 0;
  auto add_run = [&](int64_t begin, int64_t end) {
    if (begin >= end) return;
    p.runs.push_back({.offset = begin, .count = end - begin, .packed = packed});
    packed += end - begin;
    for (int r = 0; r < n; ++r) p.packed_bounds[static_cast<size_t>(r)] += before(begin, end, shards[r].begin);
  };
  float* params = model_.params();
  for (const Model::WeightCopySlot& s : slots) {
    const int64_t count = s.rows * s.cols;
    OCTET_CHECK(s.offset >= at, "weight copies that do not overlap (the one of {})", s.layer);
    add_run(at, s.offset);
    const int64_t begin = before(s.offset, s.offset + count, mine.begin);
    const int64_t end = std::max(begin, before(s.offset, s.offset + count, mine.end));
    p.parts.push_back({.copy = s.copy,
                       .exec = s.exec,
                       .weight = params + s.offset,
                       .rows = s.rows,
                       .cols = s.cols,
                       .begin = begin,
                       .end = end,
                       .codes_offset = codes});
    for (int r = 0; r < n; ++r)
      p.code_bounds[static_cast<size_t>(r)] += before(s.offset, s.offset + count, shards[r].begin);
    codes += count;
    at = s.offset + count;
  }
  add_run(at, total);
  p.code_bounds[static_cast<size_t>(n)] = codes;
  p.packed_bounds[static_cast<size_t>(n)] = packed;
  return p;
}

void* ParameterGather::reserve(std::unique_ptr<Buffer>& buffer, size_t bytes) {
  if (buffer == nullptr || buffer->bytes() < bytes) buffer = model_.backend().allocate(std::max<size_t>(bytes, 1));
  return buffer->data();
}

ParameterGather::Volume ParameterGather::volume() {
  const Plan p = plan();
  Volume v;
  v.fp8_bytes = p.code_bounds.back();
  v.float32_bytes = p.packed_bounds.back() * int64_t{sizeof(float)};
  v.fp8_weights = static_cast<int64_t>(p.parts.size());
  return v;
}

void ParameterGather::gather() {
  Backend& backend = model_.backend();
  float* params = model_.params();
  const Plan p = fp8_weights_ ? plan() : Plan{};
  stale_masters_ = !p.parts.empty();
  if (p.parts.empty()) {
    // Every rank's updated shard, to every rank, in place (in the backend's memory where the communicator
    // works there: NCCL on GPUs, on its own stream, once the update is done).
    backend.synchronize();
    ranks_.all_gather_shards(std::span<float>(params, static_cast<size_t>(model_.parameter_count())));
    model_.refresh_weight_copies();
    return;
  }
  const int rank = ranks_.rank();
  auto* codes = static_cast<uint8_t*>(reserve(codes_, static_cast<size_t>(p.code_bounds.back())));
  auto* packed = static_cast<float*>(reserve(packed_, static_cast<size_t>(p.packed_bounds.back()) * sizeof(float)));
  auto* amaxes = static_cast<float*>(reserve(amaxes_, p.parts.size() * sizeof(float)));

  // This rank's float32 values into its part of the packed runs, and its parts' amaxes.
  const dist::ShardRange mine = dist::shard_range(model_.parameter_count(), rank, ranks_.size());
  for (const Run& run : p.runs) {
    const int64_t begin = std::max(run.offset, mine.begin), end = std::min(run.offset + run.count, mine.end);
    if (begin < end) {
      backend.copy(packed + run.packed + (begin - run.offset), params + begin,
                   static_cast<size_t>(end - begin) * sizeof(float));
    }
  }
  backend.weight_part_amaxes(p.parts, amaxes);
  backend.synchronize();
  // The whole weights' amaxes: the largest part on any rank (a NaN anywhere wins, as in a whole cast).
  ranks_.all_reduce_max(std::span<float>(amaxes, p.parts.size()));
  backend.cast_weight_parts(p.parts, amaxes, codes);
  backend.synchronize();
  ranks_.all_gather_parts(std::span<std::byte>(reinterpret_cast<std::byte*>(codes),
                                               static_cast<size_t>(p.code_bounds.back())),
                          p.code_bounds);
  std::vector<int64_t> packed_bytes(p.packed_bounds.size());
  for (size_t i = 0; i < packed_bytes.size(); ++i) packed_bytes[i] = p.packed_bounds[i] * int64_t{sizeof(float)};
  ranks_.all_gather_parts(std::span<std::byte>(reinterpret_cast<std::byte*>(packed),
                                               static_cast<size_t>(packed_bytes.back())),
                          packed_bytes);
  for (const Run& run : p.runs) {
    backend.copy(params + run.offset, packed + run.packed, static_cast<size_t>(run.count) * sizeof(float));
  }
  backend.weight_copies_from_codes(p.parts, codes);
  for (const Model::WeightCopySlot& s : p.others) {
    backend.prepare_weight(*s.copy, params + s.offset, s.rows, s.cols, *s.exec);
  }
}

void ParameterGather::gather_master_weights() {
  if (!stale_masters_) return;
  model_.backend().synchronize();
  ranks_.all_gather_shards(std::span<float>(model_.params(), static_cast<size_t>(model_.parameter_count())));
  stale_masters_ = false;
}

}  // namespace octet
