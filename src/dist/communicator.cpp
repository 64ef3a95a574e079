// How a count of elements is split into the ranks' contiguous shards, and the defaults of the sums started
// during a backward with the traffic they count (see communicator.h).
#include "octet/dist/communicator.h"

#include <algorithm>
#include <vector>

#include "octet/check.h"
#include "octet/numerics/minifloat.h"

namespace octet::dist {

void Communicator::all_gather_shards(std::span<float> values) {
  const auto count = static_cast<int64_t>(values.size());
  const ShardRange mine = shard_range(count, rank(), size());
  std::vector<float> all(static_cast<size_t>(mine.chunk * size()), 0.0f);
  float* chunk = all.data() + mine.chunk * rank();
  std::copy(values.begin() + mine.begin, values.begin() + mine.end, chunk);
  all_gather(std::span<const float>(chunk, static_cast<size_t>(mine.chunk)), std::span<float>(all));
  std::copy_n(all.begin(), values.size(), values.begin());
}

void Communicator::all_gather_parts(std::span<std::byte> values, std::span<const int64_t> bounds) {
  check_part_bounds(bounds, static_cast<int64_t>(values.size()), size());
  int64_t chunk = 0;
  for (int r = 0; r < size(); ++r) chunk = std::max(chunk, bounds[r + 1] - bounds[r]);
  std::vector<std::byte> all(static_cast<size_t>(chunk * size()));
  std::byte* mine = all.data() + chunk * rank();
  std::copy(values.begin() + bounds[rank()], values.begin() + bounds[rank() + 1], mine);
  all_gather(std::span<const std::byte>(mine, static_cast<size_t>(chunk)), std::span<std::byte>(all));
  for (int r = 0; r < size(); ++r) {
    std::copy_n(all.begin() + chunk * r, bounds[r + 1] - bounds[r], values.begin() + bounds[r]);
  }
}

int64_t Communicator::start_all_gather_parts(std::span<std::byte> values, std::span<const int64_t> bounds,
                                             void* stream) {
  (void)stream;
  check_part_bounds(bounds, static_cast<int64_t>(values.size()), size());
  pending_gathers_.push_back({values, std::vector<int64_t>(bounds.begin(), bounds.end())});
  return gathered_ + static_cast<int64_t>(pending_gathers_.size()) - 1;
}

void Communicator::wait_gathered(int64_t ticket, void* stream) {
  (void)stream;
  OCTET_CHECK(ticket >= 0 && ticket < gathered_ + static_cast<int64_t>(pending_gathers_.size()),
              "a gather's ticket {} (started: {})", ticket,
              gathered_ + static_cast<int64_t>(pending_gathers_.size()));
  while (gathered_ <= ticket) {
    const PendingGather g = std::move(pending_gathers_.front());
    pending_gathers_.pop_front();
    ++gathered_;
    all_gather_parts(g.values, g.bounds);
  }
}

void Communicator::finish_gathers() {
  if (!pending_gathers_.empty()) wait_gathered(gathered_ + static_cast<int64_t>(pending_gathers_.size()) - 1, nullptr);
}

void check_part_bounds(std::span<const int64_t> bounds, int64_t count, int ranks) {
  OCTET_CHECK(static_cast<int64_t>(bounds.size()) == ranks + 1 && bounds.front() == 0 && bounds.back() == count &&
                  std::is_sorted(bounds.begin(), bounds.end()),
              "{} part bounds from 0 to {} for {} ranks, none decreasing", ranks + 1, count, ranks);
}

void Communicator::start_all_reduce_sum_bf16(std::span<float> values, void* stream) {
  (void)stream;
  std::vector<uint16_t> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i) codes[i] = float_to_bf16(values[i]);
  all_reduce_sum_bf16(codes);
  for (size_t i = 0; i < values.size(); ++i) values[i] = bf16_to_float(codes[i]);
  count_all_reduce(static_cast<int64_t>(codes.size() * sizeof(uint16_t)));
}

void Communicator::start_all_reduce_sum(std::span<float> values, void* stream) {
  (void)stream;
  all_reduce_sum(values);
  count_all_reduce(static_cast<int64_t>(values.size_bytes()));
}

void Communicator::start_reduce_scatter_sum(std::span<float> values, int64_t offset, int64_t total,
                                            void* stream) {
  (void)stream;
  reduce_scatter_sum_in_place(values, offset, total);
  const ShardPart mine = shard_part(offset, static_cast<int64_t>(values.size()), total, rank(), size());
  count_reduce_scatter(static_cast<int64_t>(values.size_bytes()), mine.size() * int64_t{sizeof(float)});
}

void Communicator::start_reduce_scatter_sum_bf16(std::span<float> values, int64_t offset, int64_t total,
                                                 void* stream) {
  (void)stream;
  std::vector<uint16_t> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i) codes[i] = float_to_bf16(values[i]);
  reduce_scatter_sum_in_place_bf16(codes, offset, total);
  const ShardPart mine = shard_part(offset, static_cast<int64_t>(values.size()), total, rank(), size());
  for (int64_t i = mine.begin; i < mine.end; ++i) {
    values[static_cast<size_t>(i)] = bf16_to_float(codes[static_cast<size_t>(i)]);
  }
  count_reduce_scatter(static_cast<int64_t>(codes.size() * sizeof(uint16_t)),
                       mine.size() * int64_t{sizeof(uint16_t)});
}

void Communicator::start_all_reduce_sum_bf16_codes(std::span<uint16_t> values, void* stream) {
  (void)stream;
  all_reduce_sum_bf16(values);
  count_all_reduce(static_cast<int64_t>(values.size_bytes()));
}

void Communicator::start_reduce_scatter_sum_bf16_codes(std::span<uint16_t> values, int64_t offset,
                                                       int64_t total, void* stream) {
  (void)stream;
  reduce_scatter_sum_in_place_bf16(values, offset, total);
  const ShardPart mine = shard_part(offset, static_cast<int64_t>(values.size()), total, rank(), size());
  count_reduce_scatter(static_cast<int64_t>(values.size_bytes()), mine.size() * int64_t{sizeof(uint16_t)});
}

void Communicator::count_all_reduce(int64_t bytes) {
  const int64_t n = size();
  traffic_.all_reduce_bytes += 2 * bytes * (n - 1) / n;
  ++traffic_.all_reduces;
}

void Communicator::count_reduce_scatter(int64_t bytes, int64_t mine) {
  traffic_.reduce_scatter_bytes += size() > 1 ? bytes - mine : 0;
  ++traffic_.reduce_scatters;
}

ShardRange shard_range(int64_t count, int rank, int ranks) {
  OCTET_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && count >= 0, "rank {} of {} ranks, {} elements", rank,
              ranks, count);
  ShardRange r;
  r.chunk = (count + ranks - 1) / ranks;
  r.begin = std::min(count, r.chunk * rank);
  r.end = std::min(count, r.begin + r.chunk);
  return r;
}

ShardPart shard_part(int64_t offset, int64_t count, int64_t total, int rank, int ranks) {
  OCTET_CHECK(offset >= 0 && count >= 0 && offset + count <= total, "the run [{}, {}) of {} elements", offset,
              offset + count, total);
  const ShardRange shard = shard_range(total, rank, ranks);
  ShardPart part;
  part.begin = std::clamp(shard.begin - offset, int64_t{0}, count);
  part.end = std::clamp(shard.end - offset, int64_t{0}, count);
  return part;
}

}  // namespace octet::dist
