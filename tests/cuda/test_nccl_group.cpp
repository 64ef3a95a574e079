// NcclGroup's collectives on every GPU of the machine (2 to 4 ranks, one thread and one GPU each), on exact
// small integers, so that NCCL's own order of addition cannot change a sum: every rank must receive exactly
// the sums, maxima (a NaN on one rank reaching all), chunks, shards' sums and bytes that the interface
// promises; the same on groups split off (ncclCommSplit: a hybrid layout's shard groups). Skips with
// fewer than two GPUs or without NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "octet/check.h"
#include "octet/dist/nccl_group.h"
#include "octet/numerics/minifloat.h"

namespace {

using octet::dist::Communicator;

// A device copy of host values on the current GPU, read back with read().
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& values) : n_(values.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), std::max<size_t>(n_, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::span<T> span() { return {data_, n_}; }
  std::vector<T> read() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t n_;
};

int gpus() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// One rank's part: every collective once, each result checked on this rank.
void exercise(Communicator& c, int device) {
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  const int r = c.rank(), n = c.size();
  const size_t m = 1000;                       // not a multiple of anything NCCL likes
  const double ranks_sum = n * (n + 1) / 2.0;  // sum over ranks of (r + 1)

  std::vector<float> f(m);
  for (size_t i = 0; i < m; ++i) f[i] = static_cast<float>((r + 1) * static_cast<int>(i % 13));
  DeviceArray<float> sum(f);
  c.all_reduce_sum(sum.span());
  const std::vector<float> summed = sum.read();
  for (size_t i = 0; i < m; ++i)
    ASSERT_EQ(summed[i], static_cast<float>(ranks_sum * static_cast<double>(i % 13))) << i;

  std::vector<double> d(m);
  for (size_t i = 0; i < m; ++i) d[i] = (r + 1) * 0.5 * static_cast<double>(i % 7);
  DeviceArray<double> sum64(d);
  c.all_reduce_sum(sum64.span());
  const std::vector<double> summed64 = sum64.read();
  for (size_t i = 0; i < m; ++i) ASSERT_EQ(summed64[i], ranks_sum * 0.5 * static_cast<double>(i % 7)) << i;

  // BF16 holds the integers up to 256 exactly: (r + 1) (i % 5) and every partial sum.
  std::vector<uint16_t> b(m);
  for (size_t i = 0; i < m; ++i)
    b[i] = octet::float_to_bf16(static_cast<float>((r + 1) * static_cast<int>(i % 5)));
  DeviceArray<uint16_t> sum16(b);
  c.all_reduce_sum_bf16(sum16.span());
  const std::vector<uint16_t> summed16 = sum16.read();
  for (size_t i = 0; i < m; ++i) {
    ASSERT_EQ(summed16[i], octet::float_to_bf16(static_cast<float>(ranks_sum * static_cast<double>(i % 5))))
        << i;
  }

  // Maxima: rank-dependent values, negatives, an infinity, and a NaN on the last rank only.
  std::vector<float> x(m);
  for (size_t i = 0; i < m; ++i)
    x[i] = static_cast<float>(static_cast<int>(i % 11) - 5) * static_cast<float>(r + 1);
  x[3] = r == n - 1 ? std::nanf("") : 1.0f;
  x[4] = r == 0 ? INFINITY : -2.0f;
  x[5] = -1.0f - static_cast<float>(r);
  DeviceArray<float> max(x);
  c.all_reduce_max(max.span());
  const std::vector<float> maxima = max.read();
  EXPECT_TRUE(std::isnan(maxima[3]));
  EXPECT_EQ(maxima[4], INFINITY);
  EXPECT_EQ(maxima[5], -1.0f);
  for (size_t i = 6; i < m; ++i) {
    const float v = static_cast<float>(static_cast<int>(i % 11) - 5);
    ASSERT_EQ(maxima[i], v >= 0 ? v * static_cast<float>(n) : v) << i;
  }

  // Reduce-scatter: rank r receives the sum of every rank's chunk r.
  std::vector<float> send(m * static_cast<size_t>(n));
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>((r + 1) * static_cast<int>(i % 17));
  DeviceArray<float> scatter_send(send), scatter_receive(std::vector<float>(m, -1.0f));
  c.reduce_scatter_sum(scatter_send.span(), scatter_receive.span());
  const std::vector<float> chunk = scatter_receive.read();
  for (size_t i = 0; i < m; ++i) {
    ASSERT_EQ(chunk[i],
              static_cast<float>(ranks_sum * static_cast<double>((static_cast<size_t>(r) * m + i) % 17)))
        << i;
  }

  // Reduce-scatter in place over shards (a sharded optimizer's gradient sums): the whole buffer in equal
  // parts (one ncclReduceScatter), a run straddling the shards' boundaries and a run inside one shard (one
  // ncclReduce per rank whose part is not empty); in float32 and BF16, at once and started as during a
  // backward. Each rank's part must hold the sums; BF16 holds the integers up to 256 exactly.
  const int64_t equal_total = 8 * n, total = 10 * n + 3;
  const int64_t shard_chunk = (total + n - 1) / n;
  for (const auto& [offset, length, whole] :
       {std::tuple{int64_t{0}, equal_total, equal_total}, std::tuple{int64_t{3}, std::min(2 * shard_chunk, total - 3), total},
        std::tuple{shard_chunk + 1, int64_t{2}, total}}) {
    for (int form = 0; form < 4; ++form) {  // float32, float32 started, BF16, BF16 started
      const bool bf16 = form >= 2, started = form % 2 == 1;
      std::vector<float> values(static_cast<size_t>(length));
      for (int64_t i = 0; i < length; ++i)
        values[static_cast<size_t>(i)] =
            static_cast<float>((r + 1) * static_cast<int>((offset + i) % (bf16 ? 5 : 13)));
      std::vector<float> summed_part;
      if (!bf16) {
        DeviceArray<float> run(values);
        if (started) {
          c.start_reduce_scatter_sum(run.span(), offset, whole, nullptr);
          c.finish_started();
        } else {
          c.reduce_scatter_sum_in_place(run.span(), offset, whole);
        }
        summed_part = run.read();
      } else if (started) {
        DeviceArray<float> run(values);
        c.start_reduce_scatter_sum_bf16(run.span(), offset, whole, nullptr);
        c.finish_started();
        summed_part = run.read();
      } else {
        std::vector<uint16_t> codes;
        for (const float v : values) codes.push_back(octet::float_to_bf16(v));
        DeviceArray<uint16_t> run(codes);
        c.reduce_scatter_sum_in_place_bf16(run.span(), offset, whole);
        for (const uint16_t code : run.read()) summed_part.push_back(octet::bf16_to_float(code));
      }
      const octet::dist::ShardPart part = octet::dist::shard_part(offset, length, whole, r, n);
      for (int64_t i = part.begin; i < part.end; ++i) {
        ASSERT_EQ(summed_part[static_cast<size_t>(i)],
                  static_cast<float>(ranks_sum * static_cast<double>((offset + i) % (bf16 ? 5 : 13))))
            << "reduce-scatter form " << form << " of [" << offset << ", " << offset + length << ") of "
            << whole << ", element " << i;
      }
    }
  }

  // All-gather in place (each rank's chunk already where it belongs), and of bytes.
  std::vector<float> gathered(m * static_cast<size_t>(n), -1.0f);
  for (size_t i = 0; i < m; ++i)
    gathered[static_cast<size_t>(r) * m + i] = static_cast<float>(r * 10000 + static_cast<int>(i));
  DeviceArray<float> gather(gathered);
  std::span<float> all = gather.span();
  c.all_gather(all.subspan(static_cast<size_t>(r) * m, m), all);
  const std::vector<float> got = gather.read();
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < m; ++i)
      ASSERT_EQ(got[static_cast<size_t>(q) * m + i], static_cast<float>(q * 10000 + static_cast<int>(i)));
  }
  std::vector<std::byte> mine(37, static_cast<std::byte>(r + 1));
  DeviceArray<std::byte> bytes_send(mine), bytes_receive(std::vector<std::byte>(37 * static_cast<size_t>(n)));
  c.all_gather(std::span<const std::byte>(bytes_send.span()), bytes_receive.span());
  const std::vector<std::byte> bytes = bytes_receive.read();
  for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], static_cast<std::byte>(i / 37 + 1)) << i;

  // Broadcast from the last rank.
  std::vector<std::byte> data(101, static_cast<std::byte>(r));
  DeviceArray<std::byte> broadcast(data);
  c.broadcast(broadcast.span(), n - 1);
  for (const std::byte v : broadcast.read()) ASSERT_EQ(v, static_cast<std::byte>(n - 1));
  c.barrier();
}

