// Backend::lm_head_chunk on the CUDA backend, whose BF16 head keeps the logits and their gradient in BF16,
// against the CPU reference (the default: linear_forward, round_in_place of the logits to BF16,
// softmax_cross_entropy, linear_backward) and against the CUDA backend's own default path. The values are the
// same by construction (a BF16 head's logits are rounded to BF16 either way, and the backward rounds the
// gradient to BF16 either way), so what remains is the GEMMs' accumulation order: a logit may land one BF16
// step away, which moves a loss by a few thousandths and the gradients by a small fraction of their size. Odd
// shapes, a padded vocabulary, forward only (dloss 0) and with the backward. Outputs start as NaN, so an
// element never written fails. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend_ops_harness.h"
#include "octet/backend/backend.h"
#include "octet/backend/precision.h"
#include "random.h"

namespace {

using octet::Backend;
using octet::GemmMode;
using octet::LinearExecution;
using octet::testing::backend_ops::make_reference_backend;
using octet::testing::backend_ops::make_tested_backend;

struct HeadShape {
  int64_t n, C, V, Vp;
};

const std::vector<HeadShape> kShapes = {
    {1, 8, 5, 8}, {37, 24, 50, 64}, {64, 48, 1000, 1024}, {130, 64, 997, 1008}};

struct HeadResult {
  std::vector<float> losses, dinp, dweight;
  int64_t other_gemms = 0;
};

// Runs one chunk on `backend`; `fused` false calls the base class's three-op default explicitly.
HeadResult run_head(Backend& backend, const HeadShape& s, float dloss, bool fused) {
  const uint64_t seed = 7000 + static_cast<uint64_t>(s.n * 31 + s.Vp);
  const std::vector<float> weight =
      octet::testing::random_normal(static_cast<size_t>(s.Vp * s.C), seed, 0.3f);
  const std::vector<float> inp = octet::testing::random_normal(static_cast<size_t>(s.n * s.C), seed + 1);
  const std::vector<float> dweight0 =
      octet::testing::random_normal(static_cast<size_t>(s.Vp * s.C), seed + 2, 0.01f);
  std::vector<int32_t> targets(static_cast<size_t>(s.n));
  for (int64_t i = 0; i < s.n; ++i) targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % s.V);

  const auto upload = [&](const void* host, size_t bytes) {
    auto buffer = backend.allocate(bytes);
    backend.copy_from_host(buffer->data(), host, bytes);
    return buffer;
  };
  const std::vector<float> nan(static_cast<size_t>(std::max(s.n * s.Vp, s.n * s.C)), NAN);
  auto d_weight = upload(weight.data(), weight.size() * sizeof(float));
  auto d_inp = upload(inp.data(), inp.size() * sizeof(float));
  auto d_dweight = upload(dweight0.data(), dweight0.size() * sizeof(float));
  auto d_targets = upload(targets.data(), targets.size() * sizeof(int32_t));
  auto d_logits = upload(nan.data(), static_cast<size_t>(s.n * s.Vp) * sizeof(float));
  auto d_losses = upload(nan.data(), static_cast<size_t>(s.n) * sizeof(float));
  auto d_dinp = upload(nan.data(), static_cast<size_t>(s.n * s.C) * sizeof(float));

  HeadResult r;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::bf16;
  exec.other_gemms = &r.other_gemms;
  std::unique_ptr<octet::WeightCopy> copy;
  backend.prepare_weight(copy, d_weight->floats(), s.Vp, s.C, exec);
  float* dinp = dloss != 0.0f ? d_dinp->floats() : nullptr;
  if (fused) {
    backend.lm_head_chunk(d_losses->floats(), d_logits->floats(), d_targets->ints(), dinp,
                          d_dweight->floats(), d_inp->floats(), d_weight->floats(), copy.get(), s.n, s.C, s.V,
                          s.Vp, dloss, exec);
  } else {
    backend.Backend::lm_head_chunk(d_losses->floats(), d_logits->floats(), d_targets->ints(), dinp,
                                   d_dweight->floats(), d_inp->floats(), d_weight->floats(), copy.get(), s.n,
                                   s.C, s.V, s.Vp, dloss, exec);
  }
  backend.synchronize();
  r.losses.resize(static_cast<size_t>(s.n));
  backend.copy_to_host(r.losses.data(), d_losses->data(), r.losses.size() * sizeof(float));
  if (dloss != 0.0f) {
    r.dinp.resize(static_cast<size_t>(s.n * s.C));
    r.dweight.resize(static_cast<size_t>(s.Vp * s.C));
    backend.copy_to_host(r.dinp.data(), d_dinp->data(), r.dinp.size() * sizeof(float));
    backend.copy_to_host(r.dweight.data(), d_dweight->data(), r.dweight.size() * sizeof(float));
  }
  return r;
}

// Largest |a - b| over the root mean square of b; a must be finite everywhere.
double error_of(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  double squares = 0.0, worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_TRUE(std::isfinite(a[i])) << what << " " << i;
    if (!std::isfinite(a[i])) return INFINITY;
    squares += static_cast<double>(b[i]) * b[i];
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return worst / std::max(std::sqrt(squares / static_cast<double>(std::max<size_t>(b.size(), 1))), 1e-30);
}

void expect_close(const HeadResult& tested, const HeadResult& reference, const char* against) {
  // Losses near log(V) (a few units): one BF16 step of a logit (2^-8 relative) moves one by well under 0.02.
  double loss = 0.0;
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(tested.losses[i])) << against << " loss " << i;
    loss = std::max(loss, static_cast<double>(std::abs(tested.losses[i] - reference.losses[i])));
  }
  EXPECT_LE(loss, 0.02) << against;
  if (!reference.dinp.empty()) {
    EXPECT_LE(error_of(tested.dinp, reference.dinp, "dinp"), 0.05) << against;
    EXPECT_LE(error_of(tested.dweight, reference.dweight, "dweight"), 0.02) << against;
  }
  EXPECT_EQ(tested.other_gemms, reference.other_gemms) << against;
}

TEST(BackendOpsLmHead, Bf16ChunkMatchesTheThreeOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  for (const HeadShape& s : kShapes) {
    for (const float dloss : {0.0f, 1.0f / static_cast<float>(s.n)}) {
      SCOPED_TRACE(::testing::Message()
                   << "n=" << s.n << " C=" << s.C << " V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss);
      const HeadResult fused = run_head(*tested, s, dloss, true);
      expect_close(fused, run_head(*reference, s, dloss, true), "the CPU reference");
      expect_close(fused, run_head(*tested, s, dloss, false), "the CUDA backend's three ops");
      EXPECT_EQ(fused.other_gemms, dloss != 0.0f ? 3 : 1);
    }
  }
}

}  // namespace
