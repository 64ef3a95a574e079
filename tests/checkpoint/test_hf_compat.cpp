// model.safetensors is Hugging Face GPT-2: the names and shapes of a GPT2LMHeadModel state dict (Conv1D
// weights [in, out], wte of the real vocabulary only), and a forward written in PyTorch over the stored
// weights gives octet's logits. Needs /usr/bin/python3 with torch; skips cleanly without it.
#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "checkpoint_fixture.h"

namespace octet {
namespace {

using testing::ScratchDir;
using testing::tiny_config;
using testing::TrainingProcess;
namespace fs = std::filesystem;

TEST(HuggingFace, ModelFileLoadsAsGpt2AndReproducesOctetsLogits) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with torch is not available";
  }
  ScratchDir dir;
  const ModelConfig c = tiny_config();
  const fs::path shard = testing::write_pattern_shard(dir.path(), c.vocab_size);
  TrainingProcess run(c, MixedPrecision::fp32, shard);
  run.train(3);  // biases and LayerNorms away from their initial values
  const fs::path checkpoint = save_checkpoint(dir.path() / "run", *run.model, *run.trainer, run.progress());

  const std::vector<int32_t> tokens = {1, 5, 9, 60, 0, 33, 33, 7};
  const int64_t T = static_cast<int64_t>(tokens.size());
  run.model->forward_logits(tokens.data(), 1, T);
  const int64_t Vp = c.padded_vocab();
  std::vector<float> logits(static_cast<size_t>(T * Vp));
  run.backend->copy_to_host(logits.data(), run.model->logits(), logits.size() * sizeof(float));
  {
    std::ofstream out(dir.path() / "logits.f32", std::ios::binary);
    for (int64_t t = 0; t < T; ++t) {
      out.write(reinterpret_cast<const char*>(logits.data() + t * Vp),
                static_cast<std::streamsize>(c.vocab_size * sizeof(float)));
    }
  }
  std::string csv;
  for (const int32_t t : tokens) csv += (csv.empty() ? "" : ",") + std::to_string(t);
  const std::string command =
      fmt::format("/usr/bin/python3 {}/hf_gpt2_check.py {} {} {}", OCTET_CHECKPOINT_TEST_SOURCE_DIR,
                  (checkpoint / "model.safetensors").string(), csv, (dir.path() / "logits.f32").string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace octet