TEST(NcclGroup, EveryCollectiveOnEveryGpu) {
  const int count = gpus();
  if (count < 2) GTEST_SKIP() << "fewer than 2 GPUs (" << count << ")";
  std::string why;
  if (!octet::dist::nccl_available(&why)) GTEST_SKIP() << why;
  std::printf("[ nccl ] version %d, %d GPUs\n", octet::dist::nccl_version(), std::min(count, 4));
  std::vector<int> devices(static_cast<size_t>(std::min(count, 4)));
  std::iota(devices.begin(), devices.end(), 0);
  octet::dist::NcclGroup group(devices);
  ASSERT_EQ(group.size(), static_cast<int>(devices.size()));
  std::vector<std::thread> threads;
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        exercise(group.communicator(r), devices[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        const std::lock_guard lock(failures_mutex);
        failures.push_back(e.what());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << (failures.empty() ? std::string() : failures.front());
}

// A hybrid layout's shard groups (Communicator::split, ncclCommSplit): consecutive pairs of ranks, each pair
// a communicator of its own on which every collective gives the exact results above.
TEST(NcclGroup, EveryCollectiveOnGroupsSplitOff) {
  const int count = gpus();
  if (count < 2) GTEST_SKIP() << "fewer than 2 GPUs (" << count << ")";
  std::string why;
  if (!octet::dist::nccl_available(&why)) GTEST_SKIP() << why;
  std::vector<int> devices(static_cast<size_t>(std::min(count, 4)));
  std::iota(devices.begin(), devices.end(), 0);
  octet::dist::NcclGroup group(devices);
  std::vector<std::thread> threads;
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        ASSERT_EQ(cudaSetDevice(devices[static_cast<size_t>(r)]), cudaSuccess);
        const std::unique_ptr<Communicator> pair = group.communicator(r).split(r / 2, r % 2);
        EXPECT_EQ(pair->rank(), r % 2);
        EXPECT_EQ(pair->size(), std::min(2, group.size() - r / 2 * 2));
        exercise(*pair, devices[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        const std::lock_guard lock(failures_mutex);
        failures.push_back(e.what());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(failures.empty()) << (failures.empty() ? std::string() : failures.front());
}

TEST(NcclGroup, RefusesAGpuTheMachineDoesNotHave) {
  const int count = gpus();
  if (count < 1) GTEST_SKIP() << "no GPU";
  std::string why;
  if (!octet::dist::nccl_available(&why)) GTEST_SKIP() << why;
  const std::vector<int> devices = {0, count};
  try {
    octet::dist::NcclGroup group(devices);
    FAIL() << "GPU " << count << " accepted";
  } catch (const octet::Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("this machine has"), std::string::npos) << e.what();
  }
}

}  // namespace
