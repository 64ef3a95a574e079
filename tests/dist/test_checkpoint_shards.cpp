// Checkpoints of shards refused when damaged: the manifest's reader refuses everything octet never writes
// (including seeded truncations and garbled copies of a real manifest, which must never crash it), a
// checkpoint whose files disagree with its manifest is refused with one invalid_input error and the model
// left untouched, a damaged newer checkpoint is named rather than skipped, and a save that fails on any rank
// fails on every rank and leaves the previous checkpoint as it was, with a hybrid layout too, whose first
// shard group alone writes the shards.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "dist_fixture.h"
#include "octet/train/checkpoint.h"
#include "octet/train/checkpoint_shards.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using namespace dist_testing;

const std::string kOrigin = "run/checkpoints/step_000002/shards.json";

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

struct TempDirectory {
  explicit TempDirectory(const std::string& name)
      : path(fs::temp_directory_path() / ("octet_shards_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
  }
  ~TempDirectory() { fs::remove_all(path); }
  fs::path path;
};

const RunShape kShape{.precision = MixedPrecision::fp8, .ranks = 2, .micro = 1, .shard = true};

// Trains kShape for `steps` steps on its ranks as threads and saves into `run_dir` after every step; the
// options' hook is given to the save after step `fail_at` only, with the rank that calls it.
void train_and_save(const fs::path& run_dir, int steps, int fail_at = -1,
                    const std::function<void(int rank, const fs::path&)>& hook = {}) {
  dist::run_ranks(kShape.ranks, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(kShape, *backend);
    Trainer trainer(*m, settings_of(kShape), DataParallel{.communicator = &c, .shard_optimizer_state = true});
    const BatchSource data = rank_batches(pattern(0, 1, nullptr), c.rank(), c.size(), kShape.micro, B, T);
    for (int step = 1; step <= steps; ++step) {
      trainer.step(data);
      CheckpointOptions options;
      if (step == fail_at) options.after_file_written = [&](const fs::path& file) { hook(c.rank(), file); };
      save_checkpoint(run_dir, *m, trainer, TrainingProgress{}, options);
    }
  });
}

// The error of loading `dir` into a fresh one-rank model and trainer ("loaded" when there was none); the
// model's weights must be untouched by a refused load.
std::string load_refusal(const fs::path& dir) {
  auto backend = make_cpu_backend();
  std::unique_ptr<Model> m = model_of(kShape, *backend);
  Trainer trainer(*m, settings_of(kShape));
  const std::vector<float> before(m->params(), m->params() + m->parameter_count());
  try {
    load_checkpoint(dir, *m, trainer);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    EXPECT_TRUE(same_bits(before, std::vector<float>(m->params(), m->params() + m->parameter_count())))
        << "a refused load changed the weights: " << e.what();
    return e.what();
  }
  return "loaded";
}

std::string manifest_refusal(const std::string& text) {
  try {
    parse_shard_manifest(text, kOrigin);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "accepted";
}

class CheckpointShards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    run_ = new TempDirectory("run");
    train_and_save(run_->path, 2);
  }
  static void TearDownTestSuite() {
    delete run_;
    run_ = nullptr;
  }
  static fs::path checkpoint() { return checkpoint_directory(run_->path, 2); }
  // A copy of the good checkpoint to damage.
  static fs::path copy_of_checkpoint(const TempDirectory& into) {
    const fs::path dir = into.path / "checkpoints" / "step_000002";
    fs::create_directories(dir.parent_path());
    fs::copy(checkpoint(), dir, fs::copy_options::recursive);
    return dir;
  }
  static TempDirectory* run_;
};
TempDirectory* CheckpointShards::run_ = nullptr;

TEST_F(CheckpointShards, TheManifestRoundTrips) {
  const std::string text = file_bytes(checkpoint() / kShardManifestFile);
  const ShardManifest m = parse_shard_manifest(text, kOrigin);
  EXPECT_EQ(m.ranks, 2);
  EXPECT_EQ(m.step, 2);
  EXPECT_EQ(shard_manifest_text(m), text);
  EXPECT_EQ(load_refusal(checkpoint()), "loaded");
}

