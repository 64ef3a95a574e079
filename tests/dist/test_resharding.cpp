// Checkpoints of data-parallel runs: two ranks with a sharded optimizer state write a checkpoint of shards
// (each rank its shard of the moments, under one manifest) whose files assemble to exactly what one rank
// accumulating the same global batch writes, and one, two or four ranks resume from it exactly: the same
// bits as one rank that resumes from its own checkpoint, the data loader continuing where it stood, and the
// same checkpoint at the end. A hybrid layout's checkpoint (2 shard groups of 2) holds the first group's 2
// shards and resumes likewise. Whole checkpoints still resume on any number of ranks.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "dist_fixture.h"
#include "octet/io/safetensors.h"
#include "octet/train/checkpoint.h"
#include "octet/train/checkpoint_shards.h"

namespace octet {
namespace {

using namespace dist_testing;

constexpr int kBefore = 2, kAfter = 3;  // steps before the checkpoint, and after it

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A run directory of its own, removed at the end.
struct RunDirectory {
  explicit RunDirectory(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("octet_resharding_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::remove_all(path);
  }
  ~RunDirectory() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

// Trains one shape for `steps` steps on s.ranks ranks (one rank emulating them when `emulate`), starting from
// `checkpoint` when given, and saves a checkpoint into `save_to` when given. Returns each rank's outcome.
std::vector<Outcome> run(const RunShape& s, bool emulate, const TokenShardFile& shard, int steps,
                         const std::filesystem::path& checkpoint, const std::filesystem::path& save_to) {
  const io::DataLoaderOptions options{B, T, true, 9, testing::tiny_config().vocab_size};
  auto one = [&](DataParallel parallel) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(s, *backend);
    Trainer trainer(*m, settings_of(s), parallel);
    io::DataLoader loader({shard.path()}, options);
    if (!checkpoint.empty()) {
      const CheckpointLoad loaded = load_checkpoint(checkpoint, *m, trainer);
      EXPECT_TRUE(loaded.progress.train_position.has_value());
      loader.seek(*loaded.progress.train_position);
    }
    BatchSource data = [&loader](int32_t* tokens, int32_t* targets) {
      loader.next_batch(std::span<int32_t>(tokens, B * T), std::span<int32_t>(targets, B * T));
    };
    if (parallel.communicator != nullptr) {
      data = rank_batches(data, parallel.rank(), static_cast<int>(parallel.ranks()), s.micro, B, T);
    }
    // Saved before the outcome is recorded (which brings stale float32 masters up to date), so that the save
    // itself must make the parameters whole.
    return train(s, *m, trainer, data, &loader, steps, [&] {
      if (save_to.empty()) return;
      TrainingProgress progress;
      progress.train_position = loader.position();
      save_checkpoint(save_to, *m, trainer, progress);
    });
  };
  if (emulate) {
    return {one(DataParallel{.shard_optimizer_state = s.shard,
                             .emulated_ranks = s.ranks,
                             .emulated_shard_ranks = s.replicate > 1 ? s.ranks / s.replicate : 0})};
  }
  std::vector<Outcome> outcomes(static_cast<size_t>(s.ranks));
  dist::run_ranks(s.ranks, [&](dist::Communicator& c) {
    // A hybrid layout's shard groups: consecutive ranks.
    const int group_size = s.ranks / s.replicate;
    const std::unique_ptr<dist::Communicator> group =
        s.replicate > 1 ? c.split(c.rank() / group_size, c.rank() % group_size) : nullptr;
    outcomes[static_cast<size_t>(c.rank())] =
        one(DataParallel{.communicator = &c,
                         .shard_optimizer_state = s.shard,
                         .fp8_weight_gather = s.fp8_gather,
                         .in_place_gather_floats = 2048,  // the token embedding in place, the norms packed
                         .shard_communicator = group.get()});
  });
  return outcomes;
}

// The master weights and moments a checkpoint holds, assembled in octet's layout whatever the layout of its
// files: a whole checkpoint's optimizer.safetensors, or a checkpoint of shards' parameters.safetensors and
// the moments of every rank's shard file.
struct Assembled {
  std::vector<float> params, m, v;
};
Assembled assembled(const std::filesystem::path& dir, const Model& model) {
  Assembled a;
  const int64_t n = model.parameter_count();
  a.params.resize(static_cast<size_t>(n));
  a.m.resize(static_cast<size_t>(n));
  a.v.resize(static_cast<size_t>(n));
  const bool shards = std::filesystem::exists(dir / kShardManifestFile);
  const io::SafetensorsFile exact =
      io::read_safetensors(dir / (shards ? kParametersFile : "optimizer.safetensors"));
  std::vector<std::pair<std::string, std::vector<float>*>> sets = {{"", &a.params}};
  if (!shards) sets.insert(sets.end(), {{"m.", &a.m}, {"v.", &a.v}});
  for (const auto& [prefix, out] : sets) {
    for (const ParameterInfo& p : model.parameters()) {
      const io::SafetensorsTensor* t = exact.find(prefix + p.name);
      EXPECT_NE(t, nullptr) << prefix << p.name;
      if (t != nullptr) std::copy(t->data.begin(), t->data.end(), out->begin() + p.offset);
    }
  }
  if (shards) {
    // Straight from the files, without the library's reader: m, then v, of each rank's elements.
    const ShardManifest manifest = read_shard_manifest(dir);
    EXPECT_EQ(manifest.parameter_count, n);
    for (const CheckpointShard& shard : manifest.optimizer) {
      const std::string bytes = file_bytes(dir / shard.file.name);
      const auto count = static_cast<size_t>(shard.end - shard.begin);
      EXPECT_EQ(bytes.size(), 2 * count * sizeof(float)) << shard.file.name;
      if (bytes.size() != 2 * count * sizeof(float)) continue;
      std::memcpy(a.m.data() + shard.begin, bytes.data(), count * sizeof(float));
      std::memcpy(a.v.data() + shard.begin, bytes.data() + count * sizeof(float), count * sizeof(float));
    }
  }
  return a;
}

// A checkpoint and another of the same state, file by file: state.json and model.safetensors byte for byte,
// the master weights and both moments bit for bit, whatever the layout of either.
void expect_same_checkpoint(const std::filesystem::path& expected, const std::filesystem::path& got,
                            const Model& model) {
  for (const char* file : {"model.safetensors", "state.json"}) {
    const std::string bytes = file_bytes(expected / file);
    EXPECT_FALSE(bytes.empty()) << file;
    EXPECT_TRUE(file_bytes(got / file) == bytes) << got / file << " differs from " << expected / file;
  }
  const Assembled a = assembled(expected, model), b = assembled(got, model);
  EXPECT_GT(std::count_if(a.m.begin(), a.m.end(), [](float x) { return x != 0.0f; }), 0)
      << "moments all zero";
  EXPECT_TRUE(dist_testing::same_bits(a.params, b.params)) << got << ": master weights";
  EXPECT_TRUE(dist_testing::same_bits(a.m, b.m)) << got << ": first moments";
  EXPECT_TRUE(dist_testing::same_bits(a.v, b.v)) << got << ": second moments";
}

std::unique_ptr<Model> tiny_model(Backend& backend) {
  return model_of(RunShape{.precision = MixedPrecision::fp8}, backend);
}

// Each layout of `afters` resumes from `ranks_checkpoint` kAfter steps, against one rank resuming from its
// own whole checkpoint `one_checkpoint` with the same split of the global batch: the same losses, weights,
// moments and scaling state on every rank, and the same checkpoint saved at the end (of shards exactly where
// the layout shards).
void expect_resumes_exactly(const std::vector<RunShape>& afters, const TokenShardFile& shard,
                            const std::filesystem::path& one_checkpoint,
                            const std::filesystem::path& ranks_checkpoint, const std::string& prefix,
                            const Model& model) {
  for (const RunShape& after : afters) {
    const std::string name = name_of(after);
    const RunDirectory reference_dir(prefix + "reference_" + name), resumed_dir(prefix + "resumed_" + name);
    const std::vector<Outcome> reference =
        run(after, true, shard, kAfter, one_checkpoint, reference_dir.path);
    const std::vector<Outcome> resumed = run(after, false, shard, kAfter, ranks_checkpoint, resumed_dir.path);
    ASSERT_EQ(resumed.size(), static_cast<size_t>(after.ranks)) << name;
    for (int r = 0; r < after.ranks; ++r) {
      expect_same(reference[0], resumed[static_cast<size_t>(r)], name + ", rank " + std::to_string(r));
    }
    const std::filesystem::path saved = checkpoint_directory(resumed_dir.path, kBefore + kAfter);
    EXPECT_EQ(std::filesystem::exists(saved / kShardManifestFile), after.shard) << name;
    expect_same_checkpoint(checkpoint_directory(reference_dir.path, kBefore + kAfter), saved, model);
  }
}

TEST(Resharding, TwoShardedRanksSaveShardsThatAssembleToOneRanksCheckpoint) {
  const TokenShardFile shard;
  const RunShape before{.precision = MixedPrecision::fp8, .ranks = 2, .micro = 2, .shard = true};
  const RunDirectory one_dir("one"), ranks_dir("ranks");
  run(before, true, shard, kBefore, {}, one_dir.path);
  run(before, false, shard, kBefore, {}, ranks_dir.path);
  const std::filesystem::path one = checkpoint_directory(one_dir.path, kBefore);
  const std::filesystem::path shards = checkpoint_directory(ranks_dir.path, kBefore);

  // One rank (whose optimizer is whole) writes a whole checkpoint; the sharded ranks a checkpoint of shards.
  EXPECT_FALSE(std::filesystem::exists(one / kShardManifestFile));
  ASSERT_TRUE(std::filesystem::exists(shards / kShardManifestFile));
  EXPECT_FALSE(std::filesystem::exists(shards / "optimizer.safetensors"));
  const ShardManifest manifest = read_shard_manifest(shards);
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model = tiny_model(*backend);
  EXPECT_EQ(manifest.ranks, 2);
  EXPECT_EQ(manifest.step, kBefore);
  EXPECT_EQ(manifest.parameter_count, model->parameter_count());
  ASSERT_EQ(manifest.optimizer.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const CheckpointShard& s = manifest.optimizer[static_cast<size_t>(r)];
    const dist::ShardRange range = dist::shard_range(model->parameter_count(), r, 2);
    EXPECT_EQ(s.begin, range.begin);
    EXPECT_EQ(s.end, range.end);
    EXPECT_EQ(s.file.digest, checkpoint_digest(file_bytes(shards / s.file.name))) << s.file.name;
  }
  for (const CheckpointFileRecord& f : manifest.files) {
    EXPECT_EQ(f.digest, checkpoint_digest(file_bytes(shards / f.name))) << f.name;
    EXPECT_EQ(f.bytes, static_cast<int64_t>(file_bytes(shards / f.name).size())) << f.name;
  }
  // No staging directory is left, and nothing but the listed files is in the checkpoint.
  EXPECT_FALSE(std::filesystem::exists(shards.parent_path() / (".tmp_" + shards.filename().string())));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(shards)) ++files;
  EXPECT_EQ(files, manifest.files.size() + manifest.optimizer.size() + 1);
  expect_same_checkpoint(one, shards, *model);
  // The library's range reader gives the same moments, for any range across the shards.
  const Assembled whole = assembled(one, *model);
  const int64_t n = model->parameter_count();
  for (const auto& [begin, end] :
       {std::pair<int64_t, int64_t>{0, n}, {n / 3, n - n / 3}, {n / 2 - 1, n / 2 + 2}}) {
    const MomentRange r = read_moment_range(shards, manifest, begin, end);
    EXPECT_EQ(0, std::memcmp(r.m.data(), whole.m.data() + begin, r.m.size() * sizeof(float))) << begin;
    EXPECT_EQ(0, std::memcmp(r.v.data(), whole.v.data() + begin, r.v.size() * sizeof(float))) << begin;
  }
}

// Two sharded ranks save at step 2; the run resumes on 1, 2 and 4 ranks (sharded, and 4 ranks that keep the
// whole state), each against one rank that resumes from its own whole checkpoint with the same split of the
// global batch. The losses, weights, moments and scaling state match bit for bit, and so do the checkpoints
// each saves at the end, whatever their layout.
TEST(Resharding, ACheckpointOfTwoShardedRanksResumesOnOneTwoAndFourRanks) {
  const TokenShardFile shard;
  // The ranks gather their FP8 weights as codes: the save must make the float32 masters whole first.
  const RunShape before{
      .precision = MixedPrecision::fp8, .ranks = 2, .micro = 2, .shard = true, .fp8_gather = true};
  const RunDirectory one_dir("one"), ranks_dir("ranks");
  run(before, true, shard, kBefore, {}, one_dir.path);
  run(before, false, shard, kBefore, {}, ranks_dir.path);
  const std::filesystem::path one_checkpoint = checkpoint_directory(one_dir.path, kBefore);
  const std::filesystem::path ranks_checkpoint = checkpoint_directory(ranks_dir.path, kBefore);
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model = tiny_model(*backend);

  // The same global batch of 4 micro-batches a step, split ranks x micro.
  const std::vector<RunShape> afters = {
      {.precision = MixedPrecision::fp8, .ranks = 1, .micro = 4, .shard = true},
      {.precision = MixedPrecision::fp8, .ranks = 2, .micro = 2, .shard = true},
      {.precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true, .fp8_gather = true},
      {.precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = false}};
  expect_resumes_exactly(afters, shard, one_checkpoint, ranks_checkpoint, "", *model);
}

// A hybrid layout (dp_shard = 2, dp_replicate = 2) saves a checkpoint of 2 shards, written by the ranks of
// the first shard group (the second group's ranks write nothing but take part in the save's agreement), that
// assembles to one rank's checkpoint; it resumes on 1 rank, on 4 ranks sharding over all 4 (dp_shard = 4)
// and on 2 x 2 ranks again, each exactly as one rank resuming from its own checkpoint.
TEST(Resharding, ACheckpointOfAHybridLayoutResumesOnOneRankAndOnFourShardedRanks) {
  const TokenShardFile shard;
  const RunShape before{
      .precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true, .replicate = 2};
  const RunDirectory one_dir("hybrid_one"), ranks_dir("hybrid_ranks");
  run(before, true, shard, kBefore, {}, one_dir.path);
  run(before, false, shard, kBefore, {}, ranks_dir.path);
  const std::filesystem::path one_checkpoint = checkpoint_directory(one_dir.path, kBefore);
  const std::filesystem::path ranks_checkpoint = checkpoint_directory(ranks_dir.path, kBefore);
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> model = tiny_model(*backend);

  const ShardManifest manifest = read_shard_manifest(ranks_checkpoint);
  EXPECT_EQ(manifest.ranks, 2) << "one shard per rank of a shard group";
  ASSERT_EQ(manifest.optimizer.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const CheckpointShard& s = manifest.optimizer[static_cast<size_t>(r)];
    const dist::ShardRange range = dist::shard_range(model->parameter_count(), r, 2);
    EXPECT_EQ(s.begin, range.begin);
    EXPECT_EQ(s.end, range.end);
    EXPECT_EQ(s.file.name, optimizer_shard_file_name(r, 2));
  }
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(ranks_checkpoint)) ++files;
  EXPECT_EQ(files, manifest.files.size() + manifest.optimizer.size() + 1) << "no file of 4 shards";
  expect_same_checkpoint(one_checkpoint, ranks_checkpoint, *model);

