// Ranks as processes over TCP (SocketGroup), here as threads of the test so that each case sees every rank:
// every collective gives the bits the in-process group gives (the same folds in rank order), a rank with
// another configuration is refused on every rank, and a rank that fails, ends, hangs, never comes or calls
// another collective stops every rank with one message naming it. And the launchers' environments.
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "octet/check.h"
#include "octet/dist/in_process.h"
#include "octet/dist/launch.h"
#include "octet/dist/socket_group.h"
#include "octet/numerics/minifloat.h"

namespace octet::dist {
namespace {

using namespace std::chrono_literals;

// A port nobody listens on now (the kernel's choice for an ephemeral bind).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t size = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size);
  ::close(fd);
  return ntohs(a.sin_port);
}

Fingerprint fingerprint(const std::string& config = "c0") {
  return {{{"octet binary", "b0"}, {"configuration", config}}};
}

// Each rank's outcome: the message of the Error it threw, or empty.
struct Outcomes {
  std::mutex mutex;
  std::map<int, std::string> errors;
  std::map<int, ErrorKind> kinds;
  void fail(int rank, const Error& e) {
    std::lock_guard lock(mutex);
    errors[rank] = e.what();
    kinds[rank] = e.kind();
  }
};

// Runs body(rank, env) for `world` ranks, each on a thread, joined over a fresh port.
void run_processes(int world, const std::function<void(int, const RankEnvironment&)>& body, Outcomes& out) {
  const int port = free_port();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankEnvironment env;
      env.rank = r;
      env.world = world;
      env.local_rank = r;
      env.master_port = port;
      try {
        body(r, env);
      } catch (const Error& e) {
        out.fail(r, e);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// The inputs of rank r for the collectives below: varied floats, NaNs and BF16 codes.
std::vector<float> floats_of(int rank, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(17 + rank));
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

struct Results {
  std::vector<float> sum, max, scattered, gathered;
  std::vector<double> sum64;
  std::vector<uint16_t> sum_bf16;
  std::vector<std::byte> broadcast;
  // This rank's part of a run reduce-scattered in place (straddling shards), in float32 and BF16.
  std::vector<float> owned;
  std::vector<uint16_t> owned_bf16;
};

// Every collective once, as each rank sees it.
Results every_collective(Communicator& c) {
  Results r;
  const int n = c.size();
  r.sum = floats_of(c.rank(), 101);
  c.all_reduce_sum(std::span<float>(r.sum));
  r.sum64 = {c.rank() * 0.1, 1e300 / (c.rank() + 1)};
  c.all_reduce_sum(std::span<double>(r.sum64));
  for (const float x : floats_of(c.rank() + 50, 33)) r.sum_bf16.push_back(float_to_bf16(x));
  c.all_reduce_sum_bf16(r.sum_bf16);
  r.max = floats_of(c.rank() + 100, 9);
  if (c.rank() == 1) r.max[3] = std::numeric_limits<float>::quiet_NaN();
  c.all_reduce_max(r.max);
  const std::vector<float> send = floats_of(c.rank() + 200, static_cast<size_t>(7 * n));
  r.scattered.resize(7);
  c.reduce_scatter_sum(send, r.scattered);
  // The run [3, 23) of 29 elements shared out over the ranks.
  std::vector<float> run = floats_of(c.rank() + 400, 20);
  c.reduce_scatter_sum_in_place(run, 3, 29);
  std::vector<uint16_t> run_bf16;
  for (const float x : floats_of(c.rank() + 500, 20)) run_bf16.push_back(float_to_bf16(x));
  c.reduce_scatter_sum_in_place_bf16(run_bf16, 3, 29);
  const ShardPart mine = shard_part(3, 20, 29, c.rank(), n);
  r.owned.assign(run.begin() + mine.begin, run.begin() + mine.end);
  r.owned_bf16.assign(run_bf16.begin() + mine.begin, run_bf16.begin() + mine.end);
  r.gathered.resize(static_cast<size_t>(5 * n));
  const std::vector<float> part = floats_of(c.rank() + 300, 5);
  c.all_gather(std::span<const float>(part), std::span<float>(r.gathered));
  r.broadcast.assign(11, std::byte{static_cast<unsigned char>(c.rank())});
  c.broadcast(r.broadcast, n - 1);
  c.barrier();
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SocketGroup, EveryCollectiveGivesTheInProcessGroupsBits) {
  for (const int world : {2, 3}) {
    std::vector<Results> threads(static_cast<size_t>(world)), processes(static_cast<size_t>(world));
    run_ranks(world, [&](Communicator& c) { threads[static_cast<size_t>(c.rank())] = every_collective(c); });
    Outcomes out;
    run_processes(world, [&](int r, const RankEnvironment& env) {
      SocketGroup group(env, fingerprint(), 20s);
      EXPECT_EQ(group.rank(), r);
      EXPECT_EQ(group.size(), world);
      processes[static_cast<size_t>(r)] = every_collective(group);
    }, out);
    ASSERT_TRUE(out.errors.empty()) << out.errors.begin()->second;
    for (int r = 0; r < world; ++r) {
      const Results& a = threads[static_cast<size_t>(r)];
      const Results& b = processes[static_cast<size_t>(r)];
      EXPECT_TRUE(same_bits(a.sum, b.sum)) << "rank " << r;
      EXPECT_EQ(a.sum64, b.sum64) << "rank " << r;
      EXPECT_EQ(a.sum_bf16, b.sum_bf16) << "rank " << r;
      EXPECT_TRUE(same_bits(a.max, b.max)) << "rank " << r;
      EXPECT_TRUE(std::isnan(b.max[3])) << "a NaN amax on rank 1 reaches rank " << r;
      EXPECT_TRUE(same_bits(a.scattered, b.scattered)) << "rank " << r;
      EXPECT_FALSE(b.owned.empty());
      EXPECT_TRUE(same_bits(a.owned, b.owned)) << "rank " << r;
      EXPECT_EQ(a.owned_bf16, b.owned_bf16) << "rank " << r;
      EXPECT_TRUE(same_bits(a.gathered, b.gathered)) << "rank " << r;
      EXPECT_EQ(b.broadcast, std::vector<std::byte>(11, std::byte{static_cast<unsigned char>(world - 1)}));
      // Not a vacuous comparison: the ranks' sums differ from any one rank's inputs.
      EXPECT_NE(b.sum[0], floats_of(r, 1)[0]);
    }
  }
}

TEST(SocketGroup, ItsShardGroupsGiveTheBitsOfAGroupOfTheirRanksAlone) {
  // 4 processes as 2 shard groups of 2 consecutive ranks (a hybrid layout), each group's collectives made
  // of the processes' own (Communicator::split): each group gives what 2 ranks alone give.
  std::vector<Results> pair(2), processes(4);
  run_ranks(2, [&](Communicator& c) { pair[static_cast<size_t>(c.rank())] = every_collective(c); });
  Outcomes out;
  run_processes(
      4,
      [&](int r, const RankEnvironment& env) {
        SocketGroup group(env, fingerprint(), 20s);
        const std::unique_ptr<Communicator> shard_group = group.split(r / 2, r % 2);
        EXPECT_EQ(shard_group->rank(), r % 2);
        EXPECT_EQ(shard_group->size(), 2);
        processes[static_cast<size_t>(r)] = every_collective(*shard_group);
      },
      out);
  ASSERT_TRUE(out.errors.empty()) << out.errors.begin()->second;
  for (int r = 0; r < 4; ++r) {
    const Results& a = pair[static_cast<size_t>(r % 2)];
    const Results& b = processes[static_cast<size_t>(r)];
    EXPECT_TRUE(same_bits(a.sum, b.sum)) << "rank " << r;
    EXPECT_EQ(a.sum64, b.sum64) << "rank " << r;
    EXPECT_EQ(a.sum_bf16, b.sum_bf16) << "rank " << r;
    EXPECT_TRUE(same_bits(a.max, b.max)) << "rank " << r;
    EXPECT_TRUE(same_bits(a.scattered, b.scattered)) << "rank " << r;
    EXPECT_TRUE(same_bits(a.owned, b.owned)) << "rank " << r;
    EXPECT_EQ(a.owned_bf16, b.owned_bf16) << "rank " << r;
    EXPECT_TRUE(same_bits(a.gathered, b.gathered)) << "rank " << r;
    EXPECT_EQ(b.broadcast, std::vector<std::byte>(11, std::byte{1}));
    EXPECT_NE(b.sum[0], floats_of(r % 2, 1)[0]);
  }
}

TEST(SocketGroup, ARankWithAnotherConfigurationIsRefusedOnEveryRank) {
  Outcomes out;
  run_processes(3, [&](int r, const RankEnvironment& env) {
    SocketGroup group(env, fingerprint(r == 2 ? "c2" : "c0"), 20s);
    group.barrier();
  }, out);
  ASSERT_EQ(out.errors.size(), 3u);
  for (const auto& [rank, message] : out.errors) {
    EXPECT_EQ(out.kinds[rank], ErrorKind::invalid_input) << message;
    EXPECT_NE(message.find("rank 2's configuration differs from rank 0's (c2 on rank 2, c0 on rank 0)"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

TEST(SocketGroup, ARankThatFailsStopsEveryRankNamingIt) {
  Outcomes out;
  run_processes(3, [&](int r, const RankEnvironment& env) {
    SocketGroup group(env, fingerprint(), 20s);
    std::vector<float> v(4, 1.0f);
    group.all_reduce_sum(std::span<float>(v));
    if (r == 1) {
      group.abort("out of memory in the backward");
      return;
    }
    group.all_reduce_sum(std::span<float>(v));
  }, out);
  ASSERT_EQ(out.errors.size(), 2u);
  for (const int rank : {0, 2}) {
    EXPECT_EQ(out.kinds[rank], ErrorKind::training_failed);
    EXPECT_NE(out.errors[rank].find("rank 1 stopped: out of memory in the backward"), std::string::npos)
        << "rank " << rank << ": " << out.errors[rank];
  }
}

TEST(SocketGroup, ARankThatEndsStopsEveryRankNamingIt) {
  Outcomes out;
  run_processes(3, [&](int r, const RankEnvironment& env) {
    SocketGroup group(env, fingerprint(), 20s);
    if (r == 2) return;  // its connection closes with the group
    group.barrier();
  }, out);
  ASSERT_EQ(out.errors.size(), 2u);
  for (const int rank : {0, 1}) {
    EXPECT_NE(out.errors[rank].find("rank 2 closed its connection during barrier"), std::string::npos)
        << "rank " << rank << ": " << out.errors[rank];
  }
}

TEST(SocketGroup, ARankThatHangsStopsEveryRankWithinTheTimeout) {
  Outcomes out;
  const auto began = std::chrono::steady_clock::now();
  run_processes(2, [&](int r, const RankEnvironment& env) {
    SocketGroup group(env, fingerprint(), 300ms);
    if (r == 1) {
      std::this_thread::sleep_for(1200ms);  // silent for longer than the timeout, its connection open
      return;
    }
    group.barrier();
  }, out);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_NE(out.errors[0].find("rank 1 sent nothing for 0.3 s during barrier"), std::string::npos)
      << out.errors[0];
  EXPECT_LT(seconds, 10.0);
}

TEST(SocketGroup, ARankThatNeverComesIsNamed) {
  Outcomes out;
  run_processes(3, [&](int r, const RankEnvironment& env) {
    if (r == 2) return;  // never started
    SocketGroup group(env, fingerprint(), 400ms);
  }, out);
  ASSERT_TRUE(out.errors.contains(0));
  EXPECT_NE(out.errors[0].find("rank(s) 2 did not join rank 0"), std::string::npos) << out.errors[0];
  // Rank 1 joined and waits for rank 0's answer, which does not come: it says so rather than waiting forever.
  ASSERT_TRUE(out.errors.contains(1));
}

TEST(SocketGroup, RanksThatCallDifferentCollectivesAreStoppedWithOneMessage) {
  Outcomes out;
  run_processes(3, [&](int r, const RankEnvironment& env) {
    SocketGroup group(env, fingerprint(), 20s);
    std::vector<float> v(r == 1 ? 5 : 4, 1.0f);
    if (r == 2) {
      group.all_reduce_max(std::span<float>(v));
    } else {
      group.all_reduce_sum(std::span<float>(v));
    }
  }, out);
  ASSERT_EQ(out.errors.size(), 3u);
  for (const auto& [rank, message] : out.errors) {
    EXPECT_NE(message.find("the ranks disagree on a collective: rank 0 called all_reduce_sum (float32) with 4 "
                           "values (root 0), rank 1 called all_reduce_sum (float32) with 5 values"),
              std::string::npos)
        << "rank " << rank << ": " << message;
  }
}

// --- The launchers' environments.

EnvironmentReader reader(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    const auto it = vars.find(std::string(name));
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

TEST(RankEnvironment, EachLaunchersVariablesAreRead) {
  EXPECT_FALSE(rank_environment(reader({})).has_value());
  const auto mpi = rank_environment(reader({{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "node17"},
                                            {"MASTER_PORT", "6000"}}));
  ASSERT_TRUE(mpi.has_value());
  EXPECT_EQ(mpi->launcher, "mpirun");
  EXPECT_EQ(mpi->rank, 5);
  EXPECT_EQ(mpi->world, 8);
  EXPECT_EQ(mpi->local_rank, 1);
  EXPECT_EQ(mpi->master_address, "node17");
  EXPECT_EQ(mpi->master_port, 6000);
  const auto slurm = rank_environment(
      reader({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}, {"OCTET_MASTER_PORT", "7"}}));
  ASSERT_TRUE(slurm.has_value());
  EXPECT_EQ(slurm->launcher, "srun");
  EXPECT_EQ(slurm->world, 16);
  EXPECT_EQ(slurm->master_address, "127.0.0.1");
  EXPECT_EQ(slurm->master_port, 7);
  const auto torchrun = rank_environment(reader({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(torchrun.has_value());
  EXPECT_EQ(torchrun->launcher, "torchrun");
  EXPECT_EQ(torchrun->local_rank, 0);
  EXPECT_EQ(torchrun->master_port, 29517);
  // octet's own variables come first.
  const auto own = rank_environment(reader(
      {{"OCTET_RANK", "1"}, {"OCTET_WORLD_SIZE", "2"}, {"OCTET_LOCAL_RANK", "1"}, {"RANK", "9"}}));
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->launcher, "octet train --gpus/--ranks");
  EXPECT_EQ(own->rank, 1);
}

TEST(RankEnvironment, MalformedVariablesAreRefusedNamingThem) {
  const auto refused = [](std::map<std::string, std::string> vars, const std::string& expected) {
    try {
      rank_environment(reader(std::move(vars)));
      ADD_FAILURE() << "accepted; expected " << expected;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::invalid_input);
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID=\"4\": expected a whole number from 0 to 3");
  refused({{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK=\"x\"");
  refused({{"RANK", "0"}}, "WORLD_SIZE is not");
  refused({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=\"70000\"");
}

}  // namespace
}  // namespace octet::dist
