// Checkpoints that must not load, and saves that do not finish: refused loads name the file and the
// mismatch and leave the model untouched; a save killed halfway leaves the previous checkpoint as the latest.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint_fixture.h"
#include "octet/io/safetensors.h"

namespace octet {
namespace {

using testing::ScratchDir;
using testing::tiny_config;
using testing::TrainingProcess;
namespace fs = std::filesystem;

// Loads `checkpoint` into `run`, expecting a refusal (exit code 2) whose message holds every part of
// `expected`; the model's weights and the trainer's step must not change.
void expect_refused(const fs::path& checkpoint, TrainingProcess& run,
                    const std::vector<std::string>& expected) {
  const std::vector<float> before = run.params();
  const int64_t steps = run.trainer->steps_done();
  try {
    load_checkpoint(checkpoint, *run.model, *run.trainer);
    ADD_FAILURE() << "the load of " << checkpoint << " should have been refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    for (const std::string& part : expected)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  const std::vector<float> after = run.params();
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0) << "weights changed";
  EXPECT_EQ(run.trainer->steps_done(), steps);
}

fs::path saved_checkpoint(const fs::path& run_dir, const ModelConfig& config, const fs::path& shard) {
  TrainingProcess run(config, MixedPrecision::fp32, shard);
  run.train(2);
  return save_checkpoint(run_dir, *run.model, *run.trainer, run.progress());
}

TEST(CheckpointRefused, TruncatedModelFile) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  const fs::path checkpoint = saved_checkpoint(dir.path() / "run", tiny_config(), shard);
  const fs::path file = checkpoint / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  TrainingProcess target(tiny_config(), MixedPrecision::fp32, shard);
  expect_refused(checkpoint, target, {file.string(), "truncated"});
}

TEST(CheckpointRefused, TruncatedOptimizerFileAndMissingOrBrokenState) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  const fs::path checkpoint = saved_checkpoint(dir.path() / "run", tiny_config(), shard);
  TrainingProcess target(tiny_config(), MixedPrecision::fp32, shard);
  const fs::path optimizer = checkpoint / "optimizer.safetensors";
  const fs::path copy = dir.path() / "optimizer.copy";
  fs::copy_file(optimizer, copy);
  fs::resize_file(optimizer, 4000);
  expect_refused(checkpoint, target, {optimizer.string()});
  fs::copy_file(copy, optimizer, fs::copy_options::overwrite_existing);

  const fs::path state = checkpoint / "state.json";
  std::ifstream in(state);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(state, std::ios::trunc) << text.substr(0, text.size() / 2);
  expect_refused(checkpoint, target, {state.string(), "malformed"});
  EXPECT_FALSE(latest_checkpoint(dir.path() / "run").has_value()) << "a malformed checkpoint is not complete";
  fs::remove(state);
  expect_refused(checkpoint, target, {checkpoint.string(), "state.json is missing"});
}

TEST(CheckpointRefused, ModelOfOtherDimensions) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  ModelConfig narrow = tiny_config();
  narrow.channels = 32;
  const fs::path checkpoint = saved_checkpoint(dir.path() / "run", narrow, shard);
  TrainingProcess target(tiny_config(), MixedPrecision::fp32, shard);
  expect_refused(checkpoint, target, {(checkpoint / "state.json").string(), "n_embd 32, this model has 64"});

  // A tensor of the wrong shape is caught even when state.json agrees.
  ModelConfig deeper = tiny_config();
  deeper.layers = 3;
  const fs::path other = saved_checkpoint(dir.path() / "deeper", deeper, shard);
  fs::copy_file(checkpoint / "state.json", other / "state.json", fs::copy_options::overwrite_existing);
  TrainingProcess narrow_target(narrow, MixedPrecision::fp32, shard);
  expect_refused(
      other, narrow_target,
      {(other / "optimizer.safetensors").string(), "has shape [64, 64], this model needs [64, 32]"});
}

std::string text_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A checkpoint whose state.json is edited by `edit`, refused with a message holding `expected`.
void expect_state_refused(const fs::path& checkpoint, TrainingProcess& target,
                          const std::function<void(nlohmann::json&)>& edit,
                          const std::vector<std::string>& expected) {
  const fs::path state = checkpoint / "state.json";
  const std::string original = text_of(state);
  nlohmann::json j = nlohmann::json::parse(original);
  edit(j);
  std::ofstream(state, std::ios::trunc) << j.dump(2);
  std::vector<std::string> parts = expected;
  parts.push_back(state.string());
  expect_refused(checkpoint, target, parts);
  std::ofstream(state, std::ios::trunc) << original;
}

