// Golden test of octet's GPT-2 (CPU backend, fp32 mode) against PyTorch, an independent implementation:
// logits, loss and every parameter gradient before the first update, then the losses of ten AdamW steps.
// Also checks that octet's training is deterministic. The PyTorch side is gpt2_reference.py, run with
// OCTET_GOLDEN_PYTHON; the comparisons skip when that interpreter cannot import torch.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "golden_io.h"
#include "gpt2_octet_run.h"

namespace octet {
namespace {

using testing::all_close;
using testing::CompareOptions;
using testing::GoldenCase;
using testing::GoldenOutput;
using testing::OctetRun;

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

// What the comparisons measured, for the log: the largest |a - e|, the L2 norm of (a - e) relative to that
// of e, and the largest error as a fraction of the comparator's bound (how much room is left).
struct Difference {
  double max_abs = 0.0;
  double relative_norm = 0.0;
  double of_bound = 0.0;
};
Difference difference(std::span<const float> a, std::span<const float> e, const CompareOptions& options) {
  const testing::Tolerance tol = testing::tolerance_for(options.dtype, options.reduction_length);
  Difference d;
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < std::min(a.size(), e.size()); ++i) {
    const double x = static_cast<double>(a[i]) - e[i];
    const double magnitude = options.magnitude.empty() ? std::fabs(e[i]) : options.magnitude[i];
    const double bound = tol.atol + tol.rtol * std::fabs(e[i]) + tol.accumulation * magnitude;
    d.max_abs = std::max(d.max_abs, std::fabs(x));
    if (bound > 0) d.of_bound = std::max(d.of_bound, std::fabs(x) / bound);
    diff2 += x * x;
    ref2 += static_cast<double>(e[i]) * e[i];
  }
  d.relative_norm = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return d;
}

std::ostream& operator<<(std::ostream& os, const Difference& d) {
  return os << "max |diff| " << d.max_abs << ", relative norm " << d.relative_norm << ", worst error/bound "
            << d.of_bound;
}

// Both sides, computed once per test process.
struct Golden {
  GoldenCase golden_case;
  OctetRun octet;
  GoldenOutput torch;
  std::optional<std::string> skip;   // why the comparison cannot run here
  std::optional<std::string> error;  // why it broke
};

Golden compute_golden(const GoldenCase& golden_case) {
  Golden g;
  g.golden_case = golden_case;
  const std::string python = OCTET_GOLDEN_PYTHON;
  try {
    g.octet = testing::run_octet(g.golden_case);
    const testing::TempDirectory dir;
    const std::string input = dir.file("gpt2_input.bin"), output = dir.file("gpt2_output.bin");
    testing::write_golden_input(input, testing::golden_input(g.golden_case, g.octet));
    const testing::ProcessOutcome ref =
        testing::run_program({python, testing::reference_script_path(), input, output});
    // The script exits 77 exactly when `import torch` fails.
    if (!ref.started || ref.exit_code == 77) {
      g.skip = "PyTorch is not available to " + python + ": " + ref.output;
      return g;
    }
    if (ref.exit_code != 0) {
      g.error = "the PyTorch reference exited with " + std::to_string(ref.exit_code) + ":\n" + ref.output;
      return g;
    }
    std::cout << ref.output;
    g.torch = testing::read_golden_output(output);
  } catch (const std::exception& e) {
    g.error = e.what();
  }
  return g;
}

// The parameter indexes golden_cases(). Each case is computed on first use, once per test process (CTest
// runs every test in a process of its own, so each runs one octet training and one PyTorch script).
class Gpt2Golden : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    static std::map<size_t, Golden> computed;
    auto it = computed.find(GetParam());
    if (it == computed.end()) {
      it = computed.emplace(GetParam(), compute_golden(testing::golden_cases().at(GetParam()))).first;
    }
    g_ = &it->second;
    if (g_->skip) GTEST_SKIP() << *g_->skip;
    if (g_->error) FAIL() << *g_->error;
  }
  const Golden& g() const { return *g_; }

 private:
  const Golden* g_ = nullptr;
};

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return testing::golden_cases().at(info.param).name;
}
INSTANTIATE_TEST_SUITE_P(Cases, Gpt2Golden, ::testing::Range<size_t>(0, testing::golden_cases().size()),
                         case_name);

TEST_P(Gpt2Golden, LogitsMatchPyTorchIncludingPaddedColumns) {
  const ModelConfig& c = g().golden_case.config;
  const int64_t N = g().golden_case.B * g().golden_case.T, V = c.vocab_size, Vp = c.padded_vocab();
  ASSERT_EQ(g().torch.N, N);
  ASSERT_EQ(g().torch.Vp, Vp);
  ASSERT_EQ(g().octet.logits.size(), static_cast<size_t>(N * Vp)) << "octet's logits are [B*T, Vp]";
  EXPECT_TRUE(testing::has_nonzero(g().octet.logits));

  // init_weights leaves the padded vocabulary rows of wte at zero, so padded logit columns are zero too.
  const float* wte = g().octet.initial_params.data() + g().octet.parameters.front().offset;
  ASSERT_EQ(g().octet.parameters.front().name, "wte");
  for (int64_t i = V * c.channels; i < Vp * c.channels; ++i)
    ASSERT_EQ(wte[i], 0.0f) << "wte padding at " << i;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = V; v < Vp; ++v)
      ASSERT_EQ(g().octet.logits[n * Vp + v], 0.0f) << "row " << n << " col " << v;
  }

  // Magnitude per logit: sum_c |ln_f(x)[n,c]| |wte[v,c]| from PyTorch. It scales the LM head's own rounding
  // and, to first order, the upstream error carried in by ln_f's output. Padded columns have magnitude 0
  // and so must agree exactly.
  const CompareOptions options{Dtype::f32, logits_chain(g().golden_case), g().torch.logit_magnitude};
  EXPECT_TRUE(all_close(g().octet.logits, g().torch.logits, options));
  std::cout << "logits: K=" << options.reduction_length << ", "
            << difference(g().octet.logits, g().torch.logits, options) << "\n";
}

