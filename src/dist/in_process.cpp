// Ranks as threads (see in_process.h). Each collective runs in two phases between barriers: every rank posts
// what it sends and receives, and once all have posted, each computes its own output from the posted inputs,
// in rank order, into a scratch buffer of its own; after a second barrier (no rank reads another's input any
// more) each writes its output. Outputs may therefore overlap inputs (in-place all-reduce and all-gather),
// and every rank computes the same sums in the same order.
#include "octet/dist/in_process.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"
#include "rank_order.h"

namespace octet::dist {

namespace {

// What one rank posted for the collective in progress.
struct Posted {
  CollectiveOp op = CollectiveOp::barrier;
  const void* send = nullptr;
  size_t send_count = 0;
  size_t receive_count = 0;
  int root = 0;
  int64_t offset = 0;  // a reduce-scatter in place: the run's offset in its buffer (receive_count: the total)
};

}  // namespace

struct InProcessGroup::State {
  explicit State(int n) : ranks(n), posted(static_cast<size_t>(n)) {}

  // Waits until every rank has arrived; throws once the group is aborted.
  void arrive() {
    std::unique_lock lock(mutex);
    if (aborted_by >= 0) throw_aborted();
    const uint64_t generation = generations;
    if (++arrived == ranks) {
      arrived = 0;
      ++generations;
      changed.notify_all();
      return;
    }
    changed.wait(lock, [&] { return generations != generation || aborted_by >= 0; });
    if (generations == generation) throw_aborted();
  }

  [[noreturn]] void throw_aborted() const {
    throw Error(ErrorKind::internal,
                fmt::format("a collective was abandoned: rank {} failed ({})", aborted_by, abort_reason));
  }

  const int ranks;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  uint64_t generations = 0;
  int aborted_by = -1;
  std::string abort_reason;
  // Rank r writes posted[r] before the first barrier of a collective and nobody writes it again before the
  // second; the barriers' mutex orders those writes before the other ranks' reads.
  std::vector<Posted> posted;
  std::vector<std::unique_ptr<Communicator>> communicators;
};

namespace {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessGroup::State& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.ranks; }

  void all_reduce_sum(std::span<float> values) override { sum(CollectiveOp::all_reduce_sum_f32, values); }
  void all_reduce_sum(std::span<double> values) override { sum(CollectiveOp::all_reduce_sum_f64, values); }

  void all_reduce_sum_bf16(std::span<uint16_t> values) override {
    reduce(CollectiveOp::all_reduce_sum_bf16, values, rank_order::add_bf16);
  }

  void all_reduce_max(std::span<float> values) override {
    reduce(CollectiveOp::all_reduce_max_f32, values, rank_order::max);
  }

  void reduce_scatter_sum(std::span<const float> send, std::span<float> receive) override {
    OCTET_CHECK(send.size() == receive.size() * static_cast<size_t>(size()),
                "reduce_scatter_sum: {} values sent for {} ranks of {}", send.size(), size(), receive.size());
    std::vector<float> out(receive.size());
    const size_t at = receive.size() * static_cast<size_t>(rank_);
    run({CollectiveOp::reduce_scatter_sum_f32, send.data(), send.size(), receive.size(), 0}, [&] {
      std::copy_n(input<float>(0) + at, out.size(), out.begin());
      for (int r = 1; r < size(); ++r) rank_order::add(out.data(), input<float>(r) + at, out.size());
    });
    std::copy(out.begin(), out.end(), receive.begin());
  }

  void reduce_scatter_sum_in_place(std::span<float> values, int64_t offset, int64_t total) override {
    to_owners(CollectiveOp::reduce_scatter_sum_in_place_f32, values, offset, total, rank_order::add<float>);
  }
  void reduce_scatter_sum_in_place_bf16(std::span<uint16_t> values, int64_t offset, int64_t total) override {
    to_owners(CollectiveOp::reduce_scatter_sum_in_place_bf16, values, offset, total, rank_order::add_bf16);
  }

  void all_gather(std::span<const float> send, std::span<float> receive) override {
    gather(CollectiveOp::all_gather_f32, std::as_bytes(send), std::as_writable_bytes(receive));
  }
  void all_gather(std::span<const std::byte> send, std::span<std::byte> receive) override {
    gather(CollectiveOp::all_gather_bytes, send, receive);
  }

  void broadcast(std::span<std::byte> data, int root) override {
    OCTET_CHECK(root >= 0 && root < size(), "broadcast from rank {} of {}", root, size());
    std::vector<std::byte> out(data.size());
    run({CollectiveOp::broadcast, data.data(), data.size(), data.size(), root}, [&] {
      if (!out.empty()) std::memcpy(out.data(), input<std::byte>(root), out.size());
    });
    std::copy(out.begin(), out.end(), data.begin());
  }

  void barrier() override {
    run({CollectiveOp::barrier, nullptr, 0, 0, 0}, [] {});
  }

 private:
  template <typename T>
  const T* input(int r) const {
    return static_cast<const T*>(group_.posted[static_cast<size_t>(r)].send);
  }