TEST_F(CheckpointShards, TheDigestIsTheDocumentedOne) {
  // An independent reference: the definition in checkpoint_shards.h, a byte at a time.
  auto reference = [](const std::string& bytes) {
    uint64_t h = 14695981039346656037ull;
    auto mix = [&h](uint64_t w) {
      h = (h ^ w) * 1099511628211ull;
      h ^= h >> 32;
    };
    for (size_t i = 0; i < bytes.size(); i += 8) {
      uint64_t w = 0;
      for (size_t k = 0; k < 8 && i + k < bytes.size(); ++k)
        w |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i + k])) << (8 * k);
      mix(w);
    }
    mix(bytes.size());
    return h;
  };
  std::mt19937_64 rng(7);
  for (const size_t size : {0, 1, 7, 8, 9, 15, 16, 17, 1000, 4099}) {
    std::string bytes(size, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    EXPECT_EQ(checkpoint_digest(bytes), reference(bytes)) << size;
    // Fed in uneven pieces, the same.
    CheckpointDigest pieces;
    for (size_t at = 0; at < size;) {
      const size_t n = std::min(size - at, static_cast<size_t>(1 + rng() % 13));
      pieces.update(bytes.data() + at, n);
      at += n;
    }
    EXPECT_EQ(pieces.finish(), reference(bytes)) << size;
  }
  EXPECT_NE(checkpoint_digest(std::string(8, '\0')), checkpoint_digest(std::string(16, '\0')));
}

TEST_F(CheckpointShards, TheManifestReaderRefusesWhatOctetNeverWrites) {
  const std::string good = file_bytes(checkpoint() / kShardManifestFile);
  const ShardManifest m = parse_shard_manifest(good, kOrigin);
  const std::string end0 = "\"end\": " + std::to_string(m.optimizer[0].end);
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not valid JSON"},
      {"[1]", "must hold a JSON object"},
      {replaced("\"format_version\": 1", "\"format_version\": 2"),
       "has format_version 2; this octet reads 1"},
      {replaced("octet-checkpoint-shards", "octet-checkpoint"), "is not an octet checkpoint manifest"},
      {replaced("\"ranks\": 2", "\"ranks\": 3"), "must list one shard for each of the 3 ranks, got 2"},
      {replaced("\"ranks\": 2", "\"ranks\": 0"), "ranks must be from 1"},
      {replaced(end0, "\"end\": " + std::to_string(m.optimizer[0].end - 1)), "rank 0 of 2 owns"},
      {replaced("\"rank\": 1", "\"rank\": 0"), "shards[1].rank must be 1, got 0"},
      {replaced("optimizer-00001-of-00002.bin", "../optimizer-00001-of-00002.bin"),
       "must be a plain file name"},
      {replaced("optimizer-00001-of-00002.bin", "optimizer-00001-of-00003.bin"),
       "file must be optimizer-00001-of-00002.bin"},
      {replaced("\"name\": \"state.json\"", "\"name\": \"model.safetensors\""), "is listed twice"},
      {replaced("\"name\": \"state.json\"", "\"name\": \"shards.json\""), "names the manifest"},
      {replaced("\"name\": \"parameters.safetensors\"", "\"name\": \"other.safetensors\""),
       "files does not list parameters.safetensors"},
      {replaced("\"optimizer\": {", "\"parameters\": {}, \"optimizer\": {"), "kind \"parameters\""},
      {replaced("\"dtype\": \"F32\"", "\"dtype\": \"BF16\""), "dtype must be \"F32\""},
      {replaced("\"digest\": \"octet-digest64\"", "\"digest\": \"sha256\""),
       "digest must be \"octet-digest64\""},
      {replaced("\"step\": 2", "\"step\": -2"), "step must be from 0"},
      {replaced("\"step\": 2", "\"step\": 2, \"step\": 2"), "appears twice in one object"},
      {replaced("\"step\": 2", "\"step\": 2, \"extra\": 1"), "unknown member \"extra\""},
      {replaced("\"parameter_count\": ", "\"parameter_count\": 1"), "owns"},
      {std::string(100, '[') + std::string(100, ']'), "nested deeper"},
  };
  for (const auto& [text, words] : cases) {
    const std::string message = manifest_refusal(text);
    EXPECT_NE(message.find(kOrigin), std::string::npos) << message;
    EXPECT_NE(message.find(words), std::string::npos) << "wanted '" << words << "' in: " << message;
  }
  // A shard's size must be 8 bytes an element.
  const std::string bytes1 = "\"bytes\": " + std::to_string(m.optimizer[1].file.bytes);
  std::string t = good;
  t.replace(t.rfind(bytes1), bytes1.size(), "\"bytes\": " + std::to_string(m.optimizer[1].file.bytes + 8));
  EXPECT_NE(manifest_refusal(t).find("bytes must be"), std::string::npos) << manifest_refusal(t);
  // A digest that is not 16 hexadecimal digits.
  t = good;
  const size_t digest_at = t.find("\"digest\": \"", t.find("\"files\""));
  t.replace(digest_at + 11, 1, "G");
  EXPECT_NE(manifest_refusal(t).find("16 lowercase hexadecimal digits"), std::string::npos)
      << manifest_refusal(t);
}

