// See golden_harness.h.
#include "golden_harness.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <stdexcept>
#include <utility>

namespace octet::testing {
namespace {

// What the comparisons measured, for the log: the largest |a - e|, the L2 norm of (a - e) relative to that
// of e, and the largest error as a fraction of the comparator's bound (how much room is left).
struct Difference {
  double max_abs = 0.0;
  double relative_norm = 0.0;
  double of_bound = 0.0;
};

Difference difference(std::span<const float> a, std::span<const float> e, const CompareOptions& options) {
  const Tolerance tol = tolerance_for(options.dtype, options.reduction_length);
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

const char* reference_script(ModelArchitecture arch) {
  return arch == ModelArchitecture::gpt2 ? "gpt2_reference.py" : "llama_reference.py";
}

// The parameters with a row per padded vocabulary entry: the token embedding, and the head when untied.
std::vector<const ParameterInfo*> vocabulary_parameters(const OctetRun& run) {
  std::vector<const ParameterInfo*> out;
  for (const ParameterInfo& p : run.parameters) {
    if (p.name == "wte" || p.name == "embed_tokens.weight" || p.name == "lm_head.weight") out.push_back(&p);
  }
  return out;
}

// The weight the logits are read with, [Vp, C].
const ParameterInfo& head_parameter(const OctetRun& run, const ModelConfig& c) {
  const std::string name = c.arch == ModelArchitecture::gpt2 ? "wte"
                           : c.tied_head()                   ? "embed_tokens.weight"
                                                             : "lm_head.weight";
  for (const ParameterInfo& p : run.parameters) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("octet's model has no parameter " + name);
}

Golden compute_golden(const GoldenCase& golden_case) {
  Golden g;
  g.golden_case = golden_case;
  const std::string python = OCTET_GOLDEN_PYTHON;
  try {
    g.octet = run_octet(g.golden_case);
    const TempDirectory dir;
    const std::string input = dir.file("golden_input.bin"), output = dir.file("golden_output.bin");
    write_golden_input(input, golden_input(g.golden_case, g.octet));
    const ProcessOutcome ref = run_program(
        {python, reference_script_path(reference_script(golden_case.config.arch)), input, output});
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
    g.torch = read_golden_output(output);
  } catch (const std::exception& e) {
    g.error = e.what();
  }
  return g;
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

}  // namespace

const Golden& golden_for(const GoldenCase& golden_case) {
  static std::map<std::pair<ModelArchitecture, std::string>, Golden> computed;
  const auto key = std::pair(golden_case.config.arch, golden_case.name);
  auto it = computed.find(key);
  if (it == computed.end()) it = computed.emplace(key, compute_golden(golden_case)).first;
  return it->second;
}

void expect_logits_match(const Golden& g, int64_t K) {
  const ModelConfig& c = g.golden_case.config;
  const int64_t N = g.golden_case.B * g.golden_case.T, V = c.vocab_size, Vp = c.padded_vocab();
  ASSERT_EQ(g.torch.N, N);
  ASSERT_EQ(g.torch.Vp, Vp);
  ASSERT_EQ(g.octet.logits.size(), static_cast<size_t>(N * Vp)) << "octet's logits are [B*T, Vp]";
  EXPECT_TRUE(has_nonzero(g.octet.logits));

  // init_weights leaves the padded vocabulary rows at zero, so padded logit columns are zero too.
  for (const ParameterInfo* p : vocabulary_parameters(g.octet)) {
    const float* rows = g.octet.initial_params.data() + p->offset;
    for (int64_t i = V * c.channels; i < Vp * c.channels; ++i)
      ASSERT_EQ(rows[i], 0.0f) << p->name << " padding at " << i;
  }
  ASSERT_NO_THROW(head_parameter(g.octet, c));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = V; v < Vp; ++v)
      ASSERT_EQ(g.octet.logits[n * Vp + v], 0.0f) << "row " << n << " col " << v;
  }

