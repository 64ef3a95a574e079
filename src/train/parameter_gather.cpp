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

ParameterGather::ParameterGather(Model& model, dist::Communicator& ranks, bool fp8_weights,
                                 int64_t in_place_floats, int buffers, bool reshard)
    : model_(model),
      ranks_(ranks),
      fp8_weights_(fp8_weights),
      in_place_floats_(in_place_floats),
      buffers_(buffers),
      reshard_(reshard),
      gather_buffers_(static_cast<size_t>(std::max(buffers, 1))) {
  OCTET_REQUIRE(buffers >= 1, "FP8 weight gathers need at least 1 gather buffer, got {}", buffers);
  OCTET_REQUIRE(!reshard || fp8_weights,
                "weight copies given back after use (distributed.reshard_after_forward) need the weights "
                "gathered as FP8 codes (distributed.fp8_weight_gather = true)");
}

ParameterGather::~ParameterGather() {
  try {
    finish();
    // Whatever uses the model next finds every page mapped (the masters outside the shard still stale).
    restore_masters();
  } catch (...) {  // a rank failed: its error is already on its way up
  }
}

ParameterGather::Plan ParameterGather::plan() {
  const int64_t total = model_.parameter_count();
  const int n = ranks_.size();
  std::vector<dist::ShardRange> shards;
  for (int r = 0; r < n; ++r) shards.push_back(dist::shard_range(total, r, n));
  const dist::ShardRange& mine = shards[static_cast<size_t>(ranks_.rank())];
  const std::vector<int64_t> bounds = model_.forward_parameter_bounds();
  OCTET_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == total &&
                  std::is_sorted(bounds.begin(), bounds.end()),
              "the forward's parameter bounds from 0 to {}", total);

  Plan p;
  std::vector<Model::WeightCopySlot> slots;
  for (const Model::WeightCopySlot& s : model_.weight_copy_slots()) {
    (fp8_weights_ && gathered_as_codes(s) ? slots : p.others).push_back(s);
  }
  auto by_offset = [](const auto& a, const auto& b) { return a.offset < b.offset; };
  std::sort(slots.begin(), slots.end(), by_offset);
  std::sort(p.others.begin(), p.others.end(), by_offset);
  p.codes = !slots.empty();

  std::vector<int64_t> part_offsets;
  if (p.codes) {
    p.code_bounds.assign(static_cast<size_t>(n) + 1, 0);
    p.packed_bounds.assign(static_cast<size_t>(n) + 1, 0);
    int64_t codes = 0, packed = 0, at = 0;
    // A run of float32 parameters, split where the forward's runs begin.
    auto add_run = [&](int64_t begin, int64_t end) {
      for (const int64_t b : bounds) {
        if (begin >= end) return;
        if (b <= begin) continue;
        const int64_t stop = std::min(b, end);
        if (stop - begin >= in_place_floats_) {
          p.runs.push_back({.offset = begin, .count = stop - begin, .packed = packed, .in_place = true});
          p.in_place += stop - begin;
          begin = stop;
          continue;
        }
        p.runs.push_back({.offset = begin, .count = stop - begin, .packed = packed});
        packed += stop - begin;
        for (int r = 0; r < n; ++r) {
          p.packed_bounds[static_cast<size_t>(r)] += before(begin, stop, shards[r].begin);
        }
        begin = stop;
      }
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
      part_offsets.push_back(s.offset);
      for (int r = 0; r < n; ++r) {
        p.code_bounds[static_cast<size_t>(r)] += before(s.offset, s.offset + count, shards[r].begin);
      }
      codes += count;
      at = s.offset + count;
    }
    add_run(at, total);
    p.code_bounds[static_cast<size_t>(n)] = codes;
    p.packed_bounds[static_cast<size_t>(n)] = packed;
  }

  // The forward's runs, each with the parts, float32 runs and other copies that lie in it.
  size_t part = 0, run = 0, other = 0;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    Group g{.begin = bounds[i], .end = bounds[i + 1]};
    g.parts_begin = part;
    while (part < p.parts.size() && part_offsets[part] < g.end) {
      const Backend::WeightPart& w = p.parts[part];
      OCTET_CHECK(part_offsets[part] + w.rows * w.cols <= g.end, "a weight gathered as codes within one run "
                  "of the forward's parameters (the one at {})", part_offsets[part]);
      ++part;
    }
    g.parts_end = part;
    if (g.parts_end > g.parts_begin) {
      const Backend::WeightPart& last = p.parts[g.parts_end - 1];
      g.codes_begin = p.parts[g.parts_begin].codes_offset;
      g.codes_end = last.codes_offset + last.rows * last.cols;
    }
    g.runs_begin = run;
    while (run < p.runs.size() && p.runs[run].offset < g.end) ++run;
    g.runs_end = run;
    // The packed values of the group's runs that are not gathered in place (none: an empty range).
    g.packed_begin = g.packed_end = g.runs_begin < p.runs.size() ? p.runs[g.runs_begin].packed : 0;
    for (size_t k = g.runs_begin; k < g.runs_end; ++k) {
      if (!p.runs[k].in_place) g.packed_end = p.runs[k].packed + p.runs[k].count;
    }
    g.others_begin = other;
    while (other < p.others.size() && p.others[other].offset < g.end) ++other;
    g.others_end = other;
    p.groups.push_back(g);
  }
  OCTET_CHECK(part == p.parts.size() && run == p.runs.size() && other == p.others.size(),
              "every weight within the forward's parameter bounds");
  return p;
}

