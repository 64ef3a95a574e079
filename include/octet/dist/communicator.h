// The collectives that data-parallel and sharded training need, behind one interface: NCCL will implement it
// on GPUs, and InProcessGroup (in_process.h) implements it for ranks that are threads of one process, with a
// fixed reduction order, so that the CPU shows what every rank computes bit for bit.
//
// Every rank of a group calls the same collectives in the same order with the same sizes; a collective
// returns on a rank once that rank's output is complete. The spans lie in the memory of the backend the
// ranks train on (host memory for the CPU backend). Sums are taken in a fixed order, the same on every rank:
// rank 0's value, plus rank 1's, plus rank 2's, and so on, in the span's own type, so that every rank holds
// the same bits and a run repeats exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

namespace octet::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // values[i] = the sum over ranks, in rank order, of each rank's values[i].
  virtual void all_reduce_sum(std::span<float> values) = 0;
  virtual void all_reduce_sum(std::span<double> values) = 0;
  // The same over BF16 codes: rank 0's value, then each next rank's added in float32 and the sum rounded to
  // BF16 (to nearest even) after every addition, as a BF16 all-reduce rounds at every hop.
  virtual void all_reduce_sum_bf16(std::span<uint16_t> values) = 0;
  // values[i] = the largest of the ranks' values[i], NaN where any rank's is NaN (amaxes: a NaN amax must
  // reach every rank, as it would have reached one rank casting the whole batch).
  virtual void all_reduce_max(std::span<float> values) = 0;
  // `send` holds size() chunks of receive.size() values; rank r receives the sum over ranks, in rank order,
  // of chunk r.
  virtual void reduce_scatter_sum(std::span<const float> send, std::span<float> receive) = 0;
  // A reduce-scatter in place over shards of unequal sizes, for a sharded optimizer's gradients: `values` is
  // the run [offset, offset + values.size()) of a buffer of `total` elements that the ranks share out as
  // shard_range(total, r, size()). Rank r's part of the run (shard_part: the run's intersection with rank r's
  // shard, possibly empty) is summed over the ranks into rank r alone: afterwards this rank's part holds the
  // sum over ranks in rank order, the bits all_reduce_sum gives there, and the rest of `values` is not
  // summed (it may hold anything; read none of it). Every rank passes the same offset, size and total.
  virtual void reduce_scatter_sum_in_place(std::span<float> values, int64_t offset, int64_t total) = 0;
  // The same over BF16 codes, each partial sum rounded as all_reduce_sum_bf16 rounds.
  virtual void reduce_scatter_sum_in_place_bf16(std::span<uint16_t> values, int64_t offset,
                                                int64_t total) = 0;
  // `receive` holds size() chunks of send.size() values: chunk r is rank r's `send`. `send` may be chunk
  // rank() of `receive` itself (gathering in place).
  virtual void all_gather(std::span<const float> send, std::span<float> receive) = 0;
  virtual void all_gather(std::span<const std::byte> send, std::span<std::byte> receive) = 0;
  // Every rank's `data` becomes rank root's.
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;

  // Sums that overlap with a backend's work. start_all_reduce_sum enqueues all_reduce_sum(values) to run once
  // the work enqueued so far on `stream` (Backend::native_stream) is done and returns at once; its result is
  // there once finish_started() has returned, which waits for every sum started. Every rank starts the same
  // sums in the same order. A communicator without streams of its own sums at once (the default).
  virtual void start_all_reduce_sum(std::span<float> values, void* stream);
  // The same sum in BF16: `values` (float32) rounded to BF16, summed as all_reduce_sum_bf16 sums, and the
  // BF16 sums written back as float32. The default rounds, sums and widens at once, in host memory, with the
  // rank-order additions of all_reduce_sum_bf16.
  virtual void start_all_reduce_sum_bf16(std::span<float> values, void* stream);
  // A sharded optimizer's sums, started alike: reduce_scatter_sum_in_place(values, offset, total) once the
  // work enqueued on `stream` is done, its result there after finish_started(). About half the bytes of
  // start_all_reduce_sum on the wire. The default sums at once.
  virtual void start_reduce_scatter_sum(std::span<float> values, int64_t offset, int64_t total, void* stream);
  // The same in BF16: `values` rounded to BF16, this rank's part summed as reduce_scatter_sum_in_place_bf16
  // sums and written back as float32 (the rest of `values` is not summed). The default does it at once, in
  // host memory.
  virtual void start_reduce_scatter_sum_bf16(std::span<float> values, int64_t offset, int64_t total,
                                             void* stream);
  // The same two over gradients kept as BF16 codes (train.weight_gradients = "bf16"): all_reduce_sum_bf16
  // and reduce_scatter_sum_in_place_bf16 of `values` in place, started alike, with no rounding or widening
  // around them. The defaults sum at once.
  virtual void start_all_reduce_sum_bf16_codes(std::span<uint16_t> values, void* stream);
  virtual void start_reduce_scatter_sum_bf16_codes(std::span<uint16_t> values, int64_t offset, int64_t total,
                                                   void* stream);
  virtual void finish_started() {}

  // What this rank has sent for the sums started above (the start_ functions), counted as a ring sends: an
  // all-reduce of B bytes over n ranks sends 2 B (n - 1) / n of them, a reduce-scatter B less this rank's
  // part. A model of the wire, the same for every communicator (NCCL may choose a tree or, for the parts of
  // a reduce-scatter, a chain), so that a run can say what its sums move; counted since the communicator
  // was made. What the communicator does without its stream (the collectives above) is not counted.
  struct Traffic {
    int64_t all_reduce_bytes = 0;
    int64_t reduce_scatter_bytes = 0;
    int64_t all_reduces = 0;      // sums started
    int64_t reduce_scatters = 0;  // reduce-scatters started
  };
  const Traffic& traffic() const { return traffic_; }

  // `values` is split into every rank's shard (shard_range of values.size() over the ranks), this rank's up
  // to date: afterwards every shard is, on every rank. In place, whatever the shards' sizes. The default
  // gathers through all_gather over a copy padded to whole chunks, in the communicator's memory.
  virtual void all_gather_shards(std::span<float> values);
  // `values` is split into the ranks' parts, rank r's being bytes bounds[r] .. bounds[r + 1] - 1 (size() + 1
  // bounds, from 0 to values.size(), none decreasing), this rank's up to date: afterwards every part is, on
  // every rank. In place, whatever the parts' sizes. The default gathers through all_gather over a copy
  // padded to the largest part, in the communicator's memory.
  virtual void all_gather_parts(std::span<std::byte> values, std::span<const int64_t> bounds);

  // Gathers that overlap with a backend's work (a sharded optimizer's parameters, gathered while the next
  // step's forward runs). start_all_gather_parts enqueues all_gather_parts(values, bounds) to run once the
  // work enqueued so far on `stream` (Backend::native_stream) is done, and returns at once with the gather's
  // ticket (0, 1, 2, ... in the order started). wait_gathered(ticket, stream) makes the work enqueued on
  // `stream` after it wait for that gather and every one started before it, without waiting on the host;
  // finish_gathers() returns once every gather started is complete. Until a gather is waited for, its values
  // may hold anything: read none of them. Every rank starts the same gathers in the same order and waits for
  // them at the same points. The default (a communicator without streams) runs a gather when it is waited
  // for, so that reading values before waiting shows.
  virtual int64_t start_all_gather_parts(std::span<std::byte> values, std::span<const int64_t> bounds,
                                         void* stream);
  virtual void wait_gathered(int64_t ticket, void* stream);
  virtual void finish_gathers();

  // A communicator of the ranks that pass the same `color` (0 or more), ranked by `key` (ties by rank here),
  // for collectives within groups of ranks: a hybrid layout's shard groups (topology.h). Collective: every
  // rank calls it. Sums over a group are taken in the group's rank order, as over any communicator. The
  // default builds each group's collectives out of this communicator's own (src/dist/subgroup.cpp): every
  // rank of this communicator takes part in each, so the groups must call the same collectives in the same
  // order with the same sizes, as shard groups do; a rank that fails aborts them all through this one, which
  // must outlive the groups. NCCL splits its communicator (ncclCommSplit).
  virtual std::unique_ptr<Communicator> split(int color, int key);

 protected:
  // What the start_ functions add to traffic(): an all-reduce of `bytes`, a reduce-scatter of `bytes` of
  // which `mine` are this rank's part.
  void count_all_reduce(int64_t bytes);
  void count_reduce_scatter(int64_t bytes, int64_t mine);

 private:
  // The default's gathers started and not yet run, in order, the first of ticket gathered_.
  struct PendingGather {
    std::span<std::byte> values;
    std::vector<int64_t> bounds;
  };
  std::deque<PendingGather> pending_gathers_;
  int64_t gathered_ = 0;  // the ticket of the first gather not yet run
  Traffic traffic_;
};

// The contiguous run of `count` elements that rank `rank` of `ranks` owns when they are split as evenly as
// the count allows, in rank order: every rank but the last holds ceil(count / ranks) elements (the chunk),
// and the last holds what remains (possibly fewer, possibly none).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t chunk = 0;  // ceil(count / ranks): the padded size every rank's shard occupies in a gather
  int64_t size() const { return end - begin; }
};
ShardRange shard_range(int64_t count, int rank, int ranks);

// Checks the bounds of Communicator::all_gather_parts: ranks + 1 offsets from 0 to count, none decreasing.
void check_part_bounds(std::span<const int64_t> bounds, int64_t count, int ranks);

// Rank `rank`'s part of the run [offset, offset + count) of a buffer of `total` elements shared out as
// shard_range(total, r, ranks): the run's intersection with the rank's shard, counted from the run's start
// ([begin, end), empty where they do not meet). The ranks' parts lie in rank order and cover the run.
struct ShardPart {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
ShardPart shard_part(int64_t offset, int64_t count, int64_t total, int rank, int ranks);

}  // namespace octet::dist
