// Checkpoints: an interrupted and resumed run is bit-identical to an uninterrupted one (float32 and FP8),
// the precision mode may change on resume, FP8 scaling state survives bit for bit, and only the last K
// checkpoints are kept.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "checkpoint_fixture.h"

namespace octet {
namespace {

using testing::ScratchDir;
using testing::tiny_config;
using testing::TrainingProcess;
namespace fs = std::filesystem;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_bits(const ScalingState& a, const ScalingState& b) {
  auto bits = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  if (a.amax_history.size() != b.amax_history.size()) return false;
  for (size_t i = 0; i < a.amax_history.size(); ++i) {
    if (bits(a.amax_history[i]) != bits(b.amax_history[i]) &&
        !(std::isnan(a.amax_history[i]) && std::isnan(b.amax_history[i])))
      return false;
  }
  return bits(a.scale) == bits(b.scale) && bits(a.scale_inv) == bits(b.scale_inv) &&
         (bits(a.last_amax) == bits(b.last_amax) || (std::isnan(a.last_amax) && std::isnan(b.last_amax))) &&
         a.updates == b.updates && a.degenerate_amax == b.degenerate_amax;
}

class Resume : public ::testing::TestWithParam<MixedPrecision> {};

// TrainingProcess A trains 20 steps without ever saving (a save must not change a run).
// TrainingProcess B trains 10, saves, and is thrown away; a new process (fresh backend, model, trainer and
// loader) loads the checkpoint, seeks its loader and trains 10 more. The 20 losses and the final weights,
// moments and FP8 state agree bit for bit.
TEST_P(Resume, IsBitExact) {
  const MixedPrecision mp = GetParam();
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);

  TrainingProcess a(tiny_config(), mp, shard);
  std::vector<float> losses_a = a.train(10);
  const std::vector<float> rest_a = a.train(10);
  losses_a.insert(losses_a.end(), rest_a.begin(), rest_a.end());

  std::vector<float> losses_b;
  {
    TrainingProcess b(tiny_config(), mp, shard);
    losses_b = b.train(10);
    const fs::path saved = save_checkpoint(dir.path() / "run_b", *b.model, *b.trainer, b.progress());
    EXPECT_EQ(saved, dir.path() / "run_b" / "checkpoints" / "step_000010");
  }
  TrainingProcess resumed(tiny_config(), mp, shard);
  resumed.model->init_weights(99);  // whatever the relaunch starts from is replaced
  const std::optional<fs::path> latest = latest_checkpoint(dir.path() / "run_b");
  ASSERT_TRUE(latest.has_value());
  const CheckpointLoad load = load_checkpoint(*latest, *resumed.model, *resumed.trainer);
  EXPECT_EQ(load.step, 10);
  EXPECT_TRUE(load.fresh_fp8_layers.empty());
  EXPECT_TRUE(load.notes.empty());
  EXPECT_EQ(load.progress.seed, 11u);
  EXPECT_EQ(load.progress.config, resumed.progress().config);
  EXPECT_EQ(load.saved_mode, mp);
  ASSERT_TRUE(load.progress.train_position.has_value());
  EXPECT_FALSE(load.progress.validation_position.has_value());
  resumed.loader.seek(*load.progress.train_position);
  EXPECT_EQ(resumed.trainer->steps_done(), 10);
  const std::vector<float> rest_b = resumed.train(10);
  losses_b.insert(losses_b.end(), rest_b.begin(), rest_b.end());

