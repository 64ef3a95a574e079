// Convergence on real English text: a small GPT trained on the Brown corpus (byte-level tokens) in each of
// the four precision modes, from the same weights and batches. fp8's final validation loss must land within
// 2% of bf16's. With OCTET_RESULTS_DIR set, the table of results is written there (convergence.md).
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "octet/backend/cpu_backend.h"
#include "octet/io/corpus.h"
#include "octet/io/data_loader.h"
#include "octet/io/tokenizer.h"
#include "octet/model/model.h"
#include "octet/train/trainer.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

fs::path corpus_text_dir() {
  const char* data = std::getenv("OCTET_DATA_DIR");
  return (data ? fs::path(data) : fs::path(OCTET_SOURCE_DIR) / ".cache" / "data") / "brown" / "text";
}

struct Outcome {
  MixedPrecision mode;
  float initial_validation;
  float final_validation;
  float final_train;
  int64_t skipped;
  double seconds;
};

constexpr int64_t kSteps = 300, kBatch = 8, kSeq = 64, kValidationBatches = 16;

ModelConfig model_config() {
  ModelConfig c;
  c.vocab_size = io::ByteTokenizer::kVocabSize;
  c.max_seq_len = kSeq;
  c.layers = 2;
  c.heads = 4;
  c.channels = 64;
  return c;
}

Outcome train(MixedPrecision mode, const fs::path& shards) {
  const ModelConfig config = model_config();
  auto backend = make_cpu_backend();
  PrecisionSettings precision;
  precision.mode = mode;
  const std::unique_ptr<Model> built =
      make_model(config, *backend, PrecisionPolicy(precision, config, kBatch * kSeq), kBatch, kSeq);
  Model& model = *built;
  model.init_weights(1337);
  TrainSettings settings;
  settings.batch_size = kBatch;
  settings.seq_len = kSeq;
  // A peak learning rate of 1e-3. At 3e-3 the loss spiked at the end of warm-up in every mode, and how soon
  // each mode recovered depended on the last bits of the BLAS kernels' products: fp8 landed 0.08% to 4.2%
  // from bf16 across OpenBLAS's Haswell, Zen, Sandybridge and SkylakeX kernels, which compared the spikes
  // rather than the modes. At 1e-3 every mode lands within 0.1% of the others on each of those kernels.
  settings.schedule = {1e-3f, 20, kSteps, 0.1f};
  settings.loss_scale.dynamic = mode == MixedPrecision::fp16;
  Trainer trainer(model, settings);

  io::DataLoaderOptions train_options{kBatch, kSeq, true, 42, config.vocab_size};
  io::DataLoader train_loader(shards, io::DataSplit::train, train_options);
  const BatchSource train_data = [&](int32_t* tokens, int32_t* targets) {
    train_loader.next_batch({tokens, static_cast<size_t>(kBatch * kSeq)},
                            {targets, static_cast<size_t>(kBatch * kSeq)});
  };
  io::DataLoaderOptions validation_options{kBatch, kSeq, false, 0, config.vocab_size};
  io::DataLoader validation_loader(shards, io::DataSplit::validation, validation_options);
  const BatchSource validation_data = [&](int32_t* tokens, int32_t* targets) {
    validation_loader.next_batch({tokens, static_cast<size_t>(kBatch * kSeq)},
                                 {targets, static_cast<size_t>(kBatch * kSeq)});
  };

  Outcome o{mode, 0, 0, 0, 0, 0};
  const auto start = std::chrono::steady_clock::now();
  validation_loader.reset();
  o.initial_validation = trainer.evaluate(validation_data, kValidationBatches);
  for (int64_t step = 0; step < kSteps; ++step) {
    const StepResult r = trainer.step(train_data);
    o.skipped += r.skipped ? 1 : 0;
    o.final_train = r.loss;
  }
  validation_loader.reset();
  o.final_validation = trainer.evaluate(validation_data, kValidationBatches);
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

TEST(Convergence, FourModesOnTheBrownCorpus) {
  const fs::path text = corpus_text_dir();
  ASSERT_TRUE(fs::is_directory(text))
      << "the Brown corpus is missing at " << text << ": run scripts/fetch_corpus.sh (scripts/test.sh does)";
  const std::vector<fs::path> files = io::list_files(text, ".txt");
  ASSERT_GT(files.size(), 100u);
  const fs::path shards = fs::temp_directory_path() / fmt::format("octet-convergence-{}", ::getpid());
  fs::create_directories(shards);
  const auto tokenizer = io::make_tokenizer(io::TokenizerKind::bytes);
  const io::PrepareSummary summary = io::prepare_text_shards(files, *tokenizer, shards, io::PrepareOptions{});

  std::vector<Outcome> outcomes;
  for (const MixedPrecision m :
       {MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp16, MixedPrecision::fp8}) {
    outcomes.push_back(train(m, shards));
  }
  fs::remove_all(shards);

  const Outcome& bf16 = outcomes[1];
  std::string table = fmt::format(
      "Brown corpus, byte-level tokens: {} training and {} validation tokens. Model: {} layers, {} channels, "
      "{} "
      "heads, context {}; {} steps of {} sequences, AdamW, learning rate 1e-3 with 20 warm-up steps and "
      "cosine "
      "decay to 1e-4. Validation loss over {} fixed batches ({} tokens).\n\n"
      "| mode | validation loss at start | final validation loss | vs bf16 | final training loss | skipped "
      "steps "
      "| seconds (2 CPU cores) |\n|---|---|---|---|---|---|---|\n",
      summary.train_tokens, summary.validation_tokens, 2, 64, 4, kSeq, kSteps, kBatch, kValidationBatches,
      kValidationBatches * kBatch * kSeq);
  for (const Outcome& o : outcomes) {
    table += fmt::format("| {} | {:.4f} | {:.4f} | {:+.2f}% | {:.4f} | {} | {:.0f} |\n",
                         mixed_precision_name(o.mode), o.initial_validation, o.final_validation,
                         100.0 * (o.final_validation - bf16.final_validation) / bf16.final_validation,
                         o.final_train, o.skipped, o.seconds);
  }
  std::printf("%s", table.c_str());
  if (const char* dir = std::getenv("OCTET_RESULTS_DIR")) {
    std::ofstream(fs::path(dir) / "convergence.md") << table;
  }

  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(std::isfinite(o.final_validation)) << mixed_precision_name(o.mode);
    // Byte-level text starts near ln 256 = 5.55; a model that learned the language's bytes is far below.
    EXPECT_LT(o.final_validation, o.initial_validation - 2.0f) << mixed_precision_name(o.mode);
  }
  const Outcome& fp8 = outcomes[3];
  EXPECT_LT(std::fabs(fp8.final_validation - bf16.final_validation) / bf16.final_validation, 0.02)
      << "fp8 " << fp8.final_validation << " against bf16 " << bf16.final_validation;
}

}  // namespace
}  // namespace octet
