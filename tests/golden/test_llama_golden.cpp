// Golden test of octet's Llama (CPU backend, fp32 mode) against PyTorch, an independent implementation:
// logits, loss and every parameter gradient before the first update, then the losses of ten AdamW steps, for
// grouped-query attention with an untied head, for one shared key and value head with a tied head, and for
// the mixture-of-experts block (4 experts, 2 per token, a shared expert, the balance loss in training). Also
// checks that octet's training is deterministic. The PyTorch side is llama_reference.py, run with
// OCTET_GOLDEN_PYTHON; the comparisons skip when that interpreter cannot import torch.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "golden_harness.h"

namespace octet {
namespace {

using testing::GoldenCase;

// Tolerances, derived as in test_gpt2_golden.cpp: the comparator's float32 bound K * 2^-24 * magnitude, with
// K the sum of the reduction lengths along the longest chain from the parameters to the output; RMSNorm
// brings the magnitude back to order one in every block.

// Parameters to logits: per block input_layernorm (C), qkv_proj (C), the rotation (two terms), q.k (head
// size), softmax (T), p.v (T), o_proj (C), post_attention_layernorm (C), gate_up_proj (C), silu(gate) * up
// (two factors), down_proj (F); then the final norm (C) and the head (C).
int64_t logits_chain(const GoldenCase& gc) {
  const ModelConfig& c = gc.config;
  const int64_t C = c.channels;
  const int64_t block = C + C + 2 + c.head_size() + gc.T + gc.T + C + C + C + 2 + c.hidden();
  return c.layers * block + C + C;
}
// The loss adds the log-sum-exp over the V real logits.
int64_t loss_chain(const GoldenCase& gc) {
  return logits_chain(gc) + gc.config.vocab_size;
}
// A gradient runs the forward chain, the same chain back again, and the weight gradient's sum over the B*T
// positions; a tied embedding adds its lookups' sum over the same positions to the head's.
int64_t gradient_chain(const GoldenCase& gc) {
  const int64_t positions = gc.B * gc.T;
  return 2 * loss_chain(gc) + (gc.config.tied_head() ? 2 * positions : positions);
}

// The parameter indexes llama_golden_cases(); golden_for computes each case once per test process.
class LlamaGolden : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    g_ = &testing::golden_for(testing::llama_golden_cases().at(GetParam()));
    if (g_->skip) GTEST_SKIP() << *g_->skip;
    if (g_->error) FAIL() << *g_->error;
  }
  const testing::Golden& g() const { return *g_; }

 private:
  const testing::Golden* g_ = nullptr;
};

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return testing::llama_golden_cases().at(info.param).name;
}
INSTANTIATE_TEST_SUITE_P(Cases, LlamaGolden,
                         ::testing::Range<size_t>(0, testing::llama_golden_cases().size()), case_name);

TEST_P(LlamaGolden, LogitsMatchPyTorchIncludingPaddedColumns) {
  testing::expect_logits_match(g(), logits_chain(g().golden_case));
}

TEST_P(LlamaGolden, LossMatchesPyTorch) {
  testing::expect_loss_matches(g(), loss_chain(g().golden_case));
}

TEST_P(LlamaGolden, EveryParameterGradientMatchesPyTorch) {
  testing::expect_gradients_match(g(), gradient_chain(g().golden_case));
}

// Ten AdamW steps on one batch, each step's loss held to the first loss's bound.
TEST_P(LlamaGolden, TenAdamWStepLossesMatchPyTorch) {
  testing::expect_step_losses_match(g(), loss_chain(g().golden_case));
}

// Two runs from the same seed give the same losses and the same final parameters, bit for bit. Needs no
// PyTorch.
TEST(LlamaDeterminism, SameSeedGivesBitIdenticalTraining) {
  testing::expect_bit_identical_training(testing::llama_golden_cases());
}

}  // namespace
}  // namespace octet