  ASSERT_EQ(losses_a.size(), 20u);
  EXPECT_TRUE(same_bits(losses_a, losses_b)) << ::testing::PrintToString(losses_a) << "\n"
                                             << ::testing::PrintToString(losses_b);
  EXPECT_LT(losses_a.back(), losses_a.front()) << "the run should learn";
  EXPECT_TRUE(same_bits(a.params(), resumed.params()));
  const int64_t n = a.model->parameter_count();
  const auto moments = [n](Trainer& t) {
    std::vector<float> m(t.optimizer().first_moment(), t.optimizer().first_moment() + n);
    m.insert(m.end(), t.optimizer().second_moment(), t.optimizer().second_moment() + n);
    return m;
  };
  EXPECT_TRUE(same_bits(moments(*a.trainer), moments(*resumed.trainer)));
  EXPECT_EQ(a.trainer->optimizer().steps(), resumed.trainer->optimizer().steps());
  EXPECT_EQ(a.loader.position(), resumed.loader.position());
  int fp8_layers = 0;
  for (const LinearPlan& plan : a.model->policy().layers()) {
    const Fp8LinearState* sa = a.model->fp8_state(plan.name);
    const Fp8LinearState* sb = resumed.model->fp8_state(plan.name);
    ASSERT_EQ(sa == nullptr, sb == nullptr);
    if (sa == nullptr) continue;
    ++fp8_layers;
    EXPECT_TRUE(same_bits(sa->activation, sb->activation)) << plan.name;
    EXPECT_TRUE(same_bits(sa->weight, sb->weight)) << plan.name;
    EXPECT_TRUE(same_bits(sa->gradient, sb->gradient)) << plan.name;
  }
  EXPECT_EQ(fp8_layers, mp == MixedPrecision::fp8 ? 8 : 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, Resume, ::testing::Values(MixedPrecision::fp32, MixedPrecision::fp8),
                         [](const auto& p) { return std::string(mixed_precision_name(p.param)); });

// In float32 a save changes nothing in the saving run: a run that never saves takes the same steps.
// With parameter groups (optimizer.groups) a resumed run continues exactly too: the groups are the
// configuration's, applied to the loaded state as to the running one.
TEST(Checkpoint, ResumeWithParameterGroupsIsBitExact) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  TrainSettings settings = testing::checkpoint_settings();
  settings.adamw.groups = {{"h.*.attn.*", 0.5f, std::nullopt}, {"wte", 0.25f, 0.0f}, {"h.1.*", 2.0f, 0.3f}};
  TrainingProcess a(tiny_config(), MixedPrecision::fp8, shard, settings);
  const std::vector<float> losses_a = a.train(8);
  {
    TrainingProcess b(tiny_config(), MixedPrecision::fp8, shard, settings);
    b.train(4);
    save_checkpoint(dir.path() / "run", *b.model, *b.trainer, b.progress());
  }
  TrainingProcess resumed(tiny_config(), MixedPrecision::fp8, shard, settings);
  const CheckpointLoad load =
      load_checkpoint(dir.path() / "run" / "checkpoints" / "step_000004", *resumed.model, *resumed.trainer);
  resumed.loader.seek(*load.progress.train_position);
  const std::vector<float> rest = resumed.train(4);
  EXPECT_TRUE(same_bits(std::vector<float>(losses_a.begin() + 4, losses_a.end()), rest))
      << ::testing::PrintToString(losses_a) << "\n"
      << ::testing::PrintToString(rest);
  EXPECT_TRUE(same_bits(a.params(), resumed.params()));
}

TEST(Checkpoint, SavingLeavesAFloat32RunUnchanged) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  TrainingProcess a(tiny_config(), MixedPrecision::fp32, shard);
  TrainingProcess b(tiny_config(), MixedPrecision::fp32, shard);
  a.train(3);
  b.train(3);
  save_checkpoint(dir.path() / "run", *a.model, *a.trainer, a.progress());
  EXPECT_TRUE(same_bits(a.train(3), b.train(3)));
}

TEST(Checkpoint, Fp8ScalingStateRoundTripsBitForBitIncludingOddValues) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  TrainingProcess a(tiny_config(), MixedPrecision::fp8, shard);
  a.train(2);
  Fp8LinearState& s = *a.model->fp8_state("h.1.mlp.c_fc");
  // Floats a decimal writer with too few digits would change, and values JSON cannot hold as numbers.
  s.activation.scale = std::nextafter(1.0f / 3.0f, 1.0f);
  s.activation.scale_inv = 1.0f / s.activation.scale;
  s.activation.last_amax = std::numeric_limits<float>::quiet_NaN();
  s.activation.amax_history[1] = std::numeric_limits<float>::infinity();
  s.activation.amax_history[2] = std::numeric_limits<float>::denorm_min();
  s.activation.amax_history[3] = -0.0f;
  s.gradient.amax_history[4] = 0.1f;
  s.gradient.amax_history[5] = std::numeric_limits<float>::max();
  s.gradient.degenerate_amax = 3;
  const Fp8LinearState expected = s;
  save_checkpoint(dir.path() / "run", *a.model, *a.trainer, a.progress());
  TrainingProcess b(tiny_config(), MixedPrecision::fp8, shard);
  load_checkpoint(*latest_checkpoint(dir.path() / "run"), *b.model, *b.trainer);
  const Fp8LinearState& loaded = *b.model->fp8_state("h.1.mlp.c_fc");
  EXPECT_TRUE(same_bits(loaded.activation, expected.activation));
  EXPECT_TRUE(same_bits(loaded.weight, expected.weight));
  EXPECT_TRUE(same_bits(loaded.gradient, expected.gradient));
  EXPECT_TRUE(std::signbit(loaded.activation.amax_history[3]));
}

