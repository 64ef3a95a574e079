// Golden test of octet's GPT-2 (CPU backend, fp32 mode) against PyTorch, an independent implementation:
// logits, loss and every parameter gradient before the first update, then the losses of ten AdamW steps.
// Also checks that octet's training is deterministic. The PyTorch side is gpt2_reference.py, run with
// OCTET_GOLDEN_PYTHON; the comparisons skip when that interpreter cannot import torch.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "golden_harness.h"

namespace octet {
namespace {

using testing::GoldenCase;

// Tolerances. The comparator bounds one float32 reduction of length K by K * 2^-24 * sum_i |a_i b_i| (every
// rounding error at its worst, all in one direction). A network output is the end of a chain of such
// reductions; to first order their relative errors add, each relative to the magnitude of what flows
// through it, and LayerNorm brings that magnitude back to order one in every block. The bound used for an
// output is therefore the comparator's bound with K the sum of the reduction lengths along the longest
// chain that leads to it. Typical errors grow like sqrt(K) rather than K, so a correct implementation lands
// far inside; a wrong index, a missing term or a wrong scale is off by orders of magnitude more.

// Parameters to logits: per block ln_1 (C), c_attn (C), q.k (head size), softmax (T), p.v (T), c_proj (C),
// ln_2 (C), c_fc (C), mlp.c_proj (4C); then ln_f (C) and the tied LM head (C).
int64_t logits_chain(const GoldenCase& gc) {
  const ModelConfig& c = gc.config;
  const int64_t C = c.channels;
  const int64_t block = C + C + c.head_size() + gc.T + gc.T + C + C + C + 4 * C;
  return c.layers * block + C + C;
}
// The loss adds the log-sum-exp over the V real logits.
int64_t loss_chain(const GoldenCase& gc) {
  return logits_chain(gc) + gc.config.vocab_size;
}
// A gradient runs the forward chain, the same chain back again, and the weight gradient's sum over the B*T
// positions.
int64_t gradient_chain(const GoldenCase& gc) {
  return 2 * loss_chain(gc) + gc.B * gc.T;
}

// The parameter indexes gpt2_golden_cases(); golden_for computes each case once per test process.
class Gpt2Golden : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    g_ = &testing::golden_for(testing::gpt2_golden_cases().at(GetParam()));
    if (g_->skip) GTEST_SKIP() << *g_->skip;
    if (g_->error) FAIL() << *g_->error;
  }
  const testing::Golden& g() const { return *g_; }

 private:
  const testing::Golden* g_ = nullptr;
};

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return testing::gpt2_golden_cases().at(info.param).name;
}
INSTANTIATE_TEST_SUITE_P(Cases, Gpt2Golden, ::testing::Range<size_t>(0, testing::gpt2_golden_cases().size()),
                         case_name);

TEST_P(Gpt2Golden, LogitsMatchPyTorchIncludingPaddedColumns) {
  testing::expect_logits_match(g(), logits_chain(g().golden_case));
}

TEST_P(Gpt2Golden, LossMatchesPyTorch) {
  testing::expect_loss_matches(g(), loss_chain(g().golden_case));
}

TEST_P(Gpt2Golden, EveryParameterGradientMatchesPyTorch) {
  testing::expect_gradients_match(g(), gradient_chain(g().golden_case));
}

// Ten AdamW steps on one batch, each step's loss held to the first loss's bound.
TEST_P(Gpt2Golden, TenAdamWStepLossesMatchPyTorch) {
  testing::expect_step_losses_match(g(), loss_chain(g().golden_case));
}

// Two runs from the same seed give the same losses and the same final parameters, bit for bit. Needs no
// PyTorch.
TEST(Gpt2Determinism, SameSeedGivesBitIdenticalTraining) {
  testing::expect_bit_identical_training(testing::gpt2_golden_cases());
}

}  // namespace
}  // namespace octet