  // Magnitude per logit: sum_c |final_norm(x)[n,c]| |head[v,c]| from PyTorch. It scales the head's own
  // rounding and, to first order, the upstream error carried in by the final norm's output. Padded columns
  // have magnitude 0 and so must agree exactly.
  const CompareOptions options{Dtype::f32, K, g.torch.logit_magnitude};
  EXPECT_TRUE(all_close(g.octet.logits, g.torch.logits, options));
  std::cout << "logits: K=" << K << ", " << difference(g.octet.logits, g.torch.logits, options) << "\n";
}

void expect_loss_matches(const Golden& g, int64_t K) {
  const std::vector<float> octet = {g.octet.loss}, torch = {g.torch.loss};
  EXPECT_TRUE(std::isfinite(g.octet.loss));
  // Magnitude |loss|: the cross-entropy's terms (log-sum-exp and the target logit) are of its size.
  const CompareOptions options{Dtype::f32, K};
  EXPECT_TRUE(all_close(octet, torch, options));
  std::cout << std::setprecision(9) << "loss: octet " << g.octet.loss << ", torch " << g.torch.loss
            << ", K=" << K << ", " << difference(octet, torch, options) << "\n";
}

// Gradients are compared element by element against a per-tensor scale, the largest |gradient| of the
// tensor: a bias gradient or an attention-path gradient is a sum whose terms cancel, so an element's error
// is bounded relative to the terms that formed it, not to the (possibly tiny) element.
void expect_gradients_match(const Golden& g, int64_t K) {
  const std::vector<ParameterInfo>& params = g.octet.parameters;
  ASSERT_EQ(g.torch.gradients.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterInfo& p = params[i];
    const TensorRecord& ref = g.torch.gradients[i];
    SCOPED_TRACE(p.name);
    ASSERT_EQ(ref.name, p.name);
    ASSERT_EQ(ref.shape, p.shape);
    const std::span<const float> grad(g.octet.grads.data() + p.offset, static_cast<size_t>(p.count));
    EXPECT_TRUE(has_nonzero(grad));
    float scale = 0.0f;
    for (const float v : ref.values) scale = std::max(scale, std::fabs(v));
    const std::vector<float> magnitude(ref.values.size(), scale);
    const CompareOptions options{Dtype::f32, K, magnitude};
    EXPECT_TRUE(all_close(grad, ref.values, options));
    std::cout << p.name << ": K=" << K << ", max |g| " << scale << ", "
              << difference(grad, ref.values, options) << "\n";
  }
  // Padded vocabulary rows take no part in the loss: their gradient is exactly zero.
  const ModelConfig& c = g.golden_case.config;
  for (const ParameterInfo* p : vocabulary_parameters(g.octet)) {
    const float* rows = g.octet.grads.data() + p->offset;
    for (int64_t i = c.vocab_size * c.channels; i < c.padded_vocab() * c.channels; ++i)
      ASSERT_EQ(rows[i], 0.0f) << p->name << " padding gradient at " << i;
  }
}

// Adam's update is invariant to the gradient's scale, so each step moves the parameters by about lr per
// element whatever the gradient's size, and a gradient error of relative size e moves them by about lr * e
// more; over ten steps at lr 1e-3 that is far below the forward chain's own bound, so each step's loss is
// held to the same bound as the first loss.
void expect_step_losses_match(const Golden& g, int64_t K) {
  const std::vector<float>& octet = g.octet.step_losses;
  const std::vector<float>& torch = g.torch.step_losses;
  ASSERT_EQ(octet.size(), static_cast<size_t>(g.golden_case.steps));
  ASSERT_EQ(torch.size(), octet.size());
  const CompareOptions options{Dtype::f32, K};
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
  std::cout << "step losses: K=" << K << ", largest relative difference " << worst << ", "
            << difference(octet, torch, options) << "\n";
}

// The CPU backend's reductions have a fixed order, so the same seed gives the same bits. Needs no PyTorch.
void expect_bit_identical_training(const std::vector<GoldenCase>& cases) {
  for (const GoldenCase& gc : cases) {
    SCOPED_TRACE(gc.name);
    const OctetRun first = run_octet(gc);
    const OctetRun second = run_octet(gc);
    ASSERT_EQ(first.step_losses.size(), static_cast<size_t>(gc.steps));
    EXPECT_TRUE(has_nonzero(first.step_losses));
    EXPECT_TRUE(bit_identical(first.step_losses, second.step_losses)) << "step losses";
    EXPECT_TRUE(bit_identical(first.final_params, second.final_params)) << "final parameters";
    EXPECT_NE(first.final_params, first.initial_params) << "training changed nothing";
  }
}

}  // namespace octet::testing
