// The sums of a token-indexed gradient over the rows some rank read (src/train/token_row_sums.h): the model
// names the gradient (an untied Llama's embedding, not GPT-2's tied table) and leaves +0 in the rows of the
// tokens not read; the sums of the rows read are the dense all-reduce's bits, in float32 and BF16, -0.0 and
// rows that one rank alone read included, and they move |U| rows where the dense sum moves the table; a
// Llama trained on 2 and 4 ranks holds the bits of the run that sums every row and of one rank, while each
// step's traffic is what the union of the step's tokens predicts.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "dist_fixture.h"
#include "octet/dist/in_process.h"
#include "overlapped_sums.h"
#include "token_row_sums.h"

namespace octet {
namespace {

using namespace dist_testing;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// What Communicator::count_all_reduce adds for a sum of `bytes` over `n` ranks.
int64_t ring_bytes(int64_t bytes, int64_t n) {
  return 2 * bytes * (n - 1) / n;
}

TEST(TokenRowGradient, AnUntiedEmbeddingHasOneTiedTablesDoNot) {
  auto backend = make_cpu_backend();
  const RunShape llama{.architecture = Architecture::llama};
  const std::unique_ptr<Model> untied = model_of(llama, *backend);
  const std::optional<Model::TokenRowGradient> g = untied->token_row_gradient();
  ASSERT_TRUE(g.has_value());
  const ParameterInfo& table = untied->parameter("embed_tokens.weight");
  EXPECT_EQ(g->offset, table.grad_offset);
  EXPECT_EQ(g->rows, table.shape[0]);
  EXPECT_EQ(g->cols, table.shape[1]);
  EXPECT_FALSE(model_of(RunShape{}, *backend)->token_row_gradient().has_value()) << "GPT-2: tied head";
  ModelConfig tied = testing::tiny_llama_config();
  tied.tie_embeddings = true;
  const std::unique_ptr<Model> m =
      make_model(tied, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), tied, B * T), B, T);
  EXPECT_FALSE(m->token_row_gradient().has_value()) << "a Llama whose head reads the table";
}

// After zero_grad and two micro-batches' backwards, the rows of the tokens read are non-zero and every other
// row is +0, bit for bit: what lets the ranks sum the rows read alone.
TEST(TokenRowGradient, RowsOfTokensNotReadHoldPositiveZero) {
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> m = model_of(RunShape{.architecture = Architecture::llama}, *backend);
  const Model::TokenRowGradient g = *m->token_row_gradient();
  m->zero_grad();
  std::set<int32_t> read;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int micro = 0; micro < 2; ++micro) {
    for (int64_t i = 0; i < B * T; ++i) {
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>(micro * 11 + i % 5);
      targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % 61);
      read.insert(tokens[static_cast<size_t>(i)]);
    }
    m->forward(tokens.data(), targets.data(), B, T, 1.0f / (2 * B * T));
    m->backward(1.0f / (2 * B * T));
  }
  const float* grads = m->grads() + g.offset;
  for (int64_t r = 0; r < g.rows; ++r) {
    bool zero = true, positive_zero = true;
    for (int64_t c = 0; c < g.cols; ++c) {
      const float x = grads[r * g.cols + c];
      zero = zero && x == 0.0f;
      positive_zero = positive_zero && std::bit_cast<uint32_t>(x) == 0u;
    }
    if (read.contains(static_cast<int32_t>(r))) {
      EXPECT_FALSE(zero) << "row " << r << " was read";
    } else {
      EXPECT_TRUE(positive_zero) << "row " << r << " was not read";
    }
  }
}

