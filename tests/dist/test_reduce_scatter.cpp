// A sharded optimizer's gradient sums as a reduce-scatter (ZeRO-1): each rank receives the sums of its own
// shard only, and those are the bits the all-reduce gives, in float32 and in BF16, for runs that straddle
// shard boundaries and for ranks whose shard is empty; the overlapped sums take the reduce-scatter (and only
// it) for a sharded optimizer, move about half an all-reduce's bytes, and a training run whose gradients
// outside each rank's shard are poisoned with NaN after the sums still holds the bits of one rank: nothing
// reads them.
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dist_fixture.h"
#include "octet/dist/in_process.h"
#include "octet/numerics/minifloat.h"
#include "overlapped_sums.h"

namespace octet {
namespace {

using namespace dist_testing;

// Rank r's values: normal floats of varied magnitudes, so that the order of the additions shows in the bits.
std::vector<float> floats_of(int rank, size_t n, uint32_t seed = 0) {
  std::mt19937 gen(seed * 1000 + static_cast<uint32_t>(rank) + 5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 24) - 12);
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST(ShardPart, TheRanksPartsCoverTheRunInRankOrder) {
  for (const int64_t total : {0, 1, 3, 5, 13, 64}) {
    for (int ranks = 1; ranks <= 5; ++ranks) {
      for (int64_t offset = 0; offset <= total; ++offset) {
        for (int64_t count = 0; offset + count <= total; ++count) {
          int64_t at = 0;
          for (int r = 0; r < ranks; ++r) {
            const dist::ShardPart p = dist::shard_part(offset, count, total, r, ranks);
            const dist::ShardRange s = dist::shard_range(total, r, ranks);
            ASSERT_EQ(p.begin, at) << total << " " << ranks << " " << offset << " " << count << " rank " << r;
            ASSERT_LE(p.begin, p.end);
            // The part is the run's intersection with the shard.
            ASSERT_EQ(p.size(),
                      std::max<int64_t>(0, std::min(s.end, offset + count) - std::max(s.begin, offset)));
            if (p.size() > 0) {
              ASSERT_EQ(p.begin + offset, std::max(s.begin, offset));
            }
            at = p.end;
          }
          ASSERT_EQ(at, count);
        }
      }
    }
  }
  EXPECT_THROW(dist::shard_part(4, 3, 6, 0, 2), Error) << "a run past the buffer";
}

// Buffers and runs: runs inside one shard, straddling two or more, the whole buffer; 5 elements over 4
// ranks leave the last rank's shard empty, 3 over 4 too.
struct Layout {
  int64_t total;
  std::vector<std::pair<int64_t, int64_t>> runs;  // [begin, end)
};

std::vector<Layout> layouts() {
  return {{5, {{0, 5}, {1, 4}, {4, 5}, {0, 1}}},
          {3, {{0, 3}, {2, 3}}},
          {13, {{0, 13}, {2, 11}, {3, 4}, {6, 13}, {12, 13}}},
          {64, {{0, 64}, {0, 40}, {17, 52}, {60, 64}}}};
}

class ReduceScatter : public ::testing::TestWithParam<int> {};

// On every rank, its part of each run reduce-scattered in place equals, bit for bit, the same elements of
// the run all-reduced; in BF16 likewise.
TEST_P(ReduceScatter, EachRankReceivesTheAllReducesBitsOfItsPart) {
  const int ranks = GetParam();
  dist::run_ranks(ranks, [&](dist::Communicator& c) {
    uint32_t seed = 0;
    for (const Layout& layout : layouts()) {
      for (const auto& [begin, end] : layout.runs) {
        const auto n = static_cast<size_t>(end - begin);
        const std::vector<float> mine = floats_of(c.rank(), n, ++seed);
        std::vector<float> all_reduced = mine, scattered = mine;
        c.all_reduce_sum(std::span<float>(all_reduced));
        c.reduce_scatter_sum_in_place(scattered, begin, layout.total);
        const dist::ShardPart part = dist::shard_part(begin, end - begin, layout.total, c.rank(), c.size());
        const auto a = std::span<const float>(all_reduced)
                           .subspan(static_cast<size_t>(part.begin), static_cast<size_t>(part.size()));
        const auto b = std::span<const float>(scattered).subspan(static_cast<size_t>(part.begin),
                                                                 static_cast<size_t>(part.size()));
        EXPECT_TRUE(same_bits(a, b)) << "rank " << c.rank() << ", [" << begin << ", " << end << ") of "
                                     << layout.total;
        if (ranks > 1 && part.size() > 0) {
          EXPECT_NE(b[0], mine[static_cast<size_t>(part.begin)]) << "summed";
        }

        std::vector<uint16_t> codes(n);
        for (size_t i = 0; i < n; ++i) codes[i] = float_to_bf16(mine[i]);
        std::vector<uint16_t> all_reduced16 = codes, scattered16 = codes;
        c.all_reduce_sum_bf16(all_reduced16);
        c.reduce_scatter_sum_in_place_bf16(scattered16, begin, layout.total);
        for (int64_t i = part.begin; i < part.end; ++i) {
          EXPECT_EQ(scattered16[static_cast<size_t>(i)], all_reduced16[static_cast<size_t>(i)])
              << "rank " << c.rank() << ", element " << begin + i << " of " << layout.total;
        }
      }
    }
  });
}

// The sums started during a backward: reduce_scatter counted as a ring sends it (the run less this rank's
// part), an all-reduce twice (n - 1) / n of it; their sums the same bits.
TEST_P(ReduceScatter, StartedSumsAreCountedAndGiveTheAllReducesBits) {
  const int ranks = GetParam();
  dist::run_ranks(ranks, [&](dist::Communicator& c) {
    const int64_t total = 13;
    for (const bool bf16 : {false, true}) {
      const dist::Communicator::Traffic before = c.traffic();
      std::vector<float> all_reduced = floats_of(c.rank(), 9, 7), scattered = all_reduced;  // [2, 11)
      if (bf16) {
        c.start_all_reduce_sum_bf16(all_reduced, nullptr);
        c.start_reduce_scatter_sum_bf16(scattered, 2, total, nullptr);
      } else {
        c.start_all_reduce_sum(all_reduced, nullptr);
        c.start_reduce_scatter_sum(scattered, 2, total, nullptr);
      }
      c.finish_started();
      const dist::ShardPart part = dist::shard_part(2, 9, total, c.rank(), c.size());
      for (int64_t i = part.begin; i < part.end; ++i) {
        EXPECT_EQ(std::bit_cast<uint32_t>(scattered[static_cast<size_t>(i)]),
                  std::bit_cast<uint32_t>(all_reduced[static_cast<size_t>(i)]))
            << "rank " << c.rank() << " element " << i << (bf16 ? " (bf16)" : "");
      }
      const int64_t element = bf16 ? 2 : 4;
      const dist::Communicator::Traffic& after = c.traffic();
      EXPECT_EQ(after.all_reduces - before.all_reduces, 1);
      EXPECT_EQ(after.reduce_scatters - before.reduce_scatters, 1);
      EXPECT_EQ(after.all_reduce_bytes - before.all_reduce_bytes, 2 * 9 * element * (ranks - 1) / ranks);
      EXPECT_EQ(after.reduce_scatter_bytes - before.reduce_scatter_bytes,
                ranks == 1 ? 0 : (9 - part.size()) * element);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Communicator, ReduceScatter, ::testing::Values(1, 2, 3, 4, 5));

// A communicator that passes every collective to another and records the sums started during a backward;
// with `poison`, the elements of a reduce-scatter's run outside this rank's part become NaN once it is
// done, as nothing may read them.
class RecordingCommunicator final : public dist::Communicator {
 public:
  explicit RecordingCommunicator(dist::Communicator& inner, bool poison = false)
      : inner_(inner), poison_(poison) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce_sum(std::span<float> v) override { inner_.all_reduce_sum(v); }
  void all_reduce_sum(std::span<double> v) override { inner_.all_reduce_sum(v); }
  void all_reduce_sum_bf16(std::span<uint16_t> v) override { inner_.all_reduce_sum_bf16(v); }
  void all_reduce_max(std::span<float> v) override { inner_.all_reduce_max(v); }
  void reduce_scatter_sum(std::span<const float> s, std::span<float> r) override {
    inner_.reduce_scatter_sum(s, r);
  }
  void reduce_scatter_sum_in_place(std::span<float> v, int64_t offset, int64_t total) override {
    inner_.reduce_scatter_sum_in_place(v, offset, total);
  }
  void reduce_scatter_sum_in_place_bf16(std::span<uint16_t> v, int64_t offset, int64_t total) override {
    inner_.reduce_scatter_sum_in_place_bf16(v, offset, total);
  }
  void all_gather(std::span<const float> s, std::span<float> r) override { inner_.all_gather(s, r); }
  void all_gather(std::span<const std::byte> s, std::span<std::byte> r) override { inner_.all_gather(s, r); }
  void broadcast(std::span<std::byte> d, int root) override { inner_.broadcast(d, root); }
  void barrier() override { inner_.barrier(); }
  void all_gather_shards(std::span<float> v) override { inner_.all_gather_shards(v); }

  void start_all_reduce_sum(std::span<float> v, void* stream) override {
    all_reduces.emplace_back(v.size(), false);
    inner_.start_all_reduce_sum(v, stream);
  }
  void start_all_reduce_sum_bf16(std::span<float> v, void* stream) override {
    all_reduces.emplace_back(v.size(), true);
    inner_.start_all_reduce_sum_bf16(v, stream);
  }
  void start_reduce_scatter_sum(std::span<float> v, int64_t offset, int64_t total, void* stream) override {
    record(v, offset, total, false);
    inner_.start_reduce_scatter_sum(v, offset, total, stream);
    if (poison_) poison_outside(v, offset, total);
  }
  void start_reduce_scatter_sum_bf16(std::span<float> v, int64_t offset, int64_t total,
                                     void* stream) override {
    record(v, offset, total, true);
    inner_.start_reduce_scatter_sum_bf16(v, offset, total, stream);
    if (poison_) poison_outside(v, offset, total);
  }
  void start_all_reduce_sum_bf16_codes(std::span<uint16_t> v, void* stream) override {
    all_reduces.emplace_back(v.size(), true);
    inner_.start_all_reduce_sum_bf16_codes(v, stream);
  }
  void start_reduce_scatter_sum_bf16_codes(std::span<uint16_t> v, int64_t offset, int64_t total,
                                           void* stream) override {
    reduce_scatters.push_back({offset, static_cast<int64_t>(v.size()), total, true});
    inner_.start_reduce_scatter_sum_bf16_codes(v, offset, total, stream);
    if (!poison_) return;
    const dist::ShardPart part =
        dist::shard_part(offset, static_cast<int64_t>(v.size()), total, rank(), size());
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
      if (i < part.begin || i >= part.end) v[static_cast<size_t>(i)] = 0x7fc0;  // a BF16 NaN
    }
  }
  void finish_started() override { inner_.finish_started(); }

  struct Run {
    int64_t offset, count, total;
    bool bf16;
  };
  std::vector<std::pair<size_t, bool>> all_reduces;  // size, bf16
  std::vector<Run> reduce_scatters;

 private:
  void record(std::span<float> v, int64_t offset, int64_t total, bool bf16) {
    reduce_scatters.push_back({offset, static_cast<int64_t>(v.size()), total, bf16});
  }
  void poison_outside(std::span<float> v, int64_t offset, int64_t total) {
    const dist::ShardPart part =
        dist::shard_part(offset, static_cast<int64_t>(v.size()), total, rank(), size());
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
      if (i < part.begin || i >= part.end) v[static_cast<size_t>(i)] = std::nanf("");
    }
  }

  dist::Communicator& inner_;
  bool poison_;
};

// The overlapped sums of a sharded optimizer: buckets reported in backward order, some never reported,
// straddling the shards' boundaries; every rank's shard the bits of the all-reduced buffer.
TEST(OverlappedSums, AShardedOptimizersBucketsAreReduceScatteredToTheAllReducesBits) {
  for (const int ranks : {2, 3, 4}) {
    for (const int64_t count : {int64_t{3}, int64_t{37}, int64_t{100}}) {
      for (const dist::GradientReduceType type :
           {dist::GradientReduceType::float32, dist::GradientReduceType::bf16}) {
        dist::run_ranks(ranks, [&](dist::Communicator& inner) {
          const std::vector<float> grads = floats_of(inner.rank(), static_cast<size_t>(count), 3);
          std::vector<float> all_reduced = grads, scattered = grads;
          RecordingCommunicator a(inner), b(inner);
          OverlappedSums whole(a, all_reduced.data(), Dtype::f32, uniform_runs(count, type), nullptr, 7);
          OverlappedSums sharded(b, scattered.data(), Dtype::f32, uniform_runs(count, type), nullptr, 7,
                                 count);
          // The backward's reports, from the last gradients to the first, leaving [0, count / 4) unreported.
          for (int64_t end = count; end > count / 4; end -= 2) {
            const int64_t begin = std::max(count / 4, end - 2);
            whole.ready(begin, end);
            sharded.ready(begin, end);
          }
          whole.finish();
          sharded.finish();
          EXPECT_TRUE(b.all_reduces.empty()) << "a sharded optimizer's sums are reduce-scatters only";
          EXPECT_TRUE(a.reduce_scatters.empty());
          EXPECT_FALSE(b.reduce_scatters.empty());
          int64_t covered = 0;
          bool straddles = false;
          for (const RecordingCommunicator::Run& run : b.reduce_scatters) {
            EXPECT_EQ(run.total, count);
            EXPECT_EQ(run.bf16, type == dist::GradientReduceType::bf16);
            covered += run.count;
            int owners = 0;
            for (int r = 0; r < ranks; ++r)
              owners += dist::shard_part(run.offset, run.count, count, r, ranks).size() > 0;
            straddles = straddles || owners > 1;
          }
          EXPECT_EQ(covered, count) << "every gradient summed once";
          if (count > 3) {
            EXPECT_TRUE(straddles) << "a bucket straddles a shard boundary: " << ranks << " ranks, " << count;
          }
          const dist::ShardRange shard = dist::shard_range(count, inner.rank(), ranks);
          const auto mine = [&](const std::vector<float>& v) {
            return std::span<const float>(v).subspan(static_cast<size_t>(shard.begin),
                                                     static_cast<size_t>(shard.size()));
          };
          EXPECT_TRUE(same_bits(mine(all_reduced), mine(scattered)))
              << ranks << " ranks, " << count << " gradients, rank " << inner.rank();
        });
      }
    }
  }
}

// A buffer laid out as a GPU keeps weight gradients in BF16: float32 gradients (a norm, an embedding) and
// BF16 codes (two fused weights one after another, a padded gap, another weight), some float32 gradients
// rounded to BF16 (as the CPU keeps BF16 weight gradients). Each run is summed as its layout says: float32
// runs in float32 rank order, BF16 ones (codes, and rounded floats) rounding after every addition; and for a
// sharded optimizer each piece is reduce-scattered at its parameters' place, so that each rank's shard holds
// those bits.
TEST(OverlappedSums, EachRunIsSummedAsItsLayoutSaysAndShardedByItsParameters) {
  // Parameters (offset, count): wte 0..7 f32, q 7..18 bf16, k 18..24 bf16, norm 24..28 f32 rounded to BF16,
  // o 28..37 bf16, head 37..42 f32. Codes: q at 0, k at 11, o at 24 (padded to 8); floats: wte at 0, norm at
  // 7, head at 11.
  std::vector<ParameterInfo> params = {
      {.name = "wte", .shape = {7}, .offset = 0, .count = 7, .grad_offset = 0},
      {.name = "q", .shape = {11}, .offset = 7, .count = 11, .grad_offset = 0, .grad_type = Dtype::bf16},
      {.name = "k", .shape = {6}, .offset = 18, .count = 6, .grad_offset = 11, .grad_type = Dtype::bf16},
      {.name = "norm", .shape = {4}, .offset = 24, .count = 4, .grad_offset = 7},
      {.name = "o", .shape = {9}, .offset = 28, .count = 9, .grad_offset = 24, .grad_type = Dtype::bf16},
      {.name = "head", .shape = {5}, .offset = 37, .count = 5, .grad_offset = 11}};
  for (ParameterInfo& p : params) {
    if (p.grad_type == Dtype::bf16 || p.name == "norm") p.grad_precision = Dtype::bf16;
  }
  const int64_t total = 42, floats = 16, codes = 33;
  const std::vector<GradientRun> float_runs =
      gradient_runs(params, Dtype::f32, dist::GradientReduceType::float32);
  const std::vector<GradientRun> code_runs =
      gradient_runs(params, Dtype::bf16, dist::GradientReduceType::float32);
  ASSERT_EQ(float_runs.size(), 3u) << "wte, norm and head lie apart in the parameters";
  EXPECT_TRUE(float_runs[1].bf16 && !float_runs[0].bf16 && !float_runs[2].bf16);
  ASSERT_EQ(code_runs.size(), 2u) << "q and k merge; o lies apart";
  EXPECT_EQ(code_runs[0].end, 17);
  EXPECT_EQ(code_runs[1].parameter, 28);
  for (const int ranks : {2, 3, 4}) {
    // The expected sums, in rank order, of every rank's values.
    std::vector<std::vector<float>> f(static_cast<size_t>(ranks));
    std::vector<std::vector<uint16_t>> c(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      f[static_cast<size_t>(r)] = floats_of(r, floats, 4);
      for (const float x : floats_of(r, codes, 5)) c[static_cast<size_t>(r)].push_back(float_to_bf16(x));
    }
    std::vector<float> f_sum = f[0];
    std::vector<uint16_t> c_sum = c[0];
    for (int64_t i = 7; i < 11; ++i)
      f_sum[static_cast<size_t>(i)] = round_to_bf16(f_sum[static_cast<size_t>(i)]);
    for (int r = 1; r < ranks; ++r) {
      for (int64_t i = 0; i < floats; ++i) {
        const auto k = static_cast<size_t>(i);
        const float x = f[static_cast<size_t>(r)][k];
        f_sum[k] = i >= 7 && i < 11 ? round_to_bf16(f_sum[k] + round_to_bf16(x)) : f_sum[k] + x;
      }
      for (size_t k = 0; k < c_sum.size(); ++k)
        c_sum[k] = float_to_bf16(bf16_to_float(c_sum[k]) + bf16_to_float(c[static_cast<size_t>(r)][k]));
    }
    for (const bool shard : {false, true}) {
      dist::run_ranks(ranks, [&](dist::Communicator& inner) {
        const auto rank = static_cast<size_t>(inner.rank());
        std::vector<float> fg = f[rank];
        std::vector<uint16_t> cg = c[rank];
        RecordingCommunicator rec(inner, /*poison=*/true);
        OverlappedSums fs(rec, fg.data(), Dtype::f32, float_runs, nullptr, 5, shard ? total : 0);
        OverlappedSums cs(rec, cg.data(), Dtype::bf16, code_runs, nullptr, 5, shard ? total : 0);
        // The backward's reports, last first; q's and wte's left unreported.
        fs.ready(11, 16);
        cs.ready(24, 33);
        fs.ready(7, 11);
        cs.ready(11, 17);
        fs.finish();
        cs.finish();
        EXPECT_EQ(shard ? rec.all_reduces.size() : rec.reduce_scatters.size(), 0u);
        const dist::ShardRange mine = dist::shard_range(total, inner.rank(), ranks);
        const std::string what = fmt::format("{} ranks{}, rank {}", ranks, shard ? ", sharded" : "", rank);
        for (const ParameterInfo& p : params) {
          for (int64_t i = 0; i < p.count; ++i) {
            if (shard && (p.offset + i < mine.begin || p.offset + i >= mine.end)) continue;
            const auto k = static_cast<size_t>(p.grad_offset + i);
            if (p.grad_type == Dtype::bf16) {
              EXPECT_EQ(cg[k], c_sum[k]) << what << ", " << p.name << "[" << i << "]";
            } else {
              EXPECT_EQ(std::bit_cast<uint32_t>(fg[k]), std::bit_cast<uint32_t>(f_sum[k]))
                  << what << ", " << p.name << "[" << i << "]";
            }
          }
        }
        if (!shard) {
          EXPECT_EQ(cg[20], c[rank][20]) << what << ": the padding between slices is not summed";
        }
      });
    }
  }
}

// Training on 4 ranks with a sharded optimizer and buckets of 97 gradients (straddling the shards), each
// rank's gradients outside its shard made NaN after every reduce-scatter: the gradient norm, clipping,
// the non-finite check and the update read none of them, so every rank holds one rank's bits; the sums
// were reduce-scatters only, and each rank sent per step exactly the gradients outside its own shard.
TEST(ShardedDataParallel, ReduceScattersOnlyAndReadsNothingOutsideTheShard) {
  const RunShape float32{.precision = MixedPrecision::fp32, .ranks = 4, .micro = 2, .shard = true};
  RunShape bf16 = float32;
  bf16.reduce = dist::GradientReduceType::bf16;
  // FP8 with the weight gradients kept in BF16: those summed in BF16, the rest in float32.
  RunShape bf16_weights = float32;
  bf16_weights.precision = MixedPrecision::fp8;
  bf16_weights.bf16_weight_gradients = true;
  for (const RunShape& s : {float32, bf16, bf16_weights}) {
    const Outcome reference = one_rank(s, pattern);
    std::vector<Outcome> outcomes(static_cast<size_t>(s.ranks));
    std::mutex mutex;
    std::vector<int64_t> sent(static_cast<size_t>(s.ranks));
    std::vector<dist::ShardRange> shards(static_cast<size_t>(s.ranks));
    std::vector<ParameterInfo> parameters;
    dist::run_ranks(s.ranks, [&](dist::Communicator& inner) {
      RecordingCommunicator c(inner, /*poison=*/true);
      auto backend = make_cpu_backend();
      std::unique_ptr<Model> m = model_of(s, *backend);
      Trainer trainer(*m, settings_of(s),
                      DataParallel{.communicator = &c,
                                   .shard_optimizer_state = true,
                                   .reduce_scatter = true,
                                   .reduce_type = s.reduce,
                                   .bucket_elements = 97});
      const BatchSource data =
          rank_batches(pattern(c.rank(), c.size(), nullptr), c.rank(), c.size(), s.micro, B, T);
      const Outcome o = train(s, *m, trainer, data);
      std::lock_guard lock(mutex);
      outcomes[static_cast<size_t>(c.rank())] = o;
      EXPECT_TRUE(c.all_reduces.empty()) << "rank " << c.rank() << " all-reduced gradients";
      EXPECT_GT(c.reduce_scatters.size(), static_cast<size_t>(kSteps));
      sent[static_cast<size_t>(c.rank())] = inner.traffic().reduce_scatter_bytes;
      EXPECT_EQ(inner.traffic().all_reduce_bytes, 0);
      shards[static_cast<size_t>(c.rank())] = trainer.optimizer().shard();
      parameters = m->parameters();
    });
    int64_t rounded = 0;
    for (const ParameterInfo& p : parameters) rounded += p.grad_precision == Dtype::bf16 ? p.count : 0;
    EXPECT_EQ(rounded > 0, s.bf16_weight_gradients);
    for (int r = 0; r < s.ranks; ++r) {
      expect_same(reference, outcomes[static_cast<size_t>(r)],
                  "rank " + std::to_string(r) + ", " + name_of(s));
      // Each gradient outside the rank's shard, sent once: two bytes where summed in BF16, four otherwise.
      int64_t bytes = 0;
      const dist::ShardRange& mine = shards[static_cast<size_t>(r)];
      for (const ParameterInfo& p : parameters) {
        const int64_t inside =
            std::max<int64_t>(0, std::min(p.offset + p.count, mine.end) - std::max(p.offset, mine.begin));
        const bool half = s.reduce == dist::GradientReduceType::bf16 || p.grad_precision == Dtype::bf16;
        bytes += (p.count - inside) * (half ? 2 : 4);
      }
      EXPECT_EQ(sent[static_cast<size_t>(r)], kSteps * bytes) << "rank " << r << ", " << name_of(s);
    }
  }
}

// The same ranks without a sharded optimizer all-reduce, and send twice (n - 1) / n of the gradients: twice
// the bytes of the reduce-scatter, over every rank.
TEST(ShardedDataParallel, AReduceScatterSendsHalfTheBytesOfAnAllReduce) {
  std::vector<int64_t> bytes(2);
  int64_t parameters = 0;
  for (const bool shard : {false, true}) {
    const RunShape s{.precision = MixedPrecision::fp32, .ranks = 4, .micro = 1, .shard = shard};
    std::mutex mutex;
    dist::run_ranks(s.ranks, [&](dist::Communicator& c) {
      auto backend = make_cpu_backend();
      std::unique_ptr<Model> m = model_of(s, *backend);
      Trainer trainer(*m, settings_of(s),
                      DataParallel{.communicator = &c, .shard_optimizer_state = shard, .reduce_scatter = shard, .bucket_elements = 0});
      const BatchSource data =
          rank_batches(pattern(c.rank(), c.size(), nullptr), c.rank(), c.size(), s.micro, B, T);
      trainer.step(data);
      std::lock_guard lock(mutex);
      bytes[shard ? 1 : 0] += c.traffic().all_reduce_bytes + c.traffic().reduce_scatter_bytes;
      parameters = m->parameter_count();
    });
  }
  // One bucket of every gradient (bucket_elements = 0): 4 ranks x 2 x 3/4 of it, against 4 x 3/4 of it.
  EXPECT_EQ(bytes[0], 4 * (2 * parameters * 4 * 3 / 4));
  EXPECT_EQ(bytes[1], 3 * parameters * 4);
}

}  // namespace
}  // namespace octet