void* ParameterGather::reserve(std::unique_ptr<Buffer>& buffer, size_t bytes) {
  if (buffer == nullptr || buffer->bytes() < bytes) buffer = model_.backend().allocate(std::max<size_t>(bytes, 1));
  return buffer->data();
}

GatherVolume ParameterGather::volume() {
  const Plan p = plan();
  GatherVolume v;
  v.fp8_bytes = p.codes ? p.code_bounds.back() : 0;
  v.float32_bytes =
      (p.codes ? p.packed_bounds.back() + p.in_place : model_.parameter_count()) * int64_t{sizeof(float)};
  v.fp8_weights = static_cast<int64_t>(p.parts.size());
  v.reshard = reshard_ && p.codes;
  for (const Backend::WeightPart& part : p.parts) {
    v.copy_bytes += part.rows * part.cols * (part.exec->transpose_weight_per_use ? 1 : 2);
  }
  return v;
}

std::vector<Backend::WeightPart> ParameterGather::own_parts(uint8_t** own) {
  const auto rank = static_cast<size_t>(ranks_.rank());
  const int64_t own_begin = plan_.code_bounds[rank];
  *own = static_cast<uint8_t*>(
      reserve(own_codes_, static_cast<size_t>(plan_.code_bounds[rank + 1] - own_begin)));
  std::vector<Backend::WeightPart> parts = plan_.parts;
  for (Backend::WeightPart& part : parts) {
    // An empty part (a weight outside this rank's shard) writes nothing: its codes at the buffer's start.
    part.codes_offset = part.begin < part.end ? part.codes_offset - own_begin : -part.begin;
  }
  return parts;
}