// A buffer of 3 + 13 x 5 + 4 gradients, the table [13, 5] at 3: each rank reads some rows (rank 0 row 12
// alone, every rank row 7, rank 1 none of its own), its table gradient random there and +0 elsewhere, and
// rank 0's row 12 holds a -0.0. The overlapped sums with the rows' sums give the dense all-reduce's bits in
// every element; the table's part moves |U| rows.
TEST(TokenRowSums, TheRowsReadSumToTheDenseAllReducesBits) {
  const Model::TokenRowGradient table{.offset = 3, .rows = 13, .cols = 5};
  const int64_t count = 3 + 13 * 5 + 4;
  for (const int ranks : {2, 3, 4}) {
    for (const dist::GradientReduceType type :
         {dist::GradientReduceType::float32, dist::GradientReduceType::bf16}) {
      for (const int64_t bucket : {int64_t{7}, count + 1}) {
        dist::run_ranks(ranks, [&](dist::Communicator& c) {
          std::vector<int32_t> tokens = {7, 7};
          if (c.rank() == 0) tokens.insert(tokens.end(), {12, 0, 2});
          if (c.rank() >= 2) tokens.push_back(static_cast<int32_t>(c.rank() + 2));
          std::mt19937 gen(static_cast<uint32_t>(c.rank() + 17));
          std::normal_distribution<float> d(0.0f, 1.0f);
          std::vector<float> grads(static_cast<size_t>(count), 0.0f);
          for (int64_t i = 0; i < count; ++i) {
            const int64_t row = (i - table.offset) / table.cols;
            const bool in_table = i >= table.offset && row < table.rows;
            if (!in_table || std::find(tokens.begin(), tokens.end(), row) != tokens.end()) {
              grads[static_cast<size_t>(i)] = d(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 16) - 8);
            }
          }
          if (c.rank() == 0) grads[static_cast<size_t>(table.offset + 12 * table.cols + 1)] = -0.0f;
          std::vector<float> dense = grads, sparse = grads;

          const dist::Communicator::Traffic before = c.traffic();
          OverlappedSums all(c, dense.data(), Dtype::f32, uniform_runs(count, type), nullptr, count + 1);
          all.finish();
          const int64_t dense_bytes = c.traffic().all_reduce_bytes - before.all_reduce_bytes;

          auto backend = make_cpu_backend();
          TokenRowSums rows(*backend, table);
          rows.clear();
          rows.add(tokens.data(), static_cast<int64_t>(tokens.size()));
          rows.agree(c);
          std::vector<int32_t> union_rows = {0, 2, 7, 12};
          for (int r = 2; r < ranks; ++r) union_rows.push_back(r + 2);
          std::sort(union_rows.begin(), union_rows.end());
          union_rows.erase(std::unique(union_rows.begin(), union_rows.end()), union_rows.end());
          EXPECT_EQ(rows.rows(), union_rows) << "every rank agrees on the sorted union";
          ASSERT_TRUE(rows.sparse());

          const dist::Communicator::Traffic middle = c.traffic();
          OverlappedSums some(c, sparse.data(), Dtype::f32, uniform_runs(count, type), nullptr, bucket, 0,
                              &rows);
          // The backward's reports: the last gradients first, the table in one run, then the first three.
          some.ready(table.offset + table.rows * table.cols, count);
          some.ready(table.offset, table.offset + table.rows * table.cols);
          some.ready(0, table.offset);
          some.finish();
          EXPECT_TRUE(same_bits(dense, sparse))
              << ranks << " ranks, bucket " << bucket << ", rank " << c.rank()
              << (type == dist::GradientReduceType::bf16 ? ", bf16" : "");
          EXPECT_EQ(std::bit_cast<uint32_t>(sparse[static_cast<size_t>(table.offset + 12 * table.cols + 1)]),
                    0u)
              << "rank 0's -0.0 plus the others' +0 is +0, as in the dense sum";
          const int64_t element = type == dist::GradientReduceType::bf16 ? 2 : 4;
          const int64_t sent = c.traffic().all_reduce_bytes - middle.all_reduce_bytes;
          EXPECT_LT(sent, dense_bytes);
          if (bucket > count) {  // one bucket: the first 3, the compact rows, the last 4
            EXPECT_EQ(c.traffic().all_reduces - middle.all_reduces, 3);
            EXPECT_EQ(sent,
                      ring_bytes(3 * element, ranks) +
                          ring_bytes(static_cast<int64_t>(union_rows.size()) * table.cols * element, ranks) +
                          ring_bytes(4 * element, ranks));
          }
        });
      }
    }
  }
}

// The table's gradient reported in part (a model that reports it otherwise) is summed densely, whole rows or
// not: a bucket that does not hold the whole table never takes the rows' path, and the result stays exact.
TEST(TokenRowSums, ABucketWithPartOfTheTableSumsItDensely) {
  const Model::TokenRowGradient table{.offset = 0, .rows = 4, .cols = 3};
  dist::run_ranks(2, [&](dist::Communicator& c) {
    std::vector<float> grads(12, 0.0f);
    grads[static_cast<size_t>(3 * c.rank())] = 1.5f;  // rank 0 reads row 0, rank 1 row 1
    std::vector<float> dense = grads;
    c.all_reduce_sum(std::span<float>(dense));
    auto backend = make_cpu_backend();
    TokenRowSums rows(*backend, table);
    const int32_t token = c.rank();
    rows.add(&token, 1);
    rows.agree(c);
    const dist::Communicator::Traffic before = c.traffic();
    OverlappedSums sums(c, grads.data(), Dtype::f32, uniform_runs(12, dist::GradientReduceType::float32),
                        nullptr, 5, 0, &rows);
    sums.ready(6, 12);
    sums.ready(0, 6);
    sums.finish();
    EXPECT_TRUE(same_bits(dense, grads));
    EXPECT_EQ(c.traffic().all_reduce_bytes - before.all_reduce_bytes, ring_bytes(12 * 4, 2)) << "every row";
  });
}

