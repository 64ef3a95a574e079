// Data-parallel training on two GPUs of this machine over NCCL (one thread and one GPU a rank): with the
// optimizer state sharded, the gradients' sums are reduce-scattered during the backward (ncclReduce per
// shard that a bucket meets, grouped, or ncclReduceScatter), and the run is the all-reduced run's, bit for
// bit. Two ranks make that exact whatever NCCL's algorithm: every element's sum is one addition of two
// values, the same in either order. The gradient clipping is off, so that the norm (taken shard by shard
// with a sharded optimizer, over the whole buffer without) cannot move the update. An untied Llama's
// embedding gradient summed in the rows read only gives the bits of every row summed. Skips with fewer than
// two GPUs or without NCCL.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "octet/backend/cuda_backend.h"
#include "octet/dist/nccl_group.h"
#include "octet/model/model.h"
#include "octet/train/data_parallel.h"
#include "octet/train/trainer.h"

namespace octet {
namespace {

constexpr int64_t kB = 2, kT = 32, kSteps = 6;

ModelConfig two_block_gpt() {
  ModelConfig c;
  c.vocab_size = 250;
  c.padded_vocab_size = 256;
  c.max_seq_len = kT;
  c.layers = 2;
  c.heads = 4;
  c.channels = 64;
  return c;
}

// A Llama of the same size with an untied head: its embedding's gradient has rows for the tokens read only.
ModelConfig two_block_llama() {
  ModelConfig c = two_block_gpt();
  c.arch = ModelArchitecture::llama;
  c.kv_heads = 2;
  c.ffn_hidden = 128;
  c.rope_theta = 10000.0f;
  c.tie_embeddings = false;
  return c;
}

// The step's micro-batches in order, each rank keeping its own (rank_batches). Tokens drawn from `spread`
// ids (0: all V), starting at an id that moves with each micro-batch: the ranks read overlapping sets.
BatchSource tokens(uint64_t seed, int64_t V, int64_t spread = 0) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  auto batch = std::make_shared<int64_t>(0);
  return [rng, batch, V, spread](int32_t* in, int32_t* targets) {
    const int64_t first = spread > 0 ? (*batch)++ * 17 % V : 0;
    for (int64_t i = 0; i < kB * kT; ++i) {
      const uint64_t draw = (*rng)() % static_cast<uint64_t>(spread > 0 ? spread : V);
      in[i] = static_cast<int32_t>((first + static_cast<int64_t>(draw)) % V);
      targets[i] = static_cast<int32_t>((in[i] * 31 + 7) % V);
    }
  };
}

struct RankRun {
  std::vector<float> losses, norms, params;
  dist::Communicator::Traffic traffic;
  int64_t shard = 0, parameters = 0;
  int64_t gradient_bytes = 0;  // the bytes of one rank's gradients, as they are summed
  size_t released = 0;  // the bytes of stale float32 masters given back after the last step
  std::string error;
};

// How the two ranks train: float32 throughout by default; FP8 with a recipe, the FP8 weights gathered as
// codes, a Llama whose micro-batches read few token ids, where asked.
struct TwoGpuRun {
  bool shard = false;
  bool reduce_scatter = true;  // with shard: the sums reduce-scattered, or all-reduced
  dist::GradientReduceType reduce = dist::GradientReduceType::float32;
  MixedPrecision mode = MixedPrecision::fp32;
  RecipeKind recipe = RecipeKind::delayed;
  bool fp8_gather = false;
  bool llama = false;
  bool sparse_embedding_sums = true;
  int64_t spread = 0;  // tokens(): 0, every id
  int64_t channels = 64;
  bool bf16_weight_gradients = false;  // train.weight_gradients = "bf16": kept, and summed, as BF16 codes
  bool reshard = false;                // with fp8_gather: fully sharded weights
  bool transposes_per_use = false;     // fp8.recompute_weight_transposes
};

ModelConfig config_of(const TwoGpuRun& how) {
  ModelConfig config = how.llama ? two_block_llama() : two_block_gpt();
  config.channels = how.channels;
  if (how.llama) config.ffn_hidden = 2 * how.channels;
  return config;
}

std::unique_ptr<Model> model_of(const TwoGpuRun& how, Backend& backend) {
  const ModelConfig config = config_of(how);
  PrecisionSettings precision;
  precision.mode = how.mode;
  precision.recipe = how.recipe;
  precision.bf16_weight_gradients = how.bf16_weight_gradients;
  precision.recompute_weight_transposes = how.transposes_per_use;
  std::unique_ptr<Model> model =
      make_model(config, backend, PrecisionPolicy(precision, config, kB * kT * 2), kB, kT);
  model->init_weights(7);
  return model;
}

TrainSettings settings_of() {
  TrainSettings settings;
  settings.batch_size = kB;
  settings.seq_len = kT;
  settings.grad_clip = 0.0f;
  settings.schedule = LearningRateSchedule{3e-3f, 2, kSteps, 0.1f};
  return settings;
}

std::vector<RankRun> train_on_two_gpus(const TwoGpuRun& how) {
  const bool shard = how.shard;
  const std::vector<int> devices = {0, 1};
  dist::NcclGroup group(devices);
  std::vector<RankRun> runs(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[static_cast<size_t>(r)];
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
        CudaBackendOptions options;
        options.device = r;
        auto backend = make_cuda_backend(options);
        const ModelConfig config = config_of(how);
        std::unique_ptr<Model> model = model_of(how, *backend);
        const TrainSettings settings = settings_of();
        dist::Communicator& c = group.communicator(r);
        // Buckets of 5000 gradients: many, some straddling the two shards' boundary.
        Trainer trainer(*model, settings,
                        DataParallel{.communicator = &c,
                                     .shard_optimizer_state = shard,
                                     .reduce_scatter = shard && how.reduce_scatter,
                                     .fp8_weight_gather = how.fp8_gather,
                                     // The token embedding in place, the norms packed.
                                     .in_place_gather_floats = 2048,
                                     .reshard_after_forward = how.reshard,
                                     .reduce_type = how.reduce,
                                     .bucket_elements = 5000,
                                     .sparse_embedding_sums = how.sparse_embedding_sums});
        const BatchSource data = rank_batches(tokens(3, config.vocab_size, how.spread), r, 2, 1, kB, kT);
        for (int64_t s = 0; s < kSteps; ++s) {
          const StepResult result = trainer.step(data);
          run.losses.push_back(result.loss);
          run.norms.push_back(result.grad_norm);
        }
        run.released = trainer.released_master_bytes();
        trainer.gather_master_weights();
        backend->synchronize();
        run.params.resize(static_cast<size_t>(model->parameter_count()));
        backend->copy_to_host(run.params.data(), model->params(), run.params.size() * sizeof(float));
        run.traffic = c.traffic();
        run.shard = trainer.optimizer().sharded() ? trainer.optimizer().shard().size() : 0;
        run.parameters = model->parameter_count();
        for (const ParameterInfo& p : model->parameters()) {
          const bool half = how.reduce == dist::GradientReduceType::bf16 || p.grad_precision == Dtype::bf16;
          run.gradient_bytes += p.count * (half ? 2 : 4);
        }
      } catch (const std::exception& e) {
        run.error = e.what();
        group.abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rank r of run b trains as rank r of run a, bit for bit: the losses, the gradient norms and the parameters;
// and the model trains. `what` names the runs in the messages.
void expect_same_training(const RankRun& x, const RankRun& y, const std::string& what) {
  ASSERT_TRUE(x.error.empty()) << what << ": " << x.error;
  ASSERT_TRUE(y.error.empty()) << what << ": " << y.error;
  EXPECT_TRUE(same_bits(x.losses, y.losses)) << what;
  EXPECT_TRUE(same_bits(x.norms, y.norms)) << what;
  EXPECT_TRUE(same_bits(x.params, y.params)) << what;
  EXPECT_NE(x.losses.front(), x.losses.back()) << what << ": the model trains";
}

TEST(GpuDataParallel, ShardedSumsAreReduceScatteredAndTrainAsAllReduced) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  std::string why;
  if (!dist::nccl_available(&why)) GTEST_SKIP() << why;
  for (const dist::GradientReduceType reduce :
       {dist::GradientReduceType::float32, dist::GradientReduceType::bf16}) {
    const std::vector<RankRun> all_reduced = train_on_two_gpus({.shard = false, .reduce = reduce});
    const std::vector<RankRun> scattered = train_on_two_gpus({.shard = true, .reduce = reduce});
    const int64_t element = reduce == dist::GradientReduceType::bf16 ? 2 : 4;
    for (int r = 0; r < 2; ++r) {
      const RankRun& a = all_reduced[static_cast<size_t>(r)];
      const RankRun& b = scattered[static_cast<size_t>(r)];
      ASSERT_TRUE(a.error.empty()) << a.error;
      ASSERT_TRUE(b.error.empty()) << b.error;
      EXPECT_TRUE(same_bits(a.losses, b.losses)) << "rank " << r;
      EXPECT_TRUE(same_bits(a.params, b.params)) << "rank " << r;
      EXPECT_TRUE(same_bits(b.params, scattered[0].params)) << "every rank holds the same parameters";
      EXPECT_NE(a.losses.front(), a.losses.back()) << "the model trains";
      for (size_t s = 0; s < a.norms.size(); ++s) EXPECT_NEAR(a.norms[s], b.norms[s], 1e-5f * a.norms[s]);
      // What each rank sent: an all-reduce of every gradient, half of it on two ranks, against the gradients
      // outside its shard.
      EXPECT_EQ(a.traffic.reduce_scatters, 0);
      EXPECT_EQ(b.traffic.all_reduces, 0);
      EXPECT_EQ(a.traffic.all_reduce_bytes, kSteps * a.parameters * element);
      EXPECT_EQ(b.traffic.reduce_scatter_bytes, kSteps * (b.parameters - b.shard) * element);
      std::printf("[ nccl ] rank %d, %s sums: %lld bytes a step all-reduced, %lld reduce-scattered\n", r,
                  element == 2 ? "bf16" : "float32",
                  static_cast<long long>(a.traffic.all_reduce_bytes / kSteps),
                  static_cast<long long>(b.traffic.reduce_scatter_bytes / kSteps));
    }
  }
}

// The FP8 weights gathered as their codes (each rank casting its shard with the whole weight's amax over both
// GPUs, the copies and transposes made from the gathered codes) train exactly as float32 gathers followed by
// each rank's whole cast: the same losses and, once the float32 masters are gathered too, parameters.
TEST(GpuDataParallel, Fp8WeightGathersTrainAsFloat32Gathers) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  std::string why;
  if (!dist::nccl_available(&why)) GTEST_SKIP() << why;
  for (const auto& [recipe, llama] : {std::pair{RecipeKind::delayed, false}, std::pair{RecipeKind::current, false},
                                      std::pair{RecipeKind::delayed, true}}) {
    const TwoGpuRun float32{
        .shard = true, .mode = MixedPrecision::fp8, .recipe = recipe, .fp8_gather = false, .llama = llama};
    TwoGpuRun codes = float32;
    codes.fp8_gather = true;
    const std::vector<RankRun> a = train_on_two_gpus(float32), b = train_on_two_gpus(codes);
    for (int r = 0; r < 2; ++r) {
      expect_same_training(
          a[static_cast<size_t>(r)], b[static_cast<size_t>(r)],
          std::string(recipe_name(recipe)) + (llama ? ", llama" : "") + ", rank " + std::to_string(r));
    }
  }
}

// With FP8 weight gathers, each rank gives back the device memory of the stale float32 masters outside its
// shard (whole chunks of the parameter buffer, unmapped): models whose weights span several 2 MiB chunks
// train as with float32 gathers, bit for bit, so nothing reads or writes the memory given back (on the GPU
// that would be an illegal address, not a stale value), and gather_master_weights maps it back and makes
// the masters whole.
TEST(GpuDataParallel, TheStaleMastersMemoryIsGivenBackAndTrainingKeepsItsBits) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  std::string why;
  if (!dist::nccl_available(&why)) GTEST_SKIP() << why;
  for (const bool llama : {false, true}) {
    const TwoGpuRun float32{.shard = true,
                            .mode = MixedPrecision::fp8,
                            .recipe = RecipeKind::delayed,
                            .fp8_gather = false,
                            .llama = llama,
                            .channels = 512};
    TwoGpuRun codes = float32;
    codes.fp8_gather = true;
    const std::vector<RankRun> a = train_on_two_gpus(float32), b = train_on_two_gpus(codes);
    for (int r = 0; r < 2; ++r) {
      const RankRun& x = a[static_cast<size_t>(r)];
      const RankRun& y = b[static_cast<size_t>(r)];
      ASSERT_TRUE(x.error.empty()) << x.error;
      ASSERT_TRUE(y.error.empty()) << y.error;
      const std::string what = std::string(llama ? "llama" : "gpt2") + ", rank " + std::to_string(r);
      EXPECT_EQ(x.released, 0u) << what << ": float32 gathers leave nothing stale";
      // Each rank holds half of the FP8 weights (of 2 x 12 C^2 floats for GPT-2): at least 2 MiB is stale
      // in whole chunks.
      EXPECT_GE(y.released, size_t{2} << 20) << what;
      std::printf("%s: %.1f MiB of %.1f MiB of float32 masters given back\n", what.c_str(),
                  static_cast<double>(y.released) / (1 << 20),
                  static_cast<double>(y.parameters) * sizeof(float) / (1 << 20));
      expect_same_training(x, y, what);
    }
  }
}

