// Communicator::split for communicators without a split of their own (InProcessGroup, SocketGroup): a group
// of the parent's ranks whose collectives are the parent's. Each collective gathers every rank's input over
// the parent (all_gather of bytes) and each rank folds its own group's inputs in group rank order with the
// reductions of rank_order.h, the arithmetic of every CPU communicator: a group's sums are the bits that a
// communicator of its ranks alone gives. Every rank of the parent takes part in every collective, so the
// groups call the same collectives in the same order with the same sizes (the shard groups of a hybrid
// layout do); a rank that fails aborts the parent, and with it every group's collective.
#include <algorithm>
#include <memory>
#include <vector>

#include "octet/check.h"
#include "octet/dist/communicator.h"
#include "rank_order.h"

namespace octet::dist {

namespace {

class Subgroup final : public Communicator {
 public:
  // `members`: the parent's ranks of this group, in group rank order; this rank is members[rank].
  Subgroup(Communicator& parent, std::vector<int> members, int rank)
      : parent_(parent), members_(std::move(members)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  void all_reduce_sum(std::span<float> values) override { fold(values, rank_order::add<float>); }
  void all_reduce_sum(std::span<double> values) override { fold(values, rank_order::add<double>); }
  void all_reduce_sum_bf16(std::span<uint16_t> values) override { fold(values, rank_order::add_bf16); }
  void all_reduce_max(std::span<float> values) override { fold(values, rank_order::max); }

  void reduce_scatter_sum(std::span<const float> send, std::span<float> receive) override {
    OCTET_CHECK(send.size() == receive.size() * members_.size(),
                "reduce_scatter_sum: {} values to send for {} ranks of {}", send.size(), members_.size(),
                receive.size());
    const std::vector<float> all = gather(send);
    const size_t n = receive.size(), offset = n * static_cast<size_t>(rank_);
    std::vector<float> sum(all.begin() + static_cast<std::ptrdiff_t>(at(0, send.size()) + offset),
                           all.begin() + static_cast<std::ptrdiff_t>(at(0, send.size()) + offset + n));
    for (size_t m = 1; m < members_.size(); ++m)
      rank_order::add(sum.data(), all.data() + at(m, send.size()) + offset, n);
    std::copy(sum.begin(), sum.end(), receive.begin());
  }
  void reduce_scatter_sum_in_place(std::span<float> values, int64_t offset, int64_t total) override {
    scatter_in_place(values, offset, total, rank_order::add<float>);
  }
  void reduce_scatter_sum_in_place_bf16(std::span<uint16_t> values, int64_t offset, int64_t total) override {
    scatter_in_place(values, offset, total, rank_order::add_bf16);
  }

  void all_gather(std::span<const float> send, std::span<float> receive) override {
    gather_into(std::as_bytes(send), std::as_writable_bytes(receive));
  }
  void all_gather(std::span<const std::byte> send, std::span<std::byte> receive) override {
    gather_into(send, receive);
  }
  void broadcast(std::span<std::byte> data, int root) override {
    OCTET_CHECK(root >= 0 && root < size(), "broadcast: root {} of {} ranks", root, size());
    const std::vector<std::byte> all = gather(std::span<const std::byte>(data));
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(at(static_cast<size_t>(root), data.size())),
                data.size(), data.begin());
  }
  void barrier() override { parent_.barrier(); }

 private:
  // Where parent rank members_[m]'s `count` values lie in a gather over the parent.
  size_t at(size_t m, size_t count) const { return static_cast<size_t>(members_[m]) * count; }

  // Every parent rank's `values`, in parent rank order.
  template <typename T>
  std::vector<T> gather(std::span<const T> values) {
    std::vector<T> all(values.size() * static_cast<size_t>(parent_.size()));
    parent_.all_gather(std::as_bytes(values), std::as_writable_bytes(std::span<T>(all)));
    return all;
  }

  // values = the group's values folded in group rank order by `add`.
  template <typename T, typename Add>
  void fold(std::span<T> values, Add add) {
    const std::vector<T> all = gather(std::span<const T>(values));
    const size_t n = values.size();
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(at(0, n)), n, values.begin());
    for (size_t m = 1; m < members_.size(); ++m) add(values.data(), all.data() + at(m, n), n);
  }

  template <typename T, typename Add>
  void scatter_in_place(std::span<T> values, int64_t offset, int64_t total, Add add) {
    const ShardPart part = shard_part(offset, static_cast<int64_t>(values.size()), total, rank_, size());
    const std::vector<T> all = gather(std::span<const T>(values));
    const size_t n = values.size(), begin = static_cast<size_t>(part.begin),
                 count = static_cast<size_t>(part.size());
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(at(0, n) + begin), count,
                values.begin() + static_cast<std::ptrdiff_t>(begin));
    for (size_t m = 1; m < members_.size(); ++m)
      add(values.data() + begin, all.data() + at(m, n) + begin, count);
  }

  // receive = the group's sends in group rank order (a send may be its own chunk of receive: it is gathered
  // over the parent before anything is written).
  void gather_into(std::span<const std::byte> send, std::span<std::byte> receive) {
    OCTET_CHECK(receive.size() == send.size() * members_.size(),
                "all_gather: {} bytes to receive from {} ranks of {}", receive.size(), members_.size(),
                send.size());
    const std::vector<std::byte> all = gather(send);
    for (size_t m = 0; m < members_.size(); ++m)
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(at(m, send.size())), send.size(),
                  receive.begin() + static_cast<std::ptrdiff_t>(m * send.size()));
  }

  Communicator& parent_;
  std::vector<int> members_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  OCTET_CHECK(color >= 0, "split: color {} (a group is named by a color of 0 or more)", color);
  // Every rank's (color, key), so that each can tell its group's members and their order.
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size()));
  all_gather(std::as_bytes(std::span<const int32_t>(mine)), std::as_writable_bytes(std::span<int32_t>(all)));
  std::vector<std::pair<int32_t, int>> keyed;  // (key, parent rank) of this rank's group
  for (int r = 0; r < size(); ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) keyed.emplace_back(all[2 * static_cast<size_t>(r) + 1], r);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> members;
  int rank_in_group = 0;
  for (const auto& [k, r] : keyed) {
    if (r == rank()) rank_in_group = static_cast<int>(members.size());
    members.push_back(r);
  }
  return std::make_unique<Subgroup>(*this, std::move(members), rank_in_group);
}

}  // namespace octet::dist