// Tokens from few ids, moving with each micro-batch: the ranks read overlapping sets, and a step reads a
// fraction of the table's rows.
BatchSource narrow(int, int, io::DataLoader**) {
  auto batch = std::make_shared<int64_t>(0);
  auto rng = std::make_shared<std::mt19937_64>(9);
  return [batch, rng](int32_t* tokens, int32_t* targets) {
    const int64_t V = testing::tiny_llama_config().vocab_size;
    const int64_t first = (*batch)++ * 5 % V;
    for (int64_t i = 0; i < B * T; ++i) {
      tokens[i] = static_cast<int32_t>((first + static_cast<int64_t>((*rng)() % 6)) % V);
      targets[i] = static_cast<int32_t>((tokens[i] * 7 + 3) % V);
    }
  };
}

// The rows each step of `s` reads on all ranks together: the union of the step's micro-batches.
std::vector<int64_t> rows_read_per_step(const RunShape& s) {
  const BatchSource source = narrow(0, 1, nullptr);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::vector<int64_t> out;
  for (int step = 0; step < kSteps; ++step) {
    std::set<int32_t> rows;
    for (int64_t m = 0; m < s.ranks * s.micro; ++m) {
      source(tokens.data(), targets.data());
      rows.insert(tokens.begin(), tokens.end());
    }
    out.push_back(static_cast<int64_t>(rows.size()));
  }
  return out;
}

struct SparseCase {
  RunShape shape;
  bool shard_all_reduce = false;  // a sharded optimizer whose sums are all-reduces
};

// An untied Llama trained with the embedding's rows read summed, and with every row summed: the same bits on
// every rank, which are one rank's; each step sent the dense sum's bytes less the rows no rank read.
TEST(SparseEmbeddingSums, ALlamaTrainsAsEveryRowSummedForTheBytesOfTheRowsRead) {
  for (const SparseCase& k :
       {SparseCase{{.architecture = Architecture::llama, .ranks = 2, .micro = 2}},
        SparseCase{
            {.architecture = Architecture::llama, .precision = MixedPrecision::fp8, .ranks = 2, .micro = 2}},
        SparseCase{{.architecture = Architecture::llama,
        .ranks = 4,
        .micro = 1,
        .reduce = dist::GradientReduceType::bf16}},
        SparseCase{{.architecture = Architecture::llama, .ranks = 2, .micro = 1, .shard = true}, true},
        SparseCase{{.architecture = Architecture::moe, .ranks = 2, .micro = 2}}}) {
    const RunShape& s = k.shape;
    const Outcome reference = one_rank(s, narrow);
    const std::vector<int64_t> rows_read = rows_read_per_step(s);
    std::vector<std::vector<Outcome>> outcomes(2, std::vector<Outcome>(static_cast<size_t>(s.ranks)));
    std::vector<std::vector<int64_t>> bytes(2, std::vector<int64_t>(static_cast<size_t>(s.ranks)));
    int64_t parameters = 0, table = 0, C = 0;
    std::mutex mutex;
    for (const bool sparse : {true, false}) {
      dist::run_ranks(s.ranks, [&](dist::Communicator& c) {
        auto backend = make_cpu_backend();
        std::unique_ptr<Model> m = model_of(s, *backend);
        Trainer trainer(*m, settings_of(s),
                        DataParallel{.communicator = &c,
                                     .shard_optimizer_state = s.shard,
                                     .reduce_scatter = s.shard && !k.shard_all_reduce,
                                     .reduce_type = s.reduce,
                                     .bucket_elements = 0,
                                     .sparse_embedding_sums = sparse});
        const BatchSource data = rank_batches(narrow(0, 1, nullptr), c.rank(), c.size(), s.micro, B, T);
        const Outcome o = train(s, *m, trainer, data);
        std::lock_guard lock(mutex);
        outcomes[sparse ? 0 : 1][static_cast<size_t>(c.rank())] = o;
        bytes[sparse ? 0 : 1][static_cast<size_t>(c.rank())] = c.traffic().all_reduce_bytes;
        parameters = m->parameter_count();
        table = m->token_row_gradient()->rows * m->token_row_gradient()->cols;
        C = m->token_row_gradient()->cols;
      });
    }
    const int64_t element = s.reduce == dist::GradientReduceType::bf16 ? 2 : 4;
    int64_t expected = 0;
    for (const int64_t rows : rows_read) {
      EXPECT_LT(rows * C, table / 2) << name_of(s) << ": a step reads less than half the table";
      // One bucket (bucket_elements 0): the compact rows, then the rest after the table.
      expected +=
          ring_bytes(rows * C * element, s.ranks) + ring_bytes((parameters - table) * element, s.ranks);
    }
    for (int r = 0; r < s.ranks; ++r) {
      const std::string who = name_of(s) + " rank " + std::to_string(r);
      expect_same(reference, outcomes[0][static_cast<size_t>(r)], who + ", rows read summed");
      expect_same(reference, outcomes[1][static_cast<size_t>(r)], who + ", every row summed");
      EXPECT_EQ(bytes[1][static_cast<size_t>(r)], kSteps * ring_bytes(parameters * element, s.ranks)) << who;
      EXPECT_EQ(bytes[0][static_cast<size_t>(r)], expected) << who;
    }
  }
}

}  // namespace
}  // namespace octet
