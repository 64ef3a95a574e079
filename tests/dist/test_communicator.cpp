// The in-process communicator: exact sums of small integers, sums in rank order (so that every rank and every
// run holds the same bits), NaN-propagating maxima, the scatter and gather collectives, one clear error when
// ranks disagree, no hang when a rank fails; and how shards and layouts are laid out.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/dist/in_process.h"
#include "octet/dist/topology.h"
#include "octet/numerics/minifloat.h"

namespace octet::dist {
namespace {

// What every rank ended with, by rank.
template <typename T>
struct PerRank {
  explicit PerRank(int ranks) : values(static_cast<size_t>(ranks)) {}
  void put(int rank, std::vector<T> v) {
    std::lock_guard lock(mutex);
    values[static_cast<size_t>(rank)] = std::move(v);
  }
  std::mutex mutex;
  std::vector<std::vector<T>> values;
};

class Ranks : public ::testing::TestWithParam<int> {};

TEST_P(Ranks, AllReduceSumOfSmallIntegersIsExact) {
  const int n = GetParam();
  PerRank<float> out(n);
  PerRank<double> out64(n);
  run_ranks(n, [&](Communicator& c) {
    EXPECT_EQ(c.size(), n);
    std::vector<float> v(37);
    std::vector<double> w(5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((c.rank() + 1) * static_cast<int>(i) - 7);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(c.rank() * 1000 + static_cast<int>(i));
    c.all_reduce_sum(std::span<float>(v));
    c.all_reduce_sum(std::span<double>(w));
    out.put(c.rank(), v);
    out64.put(c.rank(), w);
  });
  const int triangle = n * (n + 1) / 2;  // 1 + 2 + ... + n
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 37; ++i) {
      EXPECT_EQ(out.values[static_cast<size_t>(r)][i],
                static_cast<float>(triangle * static_cast<int>(i) - 7 * n))
          << "rank " << r << " element " << i;
    }
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(out64.values[static_cast<size_t>(r)][i],
                1000.0 * (n * (n - 1) / 2) + n * static_cast<double>(i));
    }
  }
}