// A bf16 warm-up continued in fp8: every FP8 layer starts with fresh scaling state, the load says so, and
// training goes on.
TEST(Checkpoint, Bf16CheckpointResumesInFp8WithFreshScalingState) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  std::vector<float> weights;
  {
    TrainingProcess warm(tiny_config(), MixedPrecision::bf16, shard);
    warm.train(5);
    weights = warm.params();
    save_checkpoint(dir.path() / "run", *warm.model, *warm.trainer, warm.progress());
  }
  TrainingProcess fp8(tiny_config(), MixedPrecision::fp8, shard);
  const CheckpointLoad load =
      load_checkpoint(*latest_checkpoint(dir.path() / "run"), *fp8.model, *fp8.trainer);
  EXPECT_EQ(load.saved_mode, MixedPrecision::bf16);
  EXPECT_EQ(load.fresh_fp8_layers.size(), 8u);
  ASSERT_EQ(load.notes.size(), 1u);
  EXPECT_EQ(load.notes[0],
            "FP8 scaling state starts fresh for 8 of 8 FP8 layers: checkpoint was trained in bf16");
  EXPECT_TRUE(same_bits(fp8.params(), weights));
  // Fresh as after init_weights: one weight cast recorded (of the loaded weights), nothing else.
  const Fp8LinearState& s = *fp8.model->fp8_state("h.0.attn.c_attn");
  EXPECT_EQ(s.weight.updates, 1);
  EXPECT_EQ(s.activation.updates, 0);
  fp8.loader.seek(*load.progress.train_position);
  const std::vector<float> losses = fp8.train(3);
  for (const float l : losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_EQ(fp8.trainer->steps_done(), 8);

  // And back: an fp8 checkpoint resumes in bf16, its FP8 state unused.
  save_checkpoint(dir.path() / "run", *fp8.model, *fp8.trainer, fp8.progress());
  TrainingProcess cool(tiny_config(), MixedPrecision::bf16, shard);
  const CheckpointLoad back =
      load_checkpoint(*latest_checkpoint(dir.path() / "run"), *cool.model, *cool.trainer);
  EXPECT_EQ(back.step, 8);
  EXPECT_TRUE(back.fresh_fp8_layers.empty());
  EXPECT_FALSE(cool.train(2).empty());
}

TEST(Checkpoint, KeepsTheLastKAndListsThemOldestFirst) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  TrainingProcess run(tiny_config(), MixedPrecision::fp32, shard);
  CheckpointOptions options;
  options.keep_last = 2;
  EXPECT_FALSE(latest_checkpoint(dir.path() / "run").has_value());
  for (int i = 0; i < 4; ++i) {
    run.train(1);
    save_checkpoint(dir.path() / "run", *run.model, *run.trainer, run.progress(), options);
  }
  const std::vector<fs::path> kept = list_checkpoints(dir.path() / "run");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].filename(), "step_000003");
  EXPECT_EQ(kept[1].filename(), "step_000004");
  EXPECT_EQ(*latest_checkpoint(dir.path() / "run"), kept[1]);
  // Saving the same step again replaces it.
  save_checkpoint(dir.path() / "run", *run.model, *run.trainer, run.progress(), options);
  EXPECT_EQ(list_checkpoints(dir.path() / "run"), kept);
  options.keep_last = 0;
  EXPECT_THROW(save_checkpoint(dir.path() / "run", *run.model, *run.trainer, run.progress(), options), Error);
}

// A gpt2 run's tokenizer files travel with each checkpoint; generation looks in the checkpoint, then the data
// directory, then the default place, and names all three when none holds them.
TEST(Checkpoint, KeepsTheTokenizerFilesAndFindsThemAgain) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  const fs::path vocabulary = dir.path() / "vocabulary";
  fs::create_directories(vocabulary);
  std::ofstream(vocabulary / "encoder.json") << "{\"!\": 0}";
  std::ofstream(vocabulary / "vocab.bpe") << "#version: 0.2\n";
  ::setenv("OCTET_DATA_DIR", (dir.path() / "no-default").c_str(), 1);
  EXPECT_EQ(training_tokenizer_files("gpt2", vocabulary), vocabulary);
  EXPECT_EQ(training_tokenizer_files("gpt2", dir.path()), fs::path()) << "neither the data nor the default";
  EXPECT_EQ(training_tokenizer_files("bytes", vocabulary), fs::path());

  TrainingProcess run(tiny_config(), MixedPrecision::fp32, shard);
  run.train(1);
  TrainingProgress progress = run.progress();
  progress.tokenizer_dir = vocabulary;
  const fs::path checkpoint = save_checkpoint(dir.path() / "run", *run.model, *run.trainer, progress);
  for (const char* name : {"encoder.json", "vocab.bpe"}) {
    std::ifstream a(vocabulary / name), b(checkpoint / name);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}))
        << name;
  }
  EXPECT_EQ(checkpoint_tokenizer_files(io::TokenizerKind::gpt2, checkpoint, dir.path() / "data"), checkpoint);
  fs::remove(checkpoint / "vocab.bpe");
  EXPECT_EQ(checkpoint_tokenizer_files(io::TokenizerKind::gpt2, checkpoint, vocabulary), vocabulary);
  try {
    checkpoint_tokenizer_files(io::TokenizerKind::gpt2, checkpoint, dir.path() / "data");
    ADD_FAILURE() << "no place holds the files";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(checkpoint.string() + ", " + (dir.path() / "data").string() + ", " +
                           (dir.path() / "no-default").string()),
              std::string::npos)
        << message;
  }
  ::unsetenv("OCTET_DATA_DIR");
}

}  // namespace
}  // namespace octet