void ParameterGather::cast_parts() {
  Backend& backend = model_.backend();
  float* params = model_.params();
  const Plan& p = plan_;
  auto* packed = static_cast<float*>(reserve(packed_, static_cast<size_t>(p.packed_bounds.back()) * sizeof(float)));
  auto* amaxes = static_cast<float*>(reserve(amaxes_, p.parts.size() * sizeof(float)));
  // This rank's float32 values into its part of the packed runs, and its parts' amaxes.
  const dist::ShardRange mine = dist::shard_range(model_.parameter_count(), ranks_.rank(), ranks_.size());
  for (const Run& run : p.runs) {
    if (run.in_place) continue;
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
  // Each part's codes land in this rank's own codes.
  uint8_t* own = nullptr;
  const std::vector<Backend::WeightPart> parts = own_parts(&own);
  backend.cast_weight_parts(parts, amaxes, own);
}

std::vector<Backend::WeightPart> ParameterGather::parts_from(const Group& g, int64_t at) const {
  std::vector<Backend::WeightPart> parts(plan_.parts.begin() + static_cast<ptrdiff_t>(g.parts_begin),
                                         plan_.parts.begin() + static_cast<ptrdiff_t>(g.parts_end));
  for (Backend::WeightPart& part : parts) part.codes_offset -= at;
  return parts;
}

void ParameterGather::start_codes(Group& g) {
  OCTET_CHECK(!free_buffers_.empty() && g.code_ticket < 0 && !g.held,
              "a free gather buffer for a run's codes");
  g.buffer = free_buffers_.back();
  free_buffers_.pop_back();
  const auto rank = static_cast<size_t>(ranks_.rank());
  const std::vector<int64_t>& bounds = plan_.code_bounds;
  auto* buffer = static_cast<std::byte*>(gather_buffers_[static_cast<size_t>(g.buffer)]->data());
  // This rank's codes of the group, at their place in it.
  const int64_t b = std::max(bounds[rank], g.codes_begin), e = std::min(bounds[rank + 1], g.codes_end);
  if (b < e) {
    model_.backend().copy(buffer + (b - g.codes_begin),
                          static_cast<const std::byte*>(own_codes_->data()) + (b - bounds[rank]),
                          static_cast<size_t>(e - b));
  }
  std::vector<int64_t> parts(bounds.size());
  for (size_t r = 0; r < bounds.size(); ++r)
    parts[r] = std::clamp(bounds[r], g.codes_begin, g.codes_end) - g.codes_begin;
  g.code_ticket = ranks_.start_all_gather_parts(
      std::span<std::byte>(buffer, static_cast<size_t>(g.codes_end - g.codes_begin)), parts,
      model_.backend().native_stream());
}

void ParameterGather::make_copies(Group& g) {
  if (g.held) return;
  if (g.code_ticket < 0) {
    if (free_buffers_.empty()) {
      // Every buffer holds a gather another run waits for: the earliest started is made first.
      Group* earliest = nullptr;
      for (const size_t i : code_groups_) {
        Group& other = plan_.groups[i];
        if (other.code_ticket >= 0 && (earliest == nullptr || other.code_ticket < earliest->code_ticket))
          earliest = &other;
      }
      OCTET_CHECK(earliest != nullptr, "a gather buffer under way where none is free");
      make_copies(*earliest);
    }
    start_codes(g);
  }
  ranks_.wait_gathered(g.code_ticket, model_.backend().native_stream());
  model_.backend().weight_copies_from_codes(
      parts_from(g, g.codes_begin),
      static_cast<const uint8_t*>(gather_buffers_[static_cast<size_t>(g.buffer)]->data()));
  // The buffer is free once the copies made from it are enqueued (a later gather into it waits for them).
  free_buffers_.push_back(g.buffer);
  g.buffer = -1;
  g.code_ticket = -1;
  g.held = true;
}

void ParameterGather::release_copies(Group& g) {
  if (!g.held) return;
  g.held = false;
  if (!reshard_) return;  // the next gather remakes them in place
  const std::vector<Backend::WeightPart> parts = parts_from(g, 0);
  model_.backend().release_weight_copies(parts);
}

void ParameterGather::prefetch(ptrdiff_t from, bool forward) {
  const auto n = static_cast<ptrdiff_t>(code_groups_.size());
  for (ptrdiff_t k = from; k >= 0 && k < n && !free_buffers_.empty(); k += forward ? 1 : -1) {
    Group& g = plan_.groups[code_groups_[static_cast<size_t>(k)]];
    if (!g.held && g.code_ticket < 0) start_codes(g);
  }
}

size_t ParameterGather::code_position(size_t g) const {
  return static_cast<size_t>(std::lower_bound(code_groups_.begin(), code_groups_.end(), g) -
                             code_groups_.begin());
}

void ParameterGather::adopt_copies() {
  if (!reshard_ || model_.weight_copies_made() == copies_seen_) return;
  copies_seen_ = model_.weight_copies_made();
  if (!plan_.codes) return;
  // Codes gathered before the copies were remade are stale: their gathers complete, their buffers free.
  ranks_.finish_gathers();
  for (const size_t i : code_groups_) {
    Group& g = plan_.groups[i];
    if (g.code_ticket < 0) continue;
    free_buffers_.push_back(g.buffer);
    g.buffer = -1;
    g.code_ticket = -1;
  }
  // Every copy is whole and made from the present parameters: this rank's part of each is its own codes.
  uint8_t* own = nullptr;
  const std::vector<Backend::WeightPart> parts = own_parts(&own);
  model_.backend().weight_part_codes(parts, own);
  for (const size_t i : code_groups_) plan_.groups[i].held = true;
}

void ParameterGather::set_plan() {
  plan_ = plan();
  code_groups_.clear();
  int64_t largest = 0;
  for (size_t i = 0; i < plan_.groups.size(); ++i) {
    const Group& g = plan_.groups[i];
    if (g.codes_end == g.codes_begin) continue;
    code_groups_.push_back(i);
    largest = std::max(largest, g.codes_end - g.codes_begin);
  }
  // Each gather buffer as large as the largest group's codes.
  if (!code_groups_.empty()) {
    for (std::unique_ptr<Buffer>& buffer : gather_buffers_) reserve(buffer, static_cast<size_t>(largest));
  }
  free_buffers_.clear();
  for (int b = buffers_ - 1; b >= 0; --b) free_buffers_.push_back(b);
}

std::vector<int64_t> ParameterGather::shard_byte_bounds() const {
  const int64_t total = model_.parameter_count();
  const int n = ranks_.size();
  std::vector<int64_t> bounds(static_cast<size_t>(n) + 1);
  for (int r = 0; r < n; ++r) {
    bounds[static_cast<size_t>(r)] = dist::shard_range(total, r, n).begin * int64_t{sizeof(float)};
  }
  bounds[static_cast<size_t>(n)] = total * int64_t{sizeof(float)};
  return bounds;
}

int64_t ParameterGather::start_range(std::byte* values, const std::vector<int64_t>& bounds, int64_t begin,
                                     int64_t end) {
  if (begin >= end) return -1;
  std::vector<int64_t> parts(bounds.size());
  for (size_t r = 0; r < bounds.size(); ++r) parts[r] = std::clamp(bounds[r], begin, end) - begin;
  return ranks_.start_all_gather_parts(std::span<std::byte>(values + begin, static_cast<size_t>(end - begin)),
                                       parts, model_.backend().native_stream());
}

void ParameterGather::release_stale_masters() {
  std::vector<Backend::Range> stale = stale_ranges();
  // Adjacent ranges as one, so that a page across their boundary goes too.
  std::vector<Backend::Range> merged;
  std::sort(stale.begin(), stale.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  for (const Backend::Range& r : stale) {
    if (!merged.empty() && merged.back().offset + merged.back().count == r.offset) {
      merged.back().count += r.count;
    } else {
      merged.push_back(r);
    }
  }
  if (merged == released_) return;
  restore_masters();
  Buffer& memory = model_.parameter_memory();
  for (const Backend::Range& r : merged) {
    released_bytes_ += memory.release(static_cast<size_t>(r.offset) * sizeof(float),
                                      static_cast<size_t>(r.count) * sizeof(float));
  }
  released_ = std::move(merged);
}

void ParameterGather::restore_masters() {
  if (released_.empty()) return;
  model_.parameter_memory().restore();
  released_.clear();
  released_bytes_ = 0;
}

void ParameterGather::release_before_first_gather() {
  if (started_) return;
  // Nothing reads the masters outside this rank's parts from here on (the copies stand for them), as after
  // a gather of codes.
  if (plan_.groups.empty()) set_plan();
  stale_masters_ = plan_.codes;
  release_stale_masters();
  // Fully sharded: this rank's own codes from the whole copies, which then go until a pass reads them.
  adopt_copies();
  if (reshard_) {
    for (const size_t i : code_groups_) release_copies(plan_.groups[i]);
  }
}

void ParameterGather::start() {
  started_ = true;
  finish();
  adopt_copies();
  // The copies held are of the parameters before the update: given back (reshard), or remade in place.
  for (const size_t i : code_groups_) release_copies(plan_.groups[i]);
  set_plan();
  stale_masters_ = plan_.codes;
  // Before the gathers are enqueued: a float32 gather may write pages given back under an earlier plan.
  release_stale_masters();
  if (plan_.codes) {
    cast_parts();
    std::vector<int64_t> packed_bytes(plan_.packed_bounds.size());
    for (size_t i = 0; i < packed_bytes.size(); ++i)
      packed_bytes[i] = plan_.packed_bounds[i] * int64_t{sizeof(float)};
    auto* packed = static_cast<std::byte*>(packed_->data());
    const std::vector<int64_t> shard_bytes = shard_byte_bounds();
    auto* params = reinterpret_cast<std::byte*>(model_.params());
    // The groups with codes take the gather buffers in turn: the first as many as there are buffers now,
    // each later one as the forward makes the copies of an earlier one (wait).
    for (Group& g : plan_.groups) {
      g.ticket = start_range(packed, packed_bytes, g.packed_begin * int64_t{sizeof(float)},
                             g.packed_end * int64_t{sizeof(float)});
      for (size_t i = g.runs_begin; i < g.runs_end; ++i) {
        const Run& run = plan_.runs[i];
        if (!run.in_place) continue;
        g.ticket = std::max(g.ticket, start_range(params, shard_bytes, run.offset * int64_t{sizeof(float)},
                                                  (run.offset + run.count) * int64_t{sizeof(float)}));
      }
      if (g.codes_end > g.codes_begin && !free_buffers_.empty()) start_codes(g);
    }
  } else {
    // Float32 gathers, in place: each rank's part of a run is its shard's intersection with it.
    const std::vector<int64_t> shard_bytes = shard_byte_bounds();
    auto* params = reinterpret_cast<std::byte*>(model_.params());
    for (Group& g : plan_.groups) {
      g.ticket = start_range(params, shard_bytes, g.begin * int64_t{sizeof(float)}, g.end * int64_t{sizeof(float)});
    }
  }
  next_group_ = 0;
  under_way_ = true;
}

void ParameterGather::remake_copies(const Group& g) {
  Backend& backend = model_.backend();
  float* params = model_.params();
  if (plan_.codes) {
    const auto* packed = static_cast<const float*>(packed_->data());
    for (size_t i = g.runs_begin; i < g.runs_end; ++i) {
      const Run& run = plan_.runs[i];
      if (run.in_place) continue;
      backend.copy(params + run.offset, packed + run.packed, static_cast<size_t>(run.count) * sizeof(float));
    }
  }
  for (size_t i = g.others_begin; i < g.others_end; ++i) {
    const Model::WeightCopySlot& s = plan_.others[i];
    backend.prepare_weight(*s.copy, params + s.offset, s.rows, s.cols, *s.exec);
  }
}

void ParameterGather::complete_group(size_t i, bool copies) {
  Group& g = plan_.groups[i];
  if (g.ticket >= 0) ranks_.wait_gathered(g.ticket, model_.backend().native_stream());
  remake_copies(g);
  if (copies && g.codes_end > g.codes_begin) {
    make_copies(g);
    // Its gather buffer is free again: the next group's gather there.
    prefetch(static_cast<ptrdiff_t>(code_position(i + 1)), true);
  }
}

void ParameterGather::wait(int64_t end) {
  if (!under_way_ && !reshard_) return;
  adopt_copies();
  // The run the forward reads next: the last that begins below `end`.
  const auto& groups = plan_.groups;
  size_t current = 0;
  while (current + 1 < groups.size() && groups[current + 1].begin < end) ++current;
  while (under_way_ && next_group_ <= current) complete_group(next_group_++, !reshard_);
  if (under_way_ && next_group_ == groups.size()) {
    under_way_ = false;
    if (!reshard_) ranks_.finish_gathers();
  }
  if (!reshard_ || code_groups_.empty()) return;
  // The forward is done with the runs before this one; the last run with codes stays for the backward.
  for (const size_t i : code_groups_) {
    if (i < current && i != code_groups_.back()) release_copies(plan_.groups[i]);
  }
  if (groups[current].codes_end > groups[current].codes_begin) make_copies(plan_.groups[current]);
  prefetch(static_cast<ptrdiff_t>(code_position(current + 1)), true);
}

void ParameterGather::wait_backward(int64_t begin) {
  if (!reshard_) return;
  adopt_copies();
  if (under_way_) wait(model_.parameter_count());
  if (code_groups_.empty()) return;
  const auto& groups = plan_.groups;
  size_t current = 0;
  while (current + 1 < groups.size() && groups[current + 1].begin <= begin) ++current;
  OCTET_CHECK(groups[current].begin == begin,
              "the backward's run at parameter {} (one of the forward's bounds)", begin);
  // The backward is done with the runs after this one.
  for (const size_t i : code_groups_) {
    if (i > current) release_copies(plan_.groups[i]);
  }
  if (groups[current].codes_end > groups[current].codes_begin) make_copies(plan_.groups[current]);
  prefetch(static_cast<ptrdiff_t>(code_position(current)) - 1, false);
}

void ParameterGather::finish() {
  // The float32 gathers' values in place; with reshard, the copies of codes still in their gather buffers
  // are made by the pass that reads them (their gathers are complete below).
  while (under_way_ && next_group_ < plan_.groups.size()) complete_group(next_group_++, !reshard_);
  under_way_ = false;
  ranks_.finish_gathers();
}

std::vector<Backend::Range> ParameterGather::stale_ranges() const {
  std::vector<Backend::Range> ranges;
  if (!stale_masters_) return ranges;
  for (const Backend::WeightPart& part : plan_.parts) {
    const int64_t offset = part.weight - model_.params(), n = part.rows * part.cols;
    if (part.begin > 0) ranges.push_back({offset, part.begin});
    if (part.end < n) ranges.push_back({offset + part.end, n - part.end});
  }
  return ranges;
}

void ParameterGather::gather_master_weights() {
  finish();
  if (!stale_masters_) return;
  model_.backend().synchronize();
  restore_masters();
  ranks_.all_gather_shards(std::span<float>(model_.params(), static_cast<size_t>(model_.parameter_count())));
  stale_masters_ = false;
}

std::vector<float> ParameterGather::master_weights(bool keep) {
  finish();
  Backend& backend = model_.backend();
  const int64_t total = model_.parameter_count();
  std::vector<float> host(keep ? static_cast<size_t>(total) : 0);
  if (!stale_masters_) {
    if (keep) backend.copy_to_host(host.data(), model_.params(), host.size() * sizeof(float));
    return host;
  }
  const int n = ranks_.size();
  const int64_t window = std::min<int64_t>(total, int64_t{1} << 26);
  std::unique_ptr<Buffer> staging = backend.allocate(static_cast<size_t>(window) * sizeof(float));
  auto* values = static_cast<std::byte*>(staging->data());
  const dist::ShardRange mine = dist::shard_range(total, ranks_.rank(), n);
  std::vector<int64_t> bounds(static_cast<size_t>(n) + 1);
  for (int64_t a = 0; a < total; a += window) {
    const int64_t b = std::min(a + window, total);
    for (int r = 0; r < n; ++r) {
      bounds[static_cast<size_t>(r)] =
          (std::clamp(dist::shard_range(total, r, n).begin, a, b) - a) * int64_t{sizeof(float)};
    }
    bounds[static_cast<size_t>(n)] = (b - a) * int64_t{sizeof(float)};
    // This rank's part of the window: its shard, always mapped and up to date.
    const int64_t from = std::max(mine.begin, a), to = std::min(mine.end, b);
    if (from < to) {
      backend.copy(staging->floats() + (from - a), model_.params() + from,
                   static_cast<size_t>(to - from) * sizeof(float));
    }
    backend.synchronize();
    ranks_.all_gather_parts(std::span<std::byte>(values, static_cast<size_t>(b - a) * sizeof(float)), bounds);
    if (keep) {
      backend.copy_to_host(host.data() + a, staging->data(), static_cast<size_t>(b - a) * sizeof(float));
    }
  }
  return host;
}

}  // namespace octet