TEST_P(Ranks, SumsInRankOrderOnEveryRankAndEveryRun) {
  // Random values of wildly different sizes, where the order of float32 additions shows in the bits.
  const int n = GetParam();
  auto values_of = [](int rank) {
    std::mt19937 rng(static_cast<unsigned>(100 + rank));
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::vector<float> v(1000);
    for (float& x : v) x = unit(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    return v;
  };
  std::vector<float> expected = values_of(0);
  for (int r = 1; r < n; ++r) {
    const std::vector<float> v = values_of(r);
    for (size_t i = 0; i < v.size(); ++i) expected[i] = expected[i] + v[i];
  }
  // The order matters for these values: summing from the last rank down differs somewhere (not with 2
  // ranks, whose one addition commutes).
  if (n > 2) {
    std::vector<float> reversed = values_of(n - 1);
    for (int r = n - 2; r >= 0; --r) {
      const std::vector<float> v = values_of(r);
      for (size_t i = 0; i < v.size(); ++i) reversed[i] = reversed[i] + v[i];
    }
    ASSERT_NE(std::memcmp(reversed.data(), expected.data(), expected.size() * sizeof(float)), 0);
  }
  for (int run = 0; run < 3; ++run) {
    PerRank<float> out(n);
    run_ranks(n, [&](Communicator& c) {
      std::vector<float> v = values_of(c.rank());
      c.all_reduce_sum(std::span<float>(v));
      out.put(c.rank(), v);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(std::memcmp(out.values[static_cast<size_t>(r)].data(), expected.data(),
                            expected.size() * sizeof(float)),
                0)
          << "rank " << r << ", run " << run;
    }
  }
}

TEST_P(Ranks, Bf16SumsRoundAfterEveryAddition) {
  // Rank 0 holds 1, every other rank 2^-8: half a BF16 unit of 1 each, so every addition rounds back to 1
  // (to even), where a float32 sum rounded once at the end would reach 1 + 2^-7 from 3 ranks on. The second
  // element is exact: small integers.
  const int n = GetParam();
  PerRank<uint16_t> out(n);
  run_ranks(n, [&](Communicator& c) {
    std::vector<uint16_t> v = {float_to_bf16(c.rank() == 0 ? 1.0f : 0x1p-8f),
                               float_to_bf16(static_cast<float>(c.rank() + 1))};
    c.all_reduce_sum_bf16(v);
    out.put(c.rank(), v);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bf16_to_float(out.values[static_cast<size_t>(r)][0]), 1.0f);
    EXPECT_EQ(bf16_to_float(out.values[static_cast<size_t>(r)][1]), static_cast<float>(n * (n + 1) / 2));
  }
}

TEST_P(Ranks, MaxPropagatesNaN) {
  const int n = GetParam();
  PerRank<float> out(n);
  run_ranks(n, [&](Communicator& c) {
    const float r = static_cast<float>(c.rank());
    std::vector<float> v = {r, -r, c.rank() == n - 1 ? NAN : 1.0f, 0.0f,
                            c.rank() == 0 ? std::numeric_limits<float>::infinity() : r};
    c.all_reduce_max(std::span<float>(v));
    out.put(c.rank(), v);
  });
  for (int r = 0; r < n; ++r) {
    const std::vector<float>& v = out.values[static_cast<size_t>(r)];
    EXPECT_EQ(v[0], static_cast<float>(n - 1));
    EXPECT_EQ(v[1], 0.0f);
    EXPECT_TRUE(std::isnan(v[2])) << "a NaN on one rank reaches every rank";
    EXPECT_EQ(v[3], 0.0f);
    EXPECT_EQ(v[4], std::numeric_limits<float>::infinity());
  }
}

TEST_P(Ranks, ReduceScatterGatherAndBroadcast) {
  const int n = GetParam();
  const size_t chunk = 3;
  PerRank<float> scattered(n), gathered(n);
  PerRank<std::byte> bytes(n), broadcast(n);
  run_ranks(n, [&](Communicator& c) {
    std::vector<float> send(chunk * static_cast<size_t>(n));
    for (size_t i = 0; i < send.size(); ++i)
      send[i] = static_cast<float>(100 * c.rank() + static_cast<int>(i));
    std::vector<float> mine(chunk);
    c.reduce_scatter_sum(send, mine);
    scattered.put(c.rank(), mine);
    // In place: this rank's chunk of the gathered buffer is what it sends.
    std::vector<float> all(chunk * static_cast<size_t>(n), -1.0f);
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(chunk * c.rank()));
    c.all_gather(std::span<const float>(all.data() + chunk * c.rank(), chunk), std::span<float>(all));
    gathered.put(c.rank(), all);
    const std::byte b{static_cast<unsigned char>(c.rank() + 1)};
    std::vector<std::byte> every(static_cast<size_t>(n));
    c.all_gather(std::span<const std::byte>(&b, 1), std::span<std::byte>(every));
    bytes.put(c.rank(), every);
    std::vector<std::byte> message(4, std::byte{static_cast<unsigned char>(c.rank())});
    c.broadcast(message, n - 1);
    broadcast.put(c.rank(), message);
    c.barrier();
  });
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < chunk; ++i) {
      // Element r * chunk + i summed over ranks: 100 * (0 + ... + n-1) + n * (r * chunk + i).
      const float want = static_cast<float>(100 * (n * (n - 1) / 2) +
                                            n * (r * static_cast<int>(chunk) + static_cast<int>(i)));
      EXPECT_EQ(scattered.values[static_cast<size_t>(r)][i], want);
      for (int k = 0; k < n; ++k) {
        EXPECT_EQ(gathered.values[static_cast<size_t>(r)][chunk * static_cast<size_t>(k) + i],
                  scattered.values[static_cast<size_t>(k)][i]);
      }
    }
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(bytes.values[static_cast<size_t>(r)][static_cast<size_t>(k)],
                std::byte{static_cast<unsigned char>(k + 1)});
    }
    EXPECT_EQ(broadcast.values[static_cast<size_t>(r)],
              std::vector<std::byte>(4, std::byte{static_cast<unsigned char>(n - 1)}));
  }
}