  // Posts, waits for every rank, checks that all posted the same collective, computes this rank's output
  // into its scratch (compute), and waits until every rank has done so.
  template <typename Compute>
  void run(const Posted& mine, Compute compute) {
    group_.posted[static_cast<size_t>(rank_)] = mine;
    group_.arrive();
    const Posted& first = group_.posted[0];
    for (int r = 1; r < size(); ++r) {
      const Posted& p = group_.posted[static_cast<size_t>(r)];
      if (p.op != first.op || p.send_count != first.send_count || p.receive_count != first.receive_count ||
          p.root != first.root || p.offset != first.offset) {
        // Every rank sees the same posts and throws the same error; none waits at the second barrier.
        throw Error(ErrorKind::internal,
                    fmt::format("the ranks disagree on a collective: rank 0 called {} with {} values (to {}, "
                                "root {}), rank {} called {} with {} values (to {}, root {})",
                                collective_name(first.op), first.send_count, first.receive_count, first.root, r,
                                collective_name(p.op), p.send_count, p.receive_count, p.root));
      }
    }
    compute();
    group_.arrive();
  }

  template <typename T>
  void sum(CollectiveOp op, std::span<T> values) {
    reduce(op, values, rank_order::add<T>);
  }

  // values = fold(fold(rank 0's, rank 1's), rank 2's) ..., each rank computing the same.
  template <typename T, typename Fold>
  void reduce(CollectiveOp op, std::span<T> values, Fold fold) {
    std::vector<T> out(values.size());
    run({op, values.data(), values.size(), values.size(), 0}, [&] {
      std::copy_n(input<T>(0), out.size(), out.begin());
      for (int r = 1; r < size(); ++r) fold(out.data(), input<T>(r), out.size());
    });
    std::copy(out.begin(), out.end(), values.begin());
  }

  // This rank's part of `values` (shard_part) = the fold of every rank's same part, in rank order; the rest
  // is left as it is. Each rank reads only its part of the others' values.
  template <typename T, typename Fold>
  void to_owners(CollectiveOp op, std::span<T> values, int64_t offset, int64_t total, Fold fold) {
    const ShardPart mine = shard_part(offset, static_cast<int64_t>(values.size()), total, rank_, size());
    const auto at = static_cast<size_t>(mine.begin);
    std::vector<T> out(static_cast<size_t>(mine.size()));
    run({op, values.data(), values.size(), static_cast<size_t>(total), 0, offset}, [&] {
      std::copy_n(input<T>(0) + at, out.size(), out.begin());
      for (int r = 1; r < size(); ++r) fold(out.data(), input<T>(r) + at, out.size());
    });
    std::copy(out.begin(), out.end(), values.begin() + static_cast<ptrdiff_t>(at));
  }

  void gather(CollectiveOp op, std::span<const std::byte> send, std::span<std::byte> receive) {
    OCTET_CHECK(receive.size() == send.size() * static_cast<size_t>(size()),
                "all_gather: {} bytes from each of {} ranks into {}", send.size(), size(), receive.size());
    std::vector<std::byte> out(receive.size());
    run({op, send.data(), send.size(), receive.size(), 0}, [&] {
      for (int r = 0; r < size(); ++r) {
        if (!send.empty())
          std::memcpy(out.data() + send.size() * static_cast<size_t>(r), input<std::byte>(r), send.size());
      }
    });
    std::copy(out.begin(), out.end(), receive.begin());
  }

  InProcessGroup::State& group_;
  int rank_;
};

}  // namespace

InProcessGroup::InProcessGroup(int ranks) {
  OCTET_REQUIRE(ranks >= 1, "a group of at least one rank, got {}", ranks);
  state_ = std::make_unique<State>(ranks);
  for (int r = 0; r < ranks; ++r) {
    state_->communicators.push_back(std::make_unique<InProcessCommunicator>(*state_, r));
  }
}

InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::size() const {
  return state_->ranks;
}

Communicator& InProcessGroup::communicator(int rank) {
  OCTET_CHECK(rank >= 0 && rank < state_->ranks, "rank {} of a group of {}", rank, state_->ranks);
  return *state_->communicators[static_cast<size_t>(rank)];
}

void InProcessGroup::abort(int rank, const std::string& reason) {
  std::lock_guard lock(state_->mutex);
  if (state_->aborted_by >= 0) return;
  state_->aborted_by = rank;
  state_->abort_reason = reason;
  state_->changed.notify_all();
}

int InProcessGroup::aborted_by() const {
  std::lock_guard lock(state_->mutex);
  return state_->aborted_by;
}

void run_ranks(int ranks, const std::function<void(Communicator&)>& body) {
  InProcessGroup group(ranks);
  std::vector<std::exception_ptr> failures(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(group.communicator(r));
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = std::current_exception();
        group.abort(r, e.what());
      } catch (...) {
        failures[static_cast<size_t>(r)] = std::current_exception();
        group.abort(r, "an exception that is not a std::exception");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (group.aborted_by() >= 0) std::rethrow_exception(failures[static_cast<size_t>(group.aborted_by())]);
}

}  // namespace octet::dist
