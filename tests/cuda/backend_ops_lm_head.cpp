// The models' LM head chunk (src/model/lm_head.h) on the CUDA backend against the CPU reference, and the
// loss on BF16 logits. A BF16 head keeps the logits and their gradient in BF16 on the CUDA backend
// (StorageRole::logits): its GEMM writes them, the loss reads and writes them, the backward GEMMs read them;
// the CPU rounds float32 logits in place, and so does the CUDA backend behind a wrapper that keeps every
// tensor in float32 (its three ops with round_in_place). The values are the same by construction (a BF16
// head's logits are rounded to BF16 either way, and the backward rounds the gradient to BF16 either way), so
// what remains is the GEMMs' accumulation order: a logit may land one BF16 step away, which moves a loss by a
// few thousandths and the gradients by a small fraction of their size. An FP8 head keeps float32 logits on
// both. Odd shapes, a padded vocabulary, forward only (dloss 0) and with the backward. Outputs start as NaN,
// so an element never written fails. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend_ops_harness.h"
#include "forwarding_backend.h"
#include "lm_head.h"
#include "octet/backend/backend.h"
#include "octet/backend/precision.h"
#include "octet/numerics/minifloat.h"
#include "octet/numerics/scaling.h"
#include "random.h"

namespace {

using octet::Backend;
using octet::ConstTensorView;
using octet::Dtype;
using octet::GemmMode;
using octet::LinearExecution;
using octet::TensorView;
using octet::testing::backend_ops::make_reference_backend;
using octet::testing::backend_ops::make_tested_backend;

struct HeadShape {
  int64_t n, C, V, Vp;
};

const std::vector<HeadShape> kShapes = {
    {1, 8, 5, 8}, {37, 24, 50, 64}, {64, 48, 1000, 1024}, {130, 64, 997, 1008}};
// FP8 GEMMs need every dimension a multiple of 16 (the precision policy keeps other heads in BF16).
const std::vector<HeadShape> kFp8Shapes = {{16, 16, 5, 16}, {64, 48, 1000, 1024}, {128, 64, 997, 1008}};

// The CUDA backend keeping every tensor in float32 (storage_type's default): the head's three ops with the
// model's round_in_place of the logits in between.
class Float32Storage final : public octet::testing::ForwardingBackend {
 public:
  explicit Float32Storage(Backend& inner) : ForwardingBackend(inner) {}
  std::string_view name() const override { return "cuda, float32 logits"; }
  void synchronize() override { inner_.synchronize(); }
};

struct HeadResult {
  std::vector<float> losses, dinp, dweight;
  int64_t fp8_gemms = 0, other_gemms = 0;
};

// One chunk of a head whose three GEMMs are `mode` (FP8: current scaling) on `backend`.
HeadResult run_head(Backend& backend, const HeadShape& s, float dloss, GemmMode mode) {
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
  const octet::CurrentScaling recipe(0);
  octet::Fp8LinearState state;
  LinearExecution exec;
  exec.forward = exec.input_gradient = exec.weight_gradient = mode;
  if (mode == GemmMode::fp8) {
    state = {recipe.initial_state(), recipe.initial_state(), recipe.initial_state()};
    exec.recipe = &recipe;
    exec.state = &state;
  }
  exec.fp8_gemms = &r.fp8_gemms;
  exec.other_gemms = &r.other_gemms;
  std::unique_ptr<octet::WeightCopy> copy;
  std::unique_ptr<octet::Fp8Tensor> input_codes, gradient_codes;
  backend.prepare_weight(copy, d_weight->floats(), s.Vp, s.C, exec);
  octet::lm_head_chunk(backend,
                       {.losses = d_losses->floats(),
                        .logits = d_logits->data(),
                        .targets = d_targets->ints(),
                        .dinp = TensorView(dloss != 0.0f ? d_dinp->floats() : nullptr, {s.n, s.C}),
                        .dweight = TensorView(d_dweight->floats(), {s.Vp, s.C}),
                        .inp = ConstTensorView(d_inp->floats(), {s.n, s.C}),
                        .weight = ConstTensorView(d_weight->floats(), {s.Vp, s.C}),
                        .copy = copy.get(),
                        .input = {&input_codes},
                        .gradient = {&gradient_codes},
                        .V = s.V,
                        .dloss = dloss},
                       exec);
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

// The gradients' tolerances, relative to the reference's root mean square (error_of).
struct GradientTolerance {
  double dinp = 0.05;
  double dweight = 0.02;
};

void expect_close(const HeadResult& tested, const HeadResult& reference, const char* against,
                  GradientTolerance tolerance = {}) {
  // Losses near log(V) (a few units): one BF16 step of a logit (2^-8 relative) moves one by well under 0.02.
  double loss = 0.0;
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    ASSERT_TRUE(std::isfinite(tested.losses[i])) << against << " loss " << i;
    loss = std::max(loss, static_cast<double>(std::abs(tested.losses[i] - reference.losses[i])));
  }
  EXPECT_LE(loss, 0.02) << against;
  if (!reference.dinp.empty()) {
    EXPECT_LE(error_of(tested.dinp, reference.dinp, "dinp"), tolerance.dinp) << against;
    EXPECT_LE(error_of(tested.dweight, reference.dweight, "dweight"), tolerance.dweight) << against;
  }
  EXPECT_EQ(tested.other_gemms, reference.other_gemms) << against;
  EXPECT_EQ(tested.fp8_gemms, reference.fp8_gemms) << against;
}

TEST(BackendOpsLmHead, Bf16HeadKeepsBf16LogitsAndMatchesTheThreeOps) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  Float32Storage tested_f32(*tested);
  LinearExecution bf16;
  bf16.forward = bf16.input_gradient = bf16.weight_gradient = GemmMode::bf16;
  EXPECT_EQ(octet::lm_head_logits_type(*tested, bf16), Dtype::bf16);
  EXPECT_EQ(octet::lm_head_logits_type(*reference, bf16), Dtype::f32);
  EXPECT_EQ(octet::lm_head_logits_type(tested_f32, bf16), Dtype::f32);
  for (const HeadShape& s : kShapes) {
    for (const float dloss : {0.0f, 1.0f / static_cast<float>(s.n)}) {
      SCOPED_TRACE(::testing::Message()
                   << "n=" << s.n << " C=" << s.C << " V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss);
      const HeadResult kept = run_head(*tested, s, dloss, GemmMode::bf16);
      expect_close(kept, run_head(*reference, s, dloss, GemmMode::bf16), "the CPU reference");
      expect_close(kept, run_head(tested_f32, s, dloss, GemmMode::bf16), "the CUDA backend's float32 logits");
      EXPECT_EQ(kept.other_gemms, dloss != 0.0f ? 3 : 1);
      EXPECT_EQ(kept.fp8_gemms, 0);
    }
  }
}

TEST(BackendOpsLmHead, Fp8HeadMatchesTheReference) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  LinearExecution fp8;
  fp8.forward = fp8.input_gradient = fp8.weight_gradient = GemmMode::fp8;
  EXPECT_EQ(octet::lm_head_logits_type(*tested, fp8), Dtype::f32);
  for (const HeadShape& s : kFp8Shapes) {
    for (const float dloss : {0.0f, 1.0f / static_cast<float>(s.n)}) {
      SCOPED_TRACE(::testing::Message()
                   << "n=" << s.n << " C=" << s.C << " V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss);
      const HeadResult kept = run_head(*tested, s, dloss, GemmMode::fp8);
      // Both backward GEMMs read the logits' gradient cast to E5M2 (two mantissa bits): where the GPU's and
      // the CPU's float32 gradients fall on either side of a rounding boundary, a code lands one step (up to
      // a quarter of the value) away, and the sums over the rows carry that. A wrong scale or a transposed
      // operand is off by far more.
      expect_close(kept, run_head(*reference, s, dloss, GemmMode::fp8), "the CPU reference",
                   {.dinp = 0.25, .dweight = 0.25});
      EXPECT_EQ(kept.fp8_gemms, dloss != 0.0f ? 3 : 1);
      EXPECT_EQ(kept.other_gemms, 0);
    }
  }
}

// softmax_cross_entropy on bf16 logits (the CUDA backend's StorageRole::logits) against the CPU reference on
// the same values in float32, whose gradient is then rounded to bf16 once, as the contract says. The losses
// get the float32 case's tolerance; a gradient may land one bf16 step away where the float32 values on the
// two sides fall on either side of a rounding boundary.
TEST(BackendOpsLmHead, LossOnBf16LogitsMatchesTheReference) {
  SKIP_WITHOUT_TESTED_BACKEND();
  const auto reference = make_reference_backend();
  const auto tested = make_tested_backend();
  struct LossShape {
    int64_t N, V, Vp;
  };
  for (const auto& [N, V, Vp] :
       std::vector<LossShape>{{1, 1, 8}, {13, 97, 128}, {5, 61, 64}, {3, 50257, 50304}}) {
    for (const float dloss : {0.0f, 1.0f / static_cast<float>(N)}) {
      SCOPED_TRACE(::testing::Message() << "N=" << N << " V=" << V << " Vp=" << Vp << " dloss=" << dloss);
      const std::vector<float> raw =
          octet::testing::random_normal(static_cast<size_t>(N * Vp), 9100 + N, 3.0f);
      std::vector<uint16_t> codes(raw.size());
      std::vector<float> values(raw.size());
      for (size_t i = 0; i < raw.size(); ++i) {
        codes[i] = octet::float_to_bf16(raw[i]);
        values[i] = octet::bf16_to_float(codes[i]);
      }
      std::vector<int32_t> targets(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i) targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V);

      // The reference: float32 logits of the bf16 values, the gradient rounded once.
      std::vector<float> want_losses(static_cast<size_t>(N)), want = values;
      reference->softmax_cross_entropy(want_losses.data(), TensorView(want.data(), {N, Vp}), targets.data(),
                                       V, dloss);
      if (dloss != 0.0f) reference->round_in_place(want.data(), N * Vp, Dtype::bf16);

      auto d_logits = tested->allocate(codes.size() * sizeof(uint16_t));
      auto d_targets = tested->allocate(targets.size() * sizeof(int32_t));
      auto d_losses = tested->allocate(static_cast<size_t>(N) * sizeof(float));
      tested->copy_from_host(d_logits->data(), codes.data(), codes.size() * sizeof(uint16_t));
      tested->copy_from_host(d_targets->data(), targets.data(), targets.size() * sizeof(int32_t));
      tested->softmax_cross_entropy(d_losses->floats(), TensorView(d_logits->data(), Dtype::bf16, {N, Vp}),
                                    d_targets->ints(), V, dloss);
      std::vector<float> losses(static_cast<size_t>(N));
      std::vector<uint16_t> got_codes(codes.size());
      tested->copy_to_host(losses.data(), d_losses->data(), losses.size() * sizeof(float));
      tested->copy_to_host(got_codes.data(), d_logits->data(), got_codes.size() * sizeof(uint16_t));
      std::vector<float> got(got_codes.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = octet::bf16_to_float(got_codes[i]);

      // log-sum-exp of V exponentials: an absolute error of about (V+4) 2^-24 times the log's terms, as in
      // the float32 case (test_backend_ops.cpp).
      std::vector<float> loss_terms(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i) {
        const float* row = values.data() + i * Vp;
        const float max = *std::max_element(row, row + V);
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
        const double log_sum = std::log(sum);
        const double loss = log_sum - (row[targets[static_cast<size_t>(i)]] - max);
        loss_terms[static_cast<size_t>(i)] = static_cast<float>(1.0 + std::fabs(loss) + std::fabs(log_sum));
      }
      EXPECT_TRUE(octet::testing::all_close(losses, want_losses,
                                            {.reduction_length = V + 4, .magnitude = loss_terms}));
      if (dloss == 0.0f) {
        EXPECT_EQ(got_codes, codes) << "dloss 0: the logits are left as they are";
      } else {
        EXPECT_TRUE(octet::testing::all_close(got, want, {.dtype = Dtype::bf16, .reduction_length = V + 4}));
        if (V == 1) {
          // One class: its probability is 1 and its gradient 0, as every padded column's.
          EXPECT_EQ(got, std::vector<float>(got.size(), 0.0f));
        } else {
          EXPECT_TRUE(octet::testing::has_nonzero(got));
        }
      }
    }
  }
}

}  // namespace