TEST_P(Ranks, AllGatherPartsOfAnySizesInPlace) {
  // Parts of 9, 0, 17 and 2 bytes: uneven, one empty; every rank starts with garbage outside its own part.
  const int n = GetParam();
  const int64_t sizes[] = {9, 0, 17, 2};
  std::vector<int64_t> bounds = {0};
  for (int r = 0; r < n; ++r) bounds.push_back(bounds.back() + sizes[r]);
  const auto total = static_cast<size_t>(bounds.back());
  PerRank<std::byte> gathered(n);
  run_ranks(n, [&](Communicator& c) {
    std::vector<std::byte> values(total, std::byte{0xEE});
    for (int64_t i = bounds[c.rank()]; i < bounds[c.rank() + 1]; ++i)
      values[static_cast<size_t>(i)] = std::byte{static_cast<unsigned char>(16 * c.rank() + i % 16)};
    c.all_gather_parts(values, bounds);
    gathered.put(c.rank(), values);
  });
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < n; ++k) {
      for (int64_t i = bounds[k]; i < bounds[k + 1]; ++i) {
        EXPECT_EQ(gathered.values[static_cast<size_t>(r)][static_cast<size_t>(i)],
                  std::byte{static_cast<unsigned char>(16 * k + i % 16)})
            << "rank " << r << ", byte " << i << " of rank " << k << "'s part";
      }
    }
  }
}