  const std::vector<RunShape> afters = {
      {.precision = MixedPrecision::fp8, .ranks = 1, .micro = 4, .shard = true},
      {.precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true},
      {.precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true, .replicate = 2}};
  expect_resumes_exactly(afters, shard, one_checkpoint, ranks_checkpoint, "hybrid_", *model);
}

// A whole checkpoint (one rank's, as older octet versions wrote for any number of ranks) resumes on sharded
// ranks, and a checkpoint of shards loads the master weights alone (--init-from, export) and into a trainer
// that keeps the whole state.
TEST(Resharding, WholeCheckpointsResumeOnShardedRanksAndShardsLoadWhole) {
  const TokenShardFile shard;
  const RunShape before{.precision = MixedPrecision::fp8, .ranks = 2, .micro = 2, .shard = true};
  const RunDirectory one_dir("one"), ranks_dir("ranks");
  run(before, true, shard, kBefore, {}, one_dir.path);
  run(before, false, shard, kBefore, {}, ranks_dir.path);
  const std::filesystem::path one_checkpoint = checkpoint_directory(one_dir.path, kBefore);
  const std::filesystem::path ranks_checkpoint = checkpoint_directory(ranks_dir.path, kBefore);

  const RunShape after{.precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true};
  const std::vector<Outcome> reference = run(after, true, shard, kAfter, one_checkpoint, {});
  const std::vector<Outcome> four = run(after, false, shard, kAfter, one_checkpoint, {});
  for (int r = 0; r < after.ranks; ++r)
    expect_same(reference[0], four[static_cast<size_t>(r)], "rank " + std::to_string(r));

  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> a = tiny_model(*backend), b = tiny_model(*backend);
  load_checkpoint_weights(one_checkpoint, *a);
  load_checkpoint_weights(ranks_checkpoint, *b);
  const int64_t n = a->parameter_count();
  EXPECT_EQ(0, std::memcmp(a->params(), b->params(), static_cast<size_t>(n) * sizeof(float)));
  Trainer ta(*a, settings_of(before)), tb(*b, settings_of(before));
  load_checkpoint(one_checkpoint, *a, ta);
  load_checkpoint(ranks_checkpoint, *b, tb);
  EXPECT_EQ(0, std::memcmp(ta.optimizer().first_moment(), tb.optimizer().first_moment(),
                           static_cast<size_t>(n) * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(ta.optimizer().second_moment(), tb.optimizer().second_moment(),
                           static_cast<size_t>(n) * sizeof(float)));
  EXPECT_EQ(ta.steps_done(), tb.steps_done());
}

}  // namespace
}  // namespace octet