// Fully sharded weights: the copies made from the gathered codes given back after each block's forward and
// backward (stream-ordered, to the device's pool) and gathered again for the backward. Models whose blocks
// span several 2 MiB chunks, with the transposes kept or made per use, train as with every copy held, bit for
// bit: so no GEMM reads a copy given back or one gathered from stale codes.
TEST(GpuDataParallel, FullyShardedWeightsTrainAsEveryCopyHeld) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  std::string why;
  if (!dist::nccl_available(&why)) GTEST_SKIP() << why;
  for (const auto& [recipe, llama, per_use] :
       {std::tuple{RecipeKind::delayed, false, false}, std::tuple{RecipeKind::current, true, false},
        std::tuple{RecipeKind::delayed, true, true}}) {
    const TwoGpuRun held{.shard = true,
                         .mode = MixedPrecision::fp8,
                         .recipe = recipe,
                         .fp8_gather = true,
                         .llama = llama,
                         .channels = 512,
                         .transposes_per_use = per_use};
    TwoGpuRun sharded = held;
    sharded.reshard = true;
    const std::vector<RankRun> a = train_on_two_gpus(held), b = train_on_two_gpus(sharded);
    for (int r = 0; r < 2; ++r) {
      expect_same_training(a[static_cast<size_t>(r)], b[static_cast<size_t>(r)],
                           std::string(recipe_name(recipe)) + (llama ? ", llama" : ", gpt2") +
                               (per_use ? ", transposes per use" : "") + ", rank " + std::to_string(r));
    }
  }
}