TEST_P(Gpt2Golden, LossMatchesPyTorch) {
  const std::vector<float> octet = {g().octet.loss}, torch = {g().torch.loss};
  EXPECT_TRUE(std::isfinite(g().octet.loss));
  // Magnitude |loss|: the cross-entropy's terms (log-sum-exp and the target logit) are of its size.
  const CompareOptions options{Dtype::f32, loss_chain(g().golden_case)};
  EXPECT_TRUE(all_close(octet, torch, options));
  std::cout << std::setprecision(9) << "loss: octet " << g().octet.loss << ", torch " << g().torch.loss
            << ", K=" << options.reduction_length << ", " << difference(octet, torch, options) << "\n";
}

// Gradients are compared element by element against a per-tensor scale, the largest |gradient| of the
// tensor: a bias gradient or an attention-path gradient is a sum whose terms cancel, so an element's error
// is bounded relative to the terms that formed it, not to the (possibly tiny) element.
TEST_P(Gpt2Golden, EveryParameterGradientMatchesPyTorch) {
  const std::vector<ParameterInfo>& params = g().octet.parameters;
  ASSERT_EQ(g().torch.gradients.size(), params.size());
  const int64_t K = gradient_chain(g().golden_case);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterInfo& p = params[i];
    const testing::TensorRecord& ref = g().torch.gradients[i];
    SCOPED_TRACE(p.name);
    ASSERT_EQ(ref.name, p.name);
    ASSERT_EQ(ref.shape, p.shape);
    const std::span<const float> grad(g().octet.grads.data() + p.offset, static_cast<size_t>(p.count));
    EXPECT_TRUE(testing::has_nonzero(grad));
    float scale = 0.0f;
    for (const float v : ref.values) scale = std::max(scale, std::fabs(v));
    const std::vector<float> magnitude(ref.values.size(), scale);
    const CompareOptions options{Dtype::f32, K, magnitude};
    EXPECT_TRUE(all_close(grad, ref.values, options));
    std::cout << p.name << ": K=" << K << ", max |g| " << scale << ", "
              << difference(grad, ref.values, options) << "\n";
  }
  // Padded vocabulary rows take no part in the loss: their gradient is exactly zero.
  const ModelConfig& c = g().golden_case.config;
  const float* dwte = g().octet.grads.data() + params.front().offset;
  for (int64_t i = c.vocab_size * c.channels; i < c.padded_vocab() * c.channels; ++i) {
    ASSERT_EQ(dwte[i], 0.0f) << "wte padding gradient at " << i;
  }
}

// Ten AdamW steps on one batch. Adam's update is invariant to the gradient's scale, so each step moves the
// parameters by about lr per element whatever the gradient's size, and a gradient error of relative size e
// moves them by about lr * e more; over ten steps at lr 1e-3 that is far below the forward chain's own
// bound, so each step's loss is held to the same bound as the first loss.
TEST_P(Gpt2Golden, TenAdamWStepLossesMatchPyTorch) {
  const std::vector<float>& octet = g().octet.step_losses;
  const std::vector<float>& torch = g().torch.step_losses;
  ASSERT_EQ(octet.size(), static_cast<size_t>(g().golden_case.steps));
  ASSERT_EQ(torch.size(), octet.size());
  const CompareOptions options{Dtype::f32, loss_chain(g().golden_case)};
  EXPECT_TRUE(all_close(octet, torch, options));
  EXPECT_LT(octet.back(), octet.front()) << "training on one batch must lower its loss";
  EXPECT_LT(torch.back(), torch.front());
  double worst = 0.0;
  for (size_t i = 0; i < octet.size(); ++i) {
    const double rel = std::fabs(static_cast<double>(octet[i]) - torch[i]) / std::fabs(torch[i]);
    worst = std::max(worst, rel);
    std::cout << std::setprecision(9) << "step " << i << ": octet " << octet[i] << ", torch " << torch[i]
              << ", relative diff " << rel << "\n";
  }
  std::cout << "step losses: K=" << options.reduction_length << ", largest relative difference " << worst
            << ", " << difference(octet, torch, options) << "\n";
}

// Float32 values equal bit for bit (so -0 differs from 0 and a NaN equals only the same NaN).
::testing::AssertionResult bit_identical(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << ": " << std::setprecision(9) << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Two runs from the same seed give the same losses and the same final parameters, bit for bit: the CPU
// backend's reductions have a fixed order. Needs no PyTorch.
TEST(Gpt2Determinism, SameSeedGivesBitIdenticalTraining) {
  for (const GoldenCase& gc : testing::golden_cases()) {
    SCOPED_TRACE(gc.name);
    const OctetRun first = testing::run_octet(gc);
    const OctetRun second = testing::run_octet(gc);
    ASSERT_EQ(first.step_losses.size(), static_cast<size_t>(gc.steps));
    EXPECT_TRUE(testing::has_nonzero(first.step_losses));
    EXPECT_TRUE(bit_identical(first.step_losses, second.step_losses)) << "step losses";
    EXPECT_TRUE(bit_identical(first.final_params, second.final_params)) << "final parameters";
    EXPECT_NE(first.final_params, first.initial_params) << "training changed nothing";
  }
}

}  // namespace
}  // namespace octet
