// Communicator::split over ranks as threads: each group's collectives hold the folds of its own ranks' inputs
// in group rank order (the rank-order arithmetic of communicator.h, computed here on one thread), for groups
// of consecutive ranks (a hybrid layout's shard groups), of interleaved ranks and ordered by a key; a rank
// that fails ends every group's collectives, and groups that disagree on a size get an error, not a hang.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/dist/in_process.h"
#include "octet/numerics/minifloat.h"

namespace octet::dist {
namespace {

// Parent rank p's inputs: normal floats of varied magnitudes, where the order of additions shows in the bits.
std::vector<float> floats_of(int p, size_t n, uint32_t what) {
  std::mt19937 gen(what * 100 + static_cast<uint32_t>(p) + 1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 30) - 15);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A split of `world` ranks: each rank's color and key.
struct Split {
  int world;
  int (*color)(int rank);
  int (*key)(int rank);
  std::string name;
};

// The parent ranks of `rank`'s group, in group rank order (by key, then by rank).
std::vector<int> members_of(const Split& s, int rank) {
  std::vector<std::pair<int, int>> keyed;
  for (int r = 0; r < s.world; ++r) {
    if (s.color(r) == s.color(rank)) keyed.emplace_back(s.key(r), r);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> members;
  for (const auto& [k, r] : keyed) members.push_back(r);
  return members;
}

// What one rank receives from each collective of its group.
struct Received {
  int rank = -1, size = 0;
  std::vector<float> sum, max, scattered, owned, gathered, shards;
  std::vector<double> sum64;
  std::vector<uint16_t> sum_bf16, owned_bf16;
  std::vector<std::byte> broadcast;
};

constexpr size_t kN = 23;  // values per rank of the sums
constexpr int64_t kRunOffset = 3,
                  kTotal = 29;  // the run [3, 23) of a buffer of 29, reduce-scattered in place

Received every_collective(Communicator& g, int p) {
  Received r;
  r.rank = g.rank();
  r.size = g.size();
  r.sum = floats_of(p, kN, 1);
  g.all_reduce_sum(std::span<float>(r.sum));
  r.sum64 = {p * 0.1, 1e300 / (p + 1), 1.0 / 3.0 * p};
  g.all_reduce_sum(std::span<double>(r.sum64));
  for (const float x : floats_of(p, kN, 2)) r.sum_bf16.push_back(float_to_bf16(x));
  g.all_reduce_sum_bf16(r.sum_bf16);
  r.max = floats_of(p, kN, 3);
  if (p == 1) r.max[4] = std::numeric_limits<float>::quiet_NaN();
  g.all_reduce_max(std::span<float>(r.max));
  const std::vector<float> send = floats_of(p, 5 * static_cast<size_t>(g.size()), 4);
  r.scattered.resize(5);
  g.reduce_scatter_sum(send, r.scattered);
  std::vector<float> run = floats_of(p, 20, 5);
  g.reduce_scatter_sum_in_place(run, kRunOffset, kTotal);
  std::vector<uint16_t> run_bf16;
  for (const float x : floats_of(p, 20, 6)) run_bf16.push_back(float_to_bf16(x));
  g.reduce_scatter_sum_in_place_bf16(run_bf16, kRunOffset, kTotal);
  const ShardPart mine = shard_part(kRunOffset, 20, kTotal, g.rank(), g.size());
  r.owned.assign(run.begin() + mine.begin, run.begin() + mine.end);
  r.owned_bf16.assign(run_bf16.begin() + mine.begin, run_bf16.begin() + mine.end);
  // In place: this rank's chunk of the receive buffer is its send.
  r.gathered.assign(4 * static_cast<size_t>(g.size()), 0.0f);
  const std::vector<float> part = floats_of(p, 4, 7);
  std::copy(part.begin(), part.end(), r.gathered.begin() + 4 * g.rank());
  g.all_gather(std::span<const float>(r.gathered.data() + 4 * g.rank(), 4), std::span<float>(r.gathered));
  // 13 parameters over the group's ranks: this rank's shard is its own values, the rest stale.
  r.shards.assign(13, -1.0f);
  const ShardRange shard = shard_range(13, g.rank(), g.size());
  const std::vector<float> fresh = floats_of(p, 13, 8);
  std::copy(fresh.begin() + shard.begin, fresh.begin() + shard.end, r.shards.begin() + shard.begin);
  g.all_gather_shards(std::span<float>(r.shards));
  r.broadcast.assign(9, std::byte{static_cast<unsigned char>(p)});
  g.broadcast(r.broadcast, g.size() - 1);
  g.barrier();
  return r;
}

// What rank `rank` must receive: its group's inputs folded in group rank order, on this thread.
Received expected(const Split& s, int rank) {
  const std::vector<int> members = members_of(s, rank);
  const int n = static_cast<int>(members.size());
  Received e;
  e.size = n;
  e.rank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  e.sum = floats_of(members[0], kN, 1);
  e.sum64 = {members[0] * 0.1, 1e300 / (members[0] + 1), 1.0 / 3.0 * members[0]};
  for (const float x : floats_of(members[0], kN, 2)) e.sum_bf16.push_back(float_to_bf16(x));
  e.max = floats_of(members[0], kN, 3);
  e.scattered.assign(5, 0.0f);
  const std::vector<float> first_send = floats_of(members[0], 5 * static_cast<size_t>(n), 4);
  std::copy_n(first_send.begin() + 5 * e.rank, 5, e.scattered.begin());
  const ShardPart mine = shard_part(kRunOffset, 20, kTotal, e.rank, n);
  const std::vector<float> first_run = floats_of(members[0], 20, 5);
  e.owned.assign(first_run.begin() + mine.begin, first_run.begin() + mine.end);
  for (int64_t i = mine.begin; i < mine.end; ++i)
    e.owned_bf16.push_back(float_to_bf16(floats_of(members[0], 20, 6)[static_cast<size_t>(i)]));
  for (size_t m = 0; m < members.size(); ++m) {
    const int p = members[m];
    std::vector<float> mx = floats_of(p, kN, 3);
    if (p == 1) mx[4] = std::numeric_limits<float>::quiet_NaN();
    if (m == 0) {
      e.max = mx;
      continue;
    }
    const std::vector<float> sum = floats_of(p, kN, 1), bf = floats_of(p, kN, 2);
    for (size_t i = 0; i < kN; ++i) {
      e.sum[i] = e.sum[i] + sum[i];
      e.sum_bf16[i] = float_to_bf16(bf16_to_float(e.sum_bf16[i]) + bf16_to_float(float_to_bf16(bf[i])));
      if (!std::isnan(e.max[i]) && (std::isnan(mx[i]) || mx[i] > e.max[i])) e.max[i] = mx[i];
    }
    const std::vector<double> d = {p * 0.1, 1e300 / (p + 1), 1.0 / 3.0 * p};
    for (size_t i = 0; i < d.size(); ++i) e.sum64[i] = e.sum64[i] + d[i];
    const std::vector<float> send = floats_of(p, 5 * static_cast<size_t>(n), 4);
    for (size_t i = 0; i < 5; ++i)
      e.scattered[i] = e.scattered[i] + send[5 * static_cast<size_t>(e.rank) + i];
    const std::vector<float> run = floats_of(p, 20, 5), run_bf16 = floats_of(p, 20, 6);
    for (int64_t i = mine.begin; i < mine.end; ++i) {
      const auto j = static_cast<size_t>(i - mine.begin);
      e.owned[j] = e.owned[j] + run[static_cast<size_t>(i)];
      e.owned_bf16[j] = float_to_bf16(bf16_to_float(e.owned_bf16[j]) +
                                      bf16_to_float(float_to_bf16(run_bf16[static_cast<size_t>(i)])));
    }
  }
  for (const int p : members) {
    const std::vector<float> part = floats_of(p, 4, 7);
    e.gathered.insert(e.gathered.end(), part.begin(), part.end());
  }
  e.shards.assign(13, 0.0f);
  for (int g = 0; g < n; ++g) {
    const ShardRange shard = shard_range(13, g, n);
    const std::vector<float> fresh = floats_of(members[static_cast<size_t>(g)], 13, 8);
    std::copy(fresh.begin() + shard.begin, fresh.begin() + shard.end, e.shards.begin() + shard.begin);
  }
  e.broadcast.assign(9, std::byte{static_cast<unsigned char>(members.back())});
  return e;
}

std::vector<Split> splits() {
  return {
      // A hybrid layout's shard groups: dp_shard = 2, dp_replicate = 2; and dp_shard = 3, dp_replicate = 2.
      {4, [](int r) { return r / 2; }, [](int r) { return r % 2; }, "2 groups of 2 consecutive ranks"},
      {6, [](int r) { return r / 3; }, [](int r) { return r % 3; }, "2 groups of 3 consecutive ranks"},
      // Interleaved ranks, ordered by a key that reverses them; and one group of every rank. (Groups of
      // unequal sizes cannot call the same collectives with the same sizes: communicator.h.)
      {6, [](int r) { return r % 2; }, [](int r) { return -r; }, "even and odd ranks, reversed"},
      {3, [](int) { return 7; }, [](int) { return 0; }, "one group of every rank"},
  };
}

TEST(Split, EachGroupsCollectivesFoldItsRanksInGroupRankOrder) {
  for (const Split& s : splits()) {
    std::vector<Received> got(static_cast<size_t>(s.world));
    std::mutex mutex;
    run_ranks(s.world, [&](Communicator& c) {
      const std::unique_ptr<Communicator> group = c.split(s.color(c.rank()), s.key(c.rank()));
      Received r = every_collective(*group, c.rank());
      std::lock_guard lock(mutex);
      got[static_cast<size_t>(c.rank())] = std::move(r);
    });
    for (int p = 0; p < s.world; ++p) {
      const Received& a = got[static_cast<size_t>(p)];
      const Received e = expected(s, p);
      const std::string who = s.name + ", rank " + std::to_string(p);
      EXPECT_EQ(a.rank, e.rank) << who;
      EXPECT_EQ(a.size, e.size) << who;
      EXPECT_TRUE(same_bits(a.sum, e.sum)) << who;
      EXPECT_EQ(a.sum64, e.sum64) << who;
      EXPECT_EQ(a.sum_bf16, e.sum_bf16) << who;
      EXPECT_TRUE(same_bits(a.max, e.max)) << who;
      EXPECT_TRUE(same_bits(a.scattered, e.scattered)) << who;
      EXPECT_TRUE(same_bits(a.owned, e.owned)) << who;
      EXPECT_EQ(a.owned_bf16, e.owned_bf16) << who;
      EXPECT_TRUE(same_bits(a.gathered, e.gathered)) << who;
      EXPECT_TRUE(same_bits(a.shards, e.shards)) << who;
      EXPECT_EQ(a.broadcast, e.broadcast) << who;
      // Not vacuous: a group of several ranks sums, and NaN reaches the group of rank 1 only.
      if (e.size > 1) {
        EXPECT_NE(a.sum[0], floats_of(p, 1, 1)[0]) << who;
      }
      const std::vector<int> members = members_of(s, p);
      EXPECT_EQ(std::isnan(a.max[4]), std::find(members.begin(), members.end(), 1) != members.end()) << who;
    }
  }
}

TEST(Split, ARankThatFailsEndsEveryGroupsCollectives) {
  // Rank 3 (of the second group) fails before its group's sum; the first group's ranks, which never wait
  // for it in a collective of their own group, are stopped all the same, and nothing hangs.
  try {
    run_ranks(4, [&](Communicator& c) {
      const std::unique_ptr<Communicator> group = c.split(c.rank() / 2, c.rank() % 2);
      if (c.rank() == 3) throw Error(ErrorKind::invalid_input, "rank 3 fails");
      std::vector<float> v(3, 1.0f);
      group->all_reduce_sum(std::span<float>(v));
      group->barrier();
    });
    ADD_FAILURE() << "expected the failing rank's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 fails"), std::string::npos) << e.what();
  }
}

TEST(Split, GroupsThatDisagreeOnASizeGetAnErrorNotAHang) {
  EXPECT_THROW(run_ranks(4,
                         [&](Communicator& c) {
                           const std::unique_ptr<Communicator> group = c.split(c.rank() / 2, c.rank() % 2);
                           std::vector<float> v(c.rank() < 2 ? 3 : 5, 1.0f);
                           group->all_reduce_sum(std::span<float>(v));
                         }),
               Error);
}

}  // namespace
}  // namespace octet::dist