TEST_F(CheckpointShards, TruncatedOrGarbledManifestsAreRefusedCleanly) {
  const std::string good = file_bytes(checkpoint() / kShardManifestFile);
  ASSERT_EQ(manifest_refusal(good), "accepted");
  int64_t refused = 0;
  for (size_t n = 0; n < good.size(); n += 7) refused += manifest_refusal(good.substr(0, n)) != "accepted";
  EXPECT_EQ(refused, static_cast<int64_t>((good.size() + 6) / 7)) << "every proper prefix is refused";
  std::mt19937_64 rng(2026);
  int64_t accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string t = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) t[rng() % t.size()] = static_cast<char>(rng() % 256);
    try {
      const ShardManifest m = parse_shard_manifest(t, kOrigin);
      ++accepted;
      // Whatever reads as valid is valid: the shards tile the parameter buffer in rank order.
      ASSERT_EQ(m.optimizer.size(), static_cast<size_t>(m.ranks));
      int64_t next = 0;
      for (const CheckpointShard& s : m.optimizer) {
        EXPECT_EQ(s.begin, next);
        EXPECT_EQ(s.file.bytes, 8 * (s.end - s.begin));
        next = s.end;
      }
      EXPECT_EQ(next, m.parameter_count);
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_code(), 2) << e.what();
      EXPECT_NE(std::string(e.what()).find(kOrigin), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(accepted, 2000) << "garbling is noticed";
}