// The same two ranks on one GPU, emulated (Trainer's emulated ranks: each rank's micro-batches accumulated
// from zero, the ranks' gradients added on the host in rank order, BF16 ones rounded after every addition).
RankRun emulate_two_ranks(const TwoGpuRun& how) {
  RankRun run;
  CudaBackendOptions options;
  auto backend = make_cuda_backend(options);
  std::unique_ptr<Model> model = model_of(how, *backend);
  Trainer trainer(
      *model, settings_of(),
      DataParallel{.shard_optimizer_state = how.shard, .reduce_type = how.reduce, .emulated_ranks = 2});
  const BatchSource data = tokens(3, config_of(how).vocab_size, how.spread);
  for (int64_t s = 0; s < kSteps; ++s) {
    const StepResult result = trainer.step(data);
    run.losses.push_back(result.loss);
    run.norms.push_back(result.grad_norm);
  }
  backend->synchronize();
  run.params.resize(static_cast<size_t>(model->parameter_count()));
  backend->copy_to_host(run.params.data(), model->params(), run.params.size() * sizeof(float));
  return run;
}

// Weight gradients kept in BF16 (train.weight_gradients = "bf16"): the two GPUs sum them as BF16 codes in
// place (ncclBfloat16, no float32 copy), all-reduced or, with a sharded optimizer, reduce-scattered at their
// parameters' places, and every run is one GPU's emulating the two ranks, bit for bit: the losses and the
// parameters. Each rank sends two bytes for each weight gradient, four for the rest.
TEST(GpuDataParallel, WeightGradientsKeptInBf16AreSummedAsCodesAndTrainAsOneGpuEmulatingTwo) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  std::string why;
  if (!dist::nccl_available(&why)) GTEST_SKIP() << why;
  for (const bool llama : {false, true}) {
    for (const bool shard : {false, true}) {
      // Every embedding row summed, for the bytes below to be exact.
      const TwoGpuRun how{.shard = shard,
                          .mode = MixedPrecision::fp8,
                          .fp8_gather = shard,
                          .llama = llama,
                          .sparse_embedding_sums = false,
                          .bf16_weight_gradients = true};
      const std::vector<RankRun> two = train_on_two_gpus(how);
      const RankRun one = emulate_two_ranks(how);
      const std::string what = std::string(llama ? "llama" : "gpt2") + (shard ? ", sharded" : "");
      for (int r = 0; r < 2; ++r) {
        const RankRun& x = two[static_cast<size_t>(r)];
        ASSERT_TRUE(x.error.empty()) << x.error;
        EXPECT_NE(x.losses.front(), x.losses.back()) << "the model trains";
        EXPECT_TRUE(same_bits(x.losses, one.losses)) << what << ", rank " << r;
        EXPECT_TRUE(same_bits(x.params, one.params)) << what << ", rank " << r;
        for (size_t s = 0; s < x.norms.size(); ++s)
          EXPECT_NEAR(x.norms[s], one.norms[s], 1e-5f * one.norms[s]);
        EXPECT_LT(x.gradient_bytes, x.parameters * 4) << "some gradients are summed as BF16";
        if (shard) {
          EXPECT_EQ(x.traffic.all_reduces, 0);
          EXPECT_GT(x.traffic.reduce_scatter_bytes, 0);
        } else {
          EXPECT_EQ(x.traffic.all_reduce_bytes, kSteps * x.gradient_bytes) << what;
        }
        std::printf("[ nccl ] %s, rank %d: %lld gradient bytes a step, of %lld as float32\n", what.c_str(), r,
                    static_cast<long long>(x.gradient_bytes), static_cast<long long>(x.parameters * 4));
      }
    }
  }
}