TEST_P(Ranks, StartedGathersArriveInOrderWhenWaitedFor) {
  // Two gathers started: tickets 0 and 1. Without streams of its own, the communicator runs a gather when it
  // is waited for, so the parts of others stay as they were until then: a reader that forgot to wait sees
  // the old bytes, not the new ones.
  const int n = GetParam();
  std::vector<int64_t> bounds = {0};
  for (int r = 0; r < n; ++r) bounds.push_back(bounds.back() + 3 + r);
  const auto total = static_cast<size_t>(bounds.back());
  auto byte_of = [](int run, int rank, int64_t i) {
    return std::byte{static_cast<unsigned char>(100 * run + 10 * rank + i % 10)};
  };
  struct Seen {
    std::vector<int64_t> tickets;
    std::vector<std::byte> first_before, second_before, first_after_wait, second_after_wait, second_after_finish;
  };
  std::vector<Seen> seen(static_cast<size_t>(n));
  run_ranks(n, [&](Communicator& c) {
    std::vector<std::byte> a(total, std::byte{0xEE}), b(total, std::byte{0xEE});
    for (int64_t i = bounds[c.rank()]; i < bounds[c.rank() + 1]; ++i) {
      a[static_cast<size_t>(i)] = byte_of(0, c.rank(), i);
      b[static_cast<size_t>(i)] = byte_of(1, c.rank(), i);
    }
    Seen& s = seen[static_cast<size_t>(c.rank())];
    s.tickets.push_back(c.start_all_gather_parts(a, bounds, nullptr));
    s.tickets.push_back(c.start_all_gather_parts(b, bounds, nullptr));
    s.first_before = a;
    s.second_before = b;
    c.wait_gathered(s.tickets[0], nullptr);
    s.first_after_wait = a;
    s.second_after_wait = b;
    c.finish_gathers();
    s.second_after_finish = b;
    c.finish_gathers();  // nothing left: a no-op
    s.tickets.push_back(c.start_all_gather_parts(a, bounds, nullptr));
    c.finish_gathers();
  });
  for (int r = 0; r < n; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    EXPECT_EQ(s.tickets, (std::vector<int64_t>{0, 1, 2})) << "rank " << r;
    for (int k = 0; k < n; ++k) {
      for (int64_t i = bounds[k]; i < bounds[k + 1]; ++i) {
        const auto at = static_cast<size_t>(i);
        const std::byte untouched = k == r ? byte_of(0, k, i) : std::byte{0xEE};
        EXPECT_EQ(s.first_before[at], untouched) << "rank " << r << ", byte " << i << " before any wait";
        EXPECT_EQ(s.first_after_wait[at], byte_of(0, k, i)) << "rank " << r << ", byte " << i;
        EXPECT_EQ(s.second_after_wait[at], k == r ? byte_of(1, k, i) : std::byte{0xEE})
            << "rank " << r << ", byte " << i << ": the second gather is not waited for yet";
        EXPECT_EQ(s.second_after_finish[at], byte_of(1, k, i)) << "rank " << r << ", byte " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Communicator, Ranks, ::testing::Values(1, 2, 3, 4));

TEST(Communicator, RanksThatDisagreeOnSizesGetOneClearError) {
  try {
    run_ranks(3, [](Communicator& c) {
      std::vector<float> v(c.rank() == 2 ? 5 : 4, 1.0f);
      c.all_reduce_sum(std::span<float>(v));
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the ranks disagree on a collective"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 called all_reduce_sum (float32) with 5 values"), std::string::npos) << m;
  }
  EXPECT_THROW(run_ranks(2,
                         [](Communicator& c) {
                           std::vector<float> v(4, 1.0f);
                           if (c.rank() == 0) {
                             c.all_reduce_sum(std::span<float>(v));
                           } else {
                             c.all_reduce_max(std::span<float>(v));
                           }
                         }),
               Error);
}

TEST(Communicator, AFailingRankEndsTheOthersCollectives) {
  std::atomic<int> abandoned = 0;
  try {
    run_ranks(4, [&](Communicator& c) {
      if (c.rank() == 1) throw Error(ErrorKind::invalid_input, "rank 1 cannot go on");
      std::vector<float> v(8, 1.0f);
      try {
        c.all_reduce_sum(std::span<float>(v));
      } catch (const Error&) {
        ++abandoned;
        throw;
      }
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1 cannot go on") << "the failing rank's own error is rethrown";
    EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
  }
  EXPECT_EQ(abandoned.load(), 3);
}

TEST(ShardRange, CoversTheCountInRankOrder) {
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{1001}}) {
    for (const int ranks : {1, 2, 3, 4, 8}) {
      int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const ShardRange s = shard_range(count, r, ranks);
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.size(), s.chunk);
        EXPECT_GE(s.size(), 0);
        EXPECT_EQ(s.chunk, (count + ranks - 1) / ranks);
        next = s.end;
      }
      EXPECT_EQ(next, count) << count << " over " << ranks;
    }
  }
}

TEST(DataParallelLayout, MinusOneTakesTheRanksTheOtherKeyLeaves) {
  const DataParallelLayout one = resolve_layout({}, 1, 0);
  EXPECT_EQ(one.shard, 1);
  EXPECT_EQ(one.replicate, 1);
  const DataParallelLayout all = resolve_layout({}, 4, 3);
  EXPECT_EQ(all.shard, 4);
  EXPECT_EQ(all.replicate, 1);
  EXPECT_EQ(all.shard_rank(), 3);
  const DataParallelLayout hybrid = resolve_layout({.dp_shard = 2, .dp_replicate = -1}, 8, 5);
  EXPECT_EQ(hybrid.replicate, 4);
  EXPECT_EQ(hybrid.shard_rank(), 1);
  EXPECT_EQ(hybrid.replica(), 2);
  const DataParallelLayout replicated = resolve_layout({.dp_shard = 1, .dp_replicate = -1}, 3, 0);
  EXPECT_EQ(replicated.replicate, 3);

  auto message = [](DistributedSettings s, int world) {
    try {
      resolve_layout(s, world, 0);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message({.dp_shard = 4, .dp_replicate = 1}, 2)
          .find("distributed.dp_shard x distributed.dp_replicate = 4 x 1 = 4, but this run has 2 ranks"),
      std::string::npos);
  EXPECT_NE(message({.dp_shard = 3, .dp_replicate = -1}, 4).find("distributed.dp_shard = 3 does not divide"),
            std::string::npos);
  EXPECT_NE(message({.dp_shard = -1, .dp_replicate = -1}, 4).find("cannot both be -1"), std::string::npos);
  EXPECT_NE(message({.dp_shard = 0, .dp_replicate = 1}, 1).find("distributed.dp_shard must be -1"),
            std::string::npos);
}

}  // namespace
}  // namespace octet::dist