TEST(CheckpointRefused, DeeplyNestedStateOrHeader) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  const fs::path checkpoint = saved_checkpoint(dir.path() / "run", tiny_config(), shard);
  TrainingProcess target(tiny_config(), MixedPrecision::fp32, shard);
  const fs::path state = checkpoint / "state.json";
  const std::string original = text_of(state);
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  std::ofstream(state, std::ios::trunc) << "{\"format\": \"octet-checkpoint\", \"model\": " << deep << "}";
  expect_refused(checkpoint, target, {state.string(), "nested more than 64 deep"});
  EXPECT_THROW(checkpoint_config(checkpoint), Error);
  std::ofstream(state, std::ios::trunc) << original;

  // The same in the JSON header of a safetensors file.
  const fs::path optimizer = checkpoint / "optimizer.safetensors";
  const std::string header = "{\"__metadata__\": {\"a\": " + deep + "}}";
  const uint64_t length = header.size();
  std::string bytes(reinterpret_cast<const char*>(&length), 8);
  std::ofstream(optimizer, std::ios::trunc | std::ios::binary) << bytes << header;
  expect_refused(checkpoint, target, {optimizer.string(), "nested more than 64 deep"});
}

TEST(CheckpointRefused, ImpossibleValuesInState) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  fs::path checkpoint;
  {
    TrainingProcess run(tiny_config(), MixedPrecision::fp8, shard);
    run.train(2);
    checkpoint = save_checkpoint(dir.path() / "run", *run.model, *run.trainer, run.progress());
  }
  TrainingProcess target(tiny_config(), MixedPrecision::fp8, shard);
  using nlohmann::json;
  expect_state_refused(checkpoint, target, [](json& j) { j["step"] = -5; },
                       {"step must be at least 0, got -5"});
  expect_state_refused(checkpoint, target, [](json& j) { j["optimizer_steps"] = -1; }, {"optimizer_steps"});
  expect_state_refused(checkpoint, target, [](json& j) { j["loss_scale"]["scale"] = 0; },
                       {"loss_scale.scale must be positive and finite, got 0"});
  expect_state_refused(checkpoint, target, [](json& j) { j["loss_scale"]["scale"] = "inf"; },
                       {"loss_scale.scale must be positive and finite, got inf"});
  expect_state_refused(checkpoint, target, [](json& j) { j["loss_scale"]["scale"] = 1e300; },
                       {"loss_scale.scale must be positive and finite, got inf"});
  expect_state_refused(checkpoint, target, [](json& j) { j["loss_scale"]["clean_steps"] = -3; },
                       {"loss_scale.clean_steps"});
  expect_state_refused(checkpoint, target,
                       [](json& j) { j["fp8"]["layers"]["h.0.mlp.c_fc"]["activation"]["scale"] = -2; },
                       {"fp8.layers.h.0.mlp.c_fc.activation.scale must be positive and finite, got -2"});
  expect_state_refused(checkpoint, target,
                       [](json& j) { j["fp8"]["layers"]["h.1.attn.c_proj"]["weight"]["scale_inv"] = "nan"; },
                       {"fp8.layers.h.1.attn.c_proj.weight.scale_inv must be positive and finite, got nan"});
  expect_state_refused(checkpoint, target,
                       [](json& j) { j["fp8"]["layers"]["h.0.mlp.c_fc"]["weight_copy_scale"] = "-inf"; },
                       {"fp8.layers.h.0.mlp.c_fc.weight_copy_scale"});
  expect_state_refused(
      checkpoint, target,
      [](json& j) { j["fp8"]["layers"]["h.0.mlp.c_fc"]["gradient"]["amax_history"][2] = "nan"; },
      {"fp8.layers.h.0.mlp.c_fc.gradient.amax_history[2] must be at least 0 and not NaN, got nan"});
  expect_state_refused(checkpoint, target,
                       [](json& j) { j["fp8"]["layers"]["h.0.mlp.c_fc"]["gradient"]["last_amax"] = -1; },
                       {"fp8.layers.h.0.mlp.c_fc.gradient.last_amax must not be negative, got -1"});
  expect_state_refused(checkpoint, target,
                       [](json& j) { j["fp8"]["layers"]["h.0.mlp.c_fc"]["weight"]["updates"] = -1; },
                       {"fp8.layers.h.0.mlp.c_fc.weight.updates"});
  expect_state_refused(checkpoint, target, [](json& j) { j["data"]["train"]["epoch"] = -1; },
                       {"data.train.epoch must be at least 0, got -1"});
  // The same edits a checkpoint legitimately holds still load.
  load_checkpoint(checkpoint, *target.model, *target.trainer);
}