// An untied Llama whose ranks read 40 of the 250 token ids a micro-batch: the embedding's gradient is summed
// in the rows some rank read only (TokenRowSums: rows gathered on the GPU, a compact NCCL all-reduce, rows
// written back), and the run is the run that sums every row, bit for bit, in float32 and in BF16, with and
// without a sharded optimizer (all-reduced); the bytes sent shrink by the rows no rank read.
TEST(GpuDataParallel, AnUntiedEmbeddingsRowsReadAreSummedAndTrainAsEveryRowSummed) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "fewer than 2 GPUs";
  std::string why;
  if (!dist::nccl_available(&why)) GTEST_SKIP() << why;
  for (const dist::GradientReduceType reduce :
       {dist::GradientReduceType::float32, dist::GradientReduceType::bf16}) {
    for (const bool shard : {false, true}) {
      TwoGpuRun how{.shard = shard, .reduce_scatter = false, .reduce = reduce, .llama = true, .spread = 40};
      const std::vector<RankRun> sparse = train_on_two_gpus(how);
      how.sparse_embedding_sums = false;
      const std::vector<RankRun> dense = train_on_two_gpus(how);
      const int64_t element = reduce == dist::GradientReduceType::bf16 ? 2 : 4;
      const int64_t table = two_block_llama().padded_vocab() * two_block_llama().channels;
      for (int r = 0; r < 2; ++r) {
        const RankRun& a = dense[static_cast<size_t>(r)];
        const RankRun& b = sparse[static_cast<size_t>(r)];
        ASSERT_TRUE(a.error.empty()) << a.error;
        ASSERT_TRUE(b.error.empty()) << b.error;
        EXPECT_NE(a.losses.front(), a.losses.back()) << "the model trains";
        EXPECT_TRUE(same_bits(a.losses, b.losses)) << "rank " << r;
        EXPECT_TRUE(same_bits(a.norms, b.norms)) << "rank " << r;
        EXPECT_TRUE(same_bits(a.params, b.params)) << "rank " << r;
        EXPECT_TRUE(same_bits(b.params, sparse[0].params)) << "every rank holds the same parameters";
        EXPECT_EQ(a.traffic.all_reduce_bytes, kSteps * a.parameters * element);
        // Two micro-batches of 40 ids a step: at most 80 of the table's 256 rows summed.
        EXPECT_LE(b.traffic.all_reduce_bytes, kSteps * (a.parameters - table + table * 80 / 256) * element);
        EXPECT_GT(b.traffic.all_reduce_bytes, kSteps * (a.parameters - table) * element);
        std::printf("[ nccl ] rank %d, %s sums%s: %lld bytes a step, %lld with every embedding row\n", r,
                    element == 2 ? "bf16" : "float32", shard ? ", sharded optimizer" : "",
                    static_cast<long long>(b.traffic.all_reduce_bytes / kSteps),
                    static_cast<long long>(a.traffic.all_reduce_bytes / kSteps));
      }
    }
  }
}

}  // namespace
}  // namespace octet