TEST_F(CheckpointShards, DamagedCheckpointsAreRefusedWithoutChangingTheModel) {
  const ShardManifest manifest = read_shard_manifest(checkpoint());
  const std::string shard1 = manifest.optimizer[1].file.name;
  const std::string text = file_bytes(checkpoint() / kShardManifestFile);
  struct Damage {
    std::string name;
    std::function<void(const fs::path&)> apply;
    std::string words;
  };
  const std::vector<Damage> damages = {
      {"missing_shard", [&](const fs::path& d) { fs::remove(d / shard1); }, shard1 + " is missing"},
      {"short_shard",
       [&](const fs::path& d) {
         const std::string b = file_bytes(d / shard1);
         write_bytes(d / shard1, b.substr(0, b.size() - 8));
       },
       shard1 + " has"},
      {"garbled_shard",
       [&](const fs::path& d) {
         std::string b = file_bytes(d / shard1);
         b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 0x40);
         write_bytes(d / shard1, b);
       },
       "the file is damaged"},
      {"missing_parameters", [&](const fs::path& d) { fs::remove(d / kParametersFile); },
       "parameters.safetensors is missing"},
      {"garbled_state",
       [&](const fs::path& d) {
         std::string b = file_bytes(d / "state.json");
         b[b.size() / 3] = b[b.size() / 3] == ' ' ? '\t' : ' ';
         write_bytes(d / "state.json", b);
       },
       "state.json: its digest is"},
      {"manifest_of_another_step",
       [&](const fs::path& d) {
         std::string t = text;
         t.replace(t.find("\"step\": 2"), 9, "\"step\": 3");
         write_bytes(d / kShardManifestFile, t);
       },
       "step 3, but state.json holds step 2"},
      {"garbled_manifest",
       [&](const fs::path& d) { write_bytes(d / kShardManifestFile, text.substr(0, 100)); },
       "checkpoint manifest"},
      {"both_layouts",
       [&](const fs::path& d) { fs::copy_file(d / kParametersFile, d / "optimizer.safetensors"); },
       "holds both optimizer.safetensors"},
  };
  for (const Damage& damage : damages) {
    const TempDirectory copy(damage.name);
    const fs::path dir = copy_of_checkpoint(copy);
    damage.apply(dir);
    const std::string message = load_refusal(dir);
    EXPECT_NE(message.find(damage.words), std::string::npos)
        << damage.name << ": wanted '" << damage.words << "' in: " << message;
    // Nor does a run take it for a checkpoint to continue from: it names it (damage that only reading the
    // files finds is found by the load).
    if (damage.name != "garbled_shard" && damage.name != "garbled_state") {
      EXPECT_TRUE(list_checkpoints(copy.path).empty()) << damage.name;
      try {
        checkpoint_to_continue(copy.path);
        ADD_FAILURE() << damage.name << ": a damaged checkpoint was not named";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("is damaged"), std::string::npos) << e.what();
      }
    }
  }
  // Ranks loading a damaged checkpoint all refuse it.
  const TempDirectory copy("ranks");
  const fs::path dir = copy_of_checkpoint(copy);
  fs::remove(dir / shard1);
  std::vector<std::string> messages(2);
  dist::run_ranks(2, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(kShape, *backend);
    Trainer trainer(*m, settings_of(kShape), DataParallel{.communicator = &c, .shard_optimizer_state = true});
    try {
      load_checkpoint(dir, *m, trainer);
    } catch (const Error& e) {
      messages[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const std::string& message : messages)
    EXPECT_NE(message.find(shard1 + " is missing"), std::string::npos);
}

TEST(CheckpointShardSaves, AFailureOnAnyRankFailsTheSaveOnEveryRankAndKeepsThePreviousCheckpoint) {
  for (const auto& [failing_rank, failing_file] :
       {std::pair<int, std::string>{1, "optimizer-00001-of-00002.bin"},
        {0, "model.safetensors"},
        {0, std::string(kShardManifestFile)}}) {
    const TempDirectory run("interrupted_" + std::to_string(failing_rank) + "_" + failing_file);
    std::string failure;
    try {
      train_and_save(
          run.path, 2, 2,
          [&, failing_rank = failing_rank, failing_file = failing_file](int rank, const fs::path& file) {
            if (rank == failing_rank && file.filename() == failing_file)
              throw Error(ErrorKind::invalid_input, "disk full");
          });
    } catch (const Error& e) {
      failure = e.what();
    }
    EXPECT_NE(failure.find("rank " + std::to_string(failing_rank) + " of 2: disk full"), std::string::npos)
        << failing_file << ": " << failure;
    // Step 1's checkpoint is the latest, complete, and loads; step 2's never became a checkpoint.
    EXPECT_FALSE(fs::exists(checkpoint_directory(run.path, 2))) << failing_file;
    ASSERT_EQ(list_checkpoints(run.path), std::vector<fs::path>{checkpoint_directory(run.path, 1)})
        << failing_file;
    EXPECT_EQ(load_refusal(checkpoint_directory(run.path, 1)), "loaded") << failing_file;
    EXPECT_EQ(checkpoint_to_continue(run.path), checkpoint_directory(run.path, 1)) << failing_file;
  }
  // The next save removes what the failed one left.
  const TempDirectory run("after_failure");
  try {
    train_and_save(run.path, 2, 2, [](int rank, const fs::path&) {
      if (rank == 1) throw Error(ErrorKind::invalid_input, "disk full");
    });
  } catch (const Error&) {
  }
  EXPECT_TRUE(fs::exists(run.path / "checkpoints" / ".tmp_step_000002"));
  train_and_save(run.path, 3);
  EXPECT_FALSE(fs::exists(run.path / "checkpoints" / ".tmp_step_000002"));
  EXPECT_EQ(list_checkpoints(run.path).size(), 3u);
}

TEST(CheckpointShardSaves, AHybridLayoutsFirstGroupWritesTheShardsAndEveryRankAgrees) {
  // 4 ranks as 2 shard groups of 2: ranks 0 and 1 write the 2 shards, ranks 2 and 3 hold the same state and
  // write nothing; a shard that fails on rank 1 fails the save on all 4, naming it.
  const RunShape shape{
      .precision = MixedPrecision::fp8, .ranks = 4, .micro = 1, .shard = true, .replicate = 2};
  const TempDirectory run("hybrid");
  std::vector<std::string> failures(4);
  dist::run_ranks(4, [&](dist::Communicator& c) {
    auto backend = make_cpu_backend();
    std::unique_ptr<Model> m = model_of(shape, *backend);
    const std::unique_ptr<dist::Communicator> group = c.split(c.rank() / 2, c.rank() % 2);
    Trainer trainer(
        *m, settings_of(shape),
        DataParallel{.communicator = &c, .shard_optimizer_state = true, .shard_communicator = group.get()});
    const BatchSource data = rank_batches(pattern(0, 1, nullptr), c.rank(), c.size(), shape.micro, B, T);
    std::vector<fs::path> written;
    for (int step = 1; step <= 2; ++step) {
      trainer.step(data);
      CheckpointOptions options;
      options.after_file_written = [&](const fs::path& file) {
        written.push_back(file.filename());
        if (step == 2 && c.rank() == 1 && file.filename() == "optimizer-00001-of-00002.bin")
          throw Error(ErrorKind::invalid_input, "disk full");
      };
      try {
        save_checkpoint(run.path, *m, trainer, TrainingProgress{}, options);
      } catch (const Error& e) {
        failures[static_cast<size_t>(c.rank())] = e.what();
      }
    }
    if (c.rank() >= 2) {
      EXPECT_TRUE(written.empty()) << "rank " << c.rank() << " of the second group wrote " << written.front();
    } else {
      EXPECT_FALSE(written.empty()) << "rank " << c.rank();
    }
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(failures[static_cast<size_t>(r)].find("rank 1 of 4: disk full"), std::string::npos)
        << "rank " << r << ": " << failures[static_cast<size_t>(r)];
  }
  ASSERT_EQ(list_checkpoints(run.path), std::vector<fs::path>{checkpoint_directory(run.path, 1)});
  const ShardManifest manifest = read_shard_manifest(checkpoint_directory(run.path, 1));
  EXPECT_EQ(manifest.ranks, 2);
  EXPECT_EQ(load_refusal(checkpoint_directory(run.path, 1)), "loaded");
}

}  // namespace
}  // namespace octet