TEST(CheckpointRefused, NonFiniteMomentsOrMasterWeights) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  const fs::path checkpoint = saved_checkpoint(dir.path() / "run", tiny_config(), shard);
  TrainingProcess target(tiny_config(), MixedPrecision::fp32, shard);
  const fs::path optimizer = checkpoint / "optimizer.safetensors";
  const std::string original = text_of(optimizer);
  auto poison = [&](const std::string& tensor, size_t index, float value) {
    io::SafetensorsFile file = io::read_safetensors(optimizer);
    std::vector<io::SafetensorsEntry> entries;
    for (io::SafetensorsTensor& t : file.tensors) {
      if (t.name == tensor) t.data[index] = value;
      entries.push_back({t.name, t.shape, t.data});
    }
    io::write_safetensors(optimizer, entries, file.metadata);
  };
  poison("m.wte", 7, std::numeric_limits<float>::quiet_NaN());
  expect_refused(checkpoint, target, {optimizer.string(), "tensor 'm.wte' holds nan at index 7"});
  std::ofstream(optimizer, std::ios::trunc | std::ios::binary) << original;
  poison("v.h.0.mlp.c_fc.weight", 3, -1.0f);
  expect_refused(checkpoint, target,
                 {optimizer.string(), "tensor 'v.h.0.mlp.c_fc.weight' holds -1 at index 3", "at least 0"});
  std::ofstream(optimizer, std::ios::trunc | std::ios::binary) << original;
  poison("ln_f.bias", 0, -std::numeric_limits<float>::infinity());
  expect_refused(checkpoint, target, {optimizer.string(), "tensor 'ln_f.bias' holds -inf at index 0"});
  std::ofstream(optimizer, std::ios::trunc | std::ios::binary) << original;
  load_checkpoint(checkpoint, *target.model, *target.trainer);
}

// The child process starts a save and stops after its first file; the parent kills it with SIGKILL.
TEST(CheckpointInterrupted, KilledSaveLeavesThePreviousCheckpointUsable) {
  ScratchDir dir;
  const fs::path shard = testing::write_pattern_shard(dir.path(), tiny_config().vocab_size);
  const fs::path run_dir = dir.path() / "run";
  TrainingProcess run(tiny_config(), MixedPrecision::fp32, shard);
  run.train(2);
  const fs::path previous = save_checkpoint(run_dir, *run.model, *run.trainer, run.progress());
  run.train(1);

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    CheckpointOptions options;
    options.after_file_written = [&](const fs::path&) {
      const char byte = 1;
      if (::write(pipe_fds[1], &byte, 1) != 1) ::_exit(3);
      for (;;) ::pause();  // killed here, halfway through the save
    };
    try {
      save_checkpoint(run_dir, *run.model, *run.trainer, run.progress(), options);
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(5);
  }
  ::close(pipe_fds[1]);
  char byte = 0;
  ASSERT_EQ(::read(pipe_fds[0], &byte, 1), 1) << "the child should report its first file";
  ::close(pipe_fds[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  const fs::path leftover = run_dir / "checkpoints" / ".tmp_step_000003";
  EXPECT_TRUE(fs::exists(leftover / "model.safetensors"));
  EXPECT_FALSE(fs::exists(run_dir / "checkpoints" / "step_000003"));
  ASSERT_EQ(latest_checkpoint(run_dir), previous);
  TrainingProcess relaunch(tiny_config(), MixedPrecision::fp32, shard);
  EXPECT_EQ(load_checkpoint(previous, *relaunch.model, *relaunch.trainer).step, 2);

  // Stray directories that are not checkpoints are ignored too; the next save removes the leftover.
  fs::create_directories(run_dir / "checkpoints" / "step_000009");
  fs::create_directories(run_dir / "checkpoints" / "notes");
  EXPECT_EQ(latest_checkpoint(run_dir), previous);
  const fs::path next = save_checkpoint(run_dir, *run.model, *run.trainer, run.progress());
  EXPECT_EQ(next.filename(), "step_000003");
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_EQ(latest_checkpoint(run_dir), next);
}

}  // namespace
}  // namespace octet
