// A planted sensitive layer: a small GPT-2 trained briefly in BF16 on the Brown corpus, then changed so that
// the input of h.1.mlp.c_fc has two outlier channels 2^20 times larger than the rest while the model
// computes the same in BF16: its LayerNorm (ln_2) gives those channels gain 0 and bias 1024 and the layer's
// weights on them are 0; the other channels' gains and biases are scaled by 2^-10 and the layer's weights on
// them by 2^10 (exact in binary). A per-tensor E4M3 cast of that input then crushes every ordinary channel
// to zero or a subnormal. `octet localize` must keep that layer in BF16 and convert the others; a short
// training with its map must stay within the budget of the BF16 run's loss while all-FP8 does not. (The
// outliers stay small and the learning rate low: Adam moves a weight on an outlier channel by about the
// learning rate per step whatever its gradient, which moves the layer's output by 1024 times as much.)
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "octet/backend/cpu_backend.h"
#include "octet/config/run_config.h"
#include "octet/model/model.h"
#include "octet/train/checkpoint.h"
#include "octet/train/trainer.h"
#include "process.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr float kOutlier = 1024.0f;
constexpr float kScale = 1024.0f;
constexpr double kBudgetPercent = 0.5;

fs::path brown_text() {
  const char* data = std::getenv("OCTET_DATA_DIR");
  return (data ? fs::path(data) : fs::path(OCTET_SOURCE_DIR) / ".cache" / "data") / "brown" / "text";
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The last "validation loss X" a training run printed.
double last_validation_loss(const std::string& out) {
  const std::regex pattern("validation loss ([0-9.]+)");
  double loss = std::nan("");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), pattern); it != std::sregex_iterator(); ++it) {
    loss = std::stod((*it)[1]);
  }
  return loss;
}

void plant(Model& model) {
  float* w = model.params();
  const ParameterInfo& gain = model.parameter("h.1.ln_2.weight");
  const ParameterInfo& bias = model.parameter("h.1.ln_2.bias");
  const ParameterInfo& fc = model.parameter("h.1.mlp.c_fc.weight");  // [4C, C]
  const int64_t C = gain.count;
  for (int64_t j = 0; j < C; ++j) {
    const bool outlier = j == 5 || j == 40;
    w[gain.offset + j] = outlier ? 0.0f : w[gain.offset + j] / kScale;
    w[bias.offset + j] = outlier ? kOutlier : w[bias.offset + j] / kScale;
    for (int64_t row = 0; row < fc.shape[0]; ++row) {
      float& x = w[fc.offset + row * C + j];
      x = outlier ? 0.0f : x * kScale;
    }
  }
}

class PlantedLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(brown_text() / "ca01.txt")) GTEST_SKIP() << "the Brown corpus is not at " << brown_text();
    root_ = fs::temp_directory_path() / ("octet-localize-planted-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    std::vector<std::string> args = {"data",  "prepare", "--tokenizer",
                                     "bytes", "--out",   (root_ / "shards").string()};
    for (const auto& entry : fs::directory_iterator(brown_text())) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with("ca") || name.starts_with("cb")) args.push_back(entry.path().string());
    }
    std::sort(args.begin() + 6, args.end());
    const testing::ProcessResult r = testing::run_octet(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    config_ = root_ / "small.toml";
    std::ofstream(config_)
        << "[model]\nvocab_size = 256\nmax_seq_len = 64\nlayers = 2\nheads = 4\nchannels = 64\n"
        << "[train]\nmixed_precision = \"bf16\"\nbatch_size = 8\nseq_len = 64\nsteps = 400\n"
        << "[scheduler]\nwarmup_steps = 10\n[data]\ndir = \"" << (root_ / "shards").string()
        << "\"\neval_every = 0\neval_batches = 8\n[logging]\nrun_dir = \"" << (root_ / "pretrain").string()
        << "\"\nlog_every = 50\n";
  }
  // OCTET_KEEP_TEST_FILES=1 keeps the shards, checkpoints, map and runs (the figures in
  // docs/localization.md).
  void TearDown() override {
    if (!root_.empty() && !::testing::Test::HasFailure() && !std::getenv("OCTET_KEEP_TEST_FILES"))
      fs::remove_all(root_);
  }

  // The pretrained checkpoint with the outliers planted, saved as a run of its own.
  fs::path planted_checkpoint() {
    const testing::ProcessResult r = testing::run_octet({"train", config_.string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const RunConfig config = load_run_config(config_);
    std::unique_ptr<Backend> backend = make_cpu_backend();
    std::unique_ptr<Model> model =
        make_model(config.model, *backend, PrecisionPolicy(PrecisionSettings{}, config.model, 1), 1, 1);
    load_checkpoint_weights(*latest_checkpoint(root_ / "pretrain"), *model);
    plant(*model);
    TrainSettings settings = config.train;
    Trainer trainer(*model, settings);
    TrainingProgress progress;
    progress.seed = config.seed;
    progress.config = to_toml(config);
    save_checkpoint(root_ / "planted", *model, trainer, progress);
    return root_ / "planted";
  }

  double train_from(const fs::path& checkpoint, const std::string& name, std::vector<std::string> more) {
    std::vector<std::string> args = {"train",       config_.string(),
                                     "--init-from", checkpoint.string(),
                                     "--set",       "train.steps=30",
                                     "--set",       "data.eval_every=30",
                                     "--set",       "logging.run_dir=" + (root_ / name).string(),
                                     "--set",       "optimizer.learning_rate=3e-6",
                                     "--set",       "scheduler.warmup_steps=0"};
    args.insert(args.end(), more.begin(), more.end());
    const testing::ProcessResult r = testing::run_octet(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return last_validation_loss(r.out);
  }

  fs::path root_;
  fs::path config_;
};

TEST_F(PlantedLayer, LocalizeKeepsItInBf16AndTrainingWithTheMapStaysWithinTheBudget) {
  const fs::path planted = planted_checkpoint();
  const fs::path map_file = root_ / "small.precision_map.json";
  const testing::ProcessResult r =
      testing::run_octet({"localize", config_.string(), "--init-from", planted.string(), "--batches", "2",
                          "--budget", fmt::format("{}", kBudgetPercent), "--free-casts"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::printf("%s", r.out.c_str());
  const Json map = Json::parse(read(map_file));
  for (const Json& l : map["layers"]) {
    if (l["choice"] == "excluded") continue;
    const bool planted_layer = l["name"] == "h.1.mlp.c_fc";
    EXPECT_EQ(l["choice"], planted_layer ? "bf16" : "fp8") << l.dump();
    if (planted_layer) {
      EXPECT_GT(l["alone_in_fp8"]["loss_change"].get<double>(), kBudgetPercent / 100.0) << l.dump();
      EXPECT_GT(l["numerics"]["activation"]["underflowed"].get<double>(), 0.1) << l.dump();
    }
  }

  const double bf16 = train_from(planted, "bf16", {"--set", "train.mixed_precision=bf16"});
  const double fp8 = train_from(planted, "fp8", {"--set", "train.mixed_precision=fp8"});
  const double mapped =
      train_from(planted, "mapped",
                 {"--set", "train.mixed_precision=fp8", "--set", "fp8.precision_map=" + map_file.string()});
  std::printf("validation loss after 30 steps: bf16 %.4f, fp8 %.4f, fp8 with the map %.4f\n", bf16, fp8,
              mapped);
  EXPECT_LE(std::abs(mapped - bf16) / bf16, kBudgetPercent / 100.0);
  EXPECT_GT((fp8 - bf16) / bf16, kBudgetPercent / 100.0);
}

}  // namespace
}  // namespace octet
