// See weight_parts_check.h.
#include "weight_parts_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "random.h"

namespace octet::testing {
namespace {

constexpr int64_t kN = 16, kC = 32, kOC = 48, kSteps = 4;

std::shared_ptr<const ScalingRecipe> recipe_of(RecipeKind kind) {
  switch (kind) {
    case RecipeKind::current:
      return std::make_shared<CurrentScaling>();
    case RecipeKind::static_scale:
      return std::make_shared<StaticScaling>(8.0f);
    default:
      return std::make_shared<DelayedScaling>(4);
  }
}

// One rank's (or the whole cast's) layer: its state, execution and weight copy.
struct Layer {
  Fp8LinearState state;
  LinearExecution exec;
  std::unique_ptr<WeightCopy> copy;
  std::unique_ptr<Fp8Tensor> input_codes, gradient_codes;
  int64_t fp8_gemms = 0, other_gemms = 0;

  explicit Layer(const std::shared_ptr<const ScalingRecipe>& recipe) {
    state.activation = state.weight = state.gradient = recipe->initial_state();
    exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::fp8;
    exec.recipe = recipe.get();
    exec.state = &state;
    exec.fp8_gemms = &fp8_gemms;
    exec.other_gemms = &other_gemms;
  }
};

std::vector<float> to_host(Backend& b, const void* p, size_t n) {
  std::vector<float> out(n);
  b.copy_to_host(out.data(), p, n * sizeof(float));
  return out;
}

bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

void expect_same_state(const ScalingState& a, const ScalingState& b, const std::string& where) {
  EXPECT_TRUE(same_bits(a.scale, b.scale)) << where << ": scale " << a.scale << " vs " << b.scale;
  EXPECT_TRUE(same_bits(a.scale_inv, b.scale_inv)) << where;
  EXPECT_TRUE(same_bits(a.last_amax, b.last_amax)) << where << ": amax " << a.last_amax << " vs " << b.last_amax;
  EXPECT_EQ(a.amax_history, b.amax_history) << where;
  EXPECT_EQ(a.updates, b.updates) << where;
  EXPECT_EQ(a.degenerate_amax, b.degenerate_amax) << where;
}

// The layer's FP8 forward of x and input gradient of dout, as bits.
std::vector<float> outputs(Backend& b, Layer& l, const float* x, const float* dout, const float* w) {
  std::unique_ptr<Buffer> out = b.allocate(kN * kOC * sizeof(float));
  std::unique_ptr<Buffer> dinp = b.allocate(kN * kC * sizeof(float));
  std::unique_ptr<Buffer> dweight = b.allocate(kOC * kC * sizeof(float));
  b.linear_forward(TensorView(static_cast<float*>(out->data()), {kN, kOC}), ConstTensorView(x, {kN, kC}),
                   ConstTensorView(w, {kOC, kC}), l.copy.get(), {}, l.exec, {&l.input_codes});
  b.linear_backward(TensorView(static_cast<float*>(dinp->data()), {kN, kC}),
                    TensorView(static_cast<float*>(dweight->data()), {kOC, kC}), nullptr,
                    ConstTensorView(dout, {kN, kOC}), ConstTensorView(x, {kN, kC}), ConstTensorView(w, {kOC, kC}),
                    l.copy.get(), l.exec, l.input_codes.get(), {&l.gradient_codes});
  std::vector<float> all = to_host(b, out->data(), kN * kOC);
  const std::vector<float> d = to_host(b, dinp->data(), kN * kC);
  all.insert(all.end(), d.begin(), d.end());
  return all;
}

}  // namespace

void expect_parts_make_the_whole_copy(Backend& b, const WeightPartsCase& c) {
  const std::shared_ptr<const ScalingRecipe> recipe = recipe_of(c.recipe);
  const auto ranks = static_cast<int64_t>(c.cuts.size());
  ASSERT_TRUE(ranks >= 1 && c.cuts.back() == kOC * kC);
  Layer whole(recipe);
  std::vector<std::unique_ptr<Layer>> rank;
  for (int64_t r = 0; r < ranks; ++r) rank.push_back(std::make_unique<Layer>(recipe));

  const std::vector<float> base = random_normal(kOC * kC, 17, 0.05f);
  const std::vector<float> x_host = random_normal(kN * kC, 18), dout_host = random_normal(kN * kOC, 19, 1e-3f);
  std::unique_ptr<Buffer> w = b.allocate(kOC * kC * sizeof(float)), x = b.allocate(kN * kC * sizeof(float)),
                          dout = b.allocate(kN * kOC * sizeof(float)), codes = b.allocate(kOC * kC),
                          amaxes = b.allocate(sizeof(float));
  b.copy_from_host(x->data(), x_host.data(), x_host.size() * sizeof(float));
  b.copy_from_host(dout->data(), dout_host.data(), dout_host.size() * sizeof(float));
  auto* wp = static_cast<float*>(w->data());
  auto* amax = static_cast<float*>(amaxes->data());

  for (int64_t step = 0; step < kSteps; ++step) {
    const std::string where = "step " + std::to_string(step);
    std::vector<float> host = base;
    for (float& v : host) v *= static_cast<float>(1 + 3 * step);  // the amax grows: the history moves
    if (c.fault == WeightPartsCase::Fault::zeros) std::fill(host.begin(), host.end(), 0.0f);
    if (c.fault == WeightPartsCase::Fault::nan && step == 1) host[static_cast<size_t>(c.cuts[0])] = NAN;
    b.copy_from_host(wp, host.data(), host.size() * sizeof(float));

    b.prepare_weight(whole.copy, wp, kOC, kC, whole.exec);

    // Each rank's part and amax; the largest (a NaN anywhere wins), as the ranks' all-reduce takes it.
    std::vector<Backend::WeightPart> parts;
    float largest = 0.0f;
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t begin = r == 0 ? 0 : c.cuts[static_cast<size_t>(r - 1)], end = c.cuts[static_cast<size_t>(r)];
      parts.push_back({.copy = &rank[static_cast<size_t>(r)]->copy,
                       .exec = &rank[static_cast<size_t>(r)]->exec,
                       .weight = wp,
                       .rows = kOC,
                       .cols = kC,
                       .begin = begin,
                       .end = end,
                       .codes_offset = 0});
      b.weight_part_amaxes(std::span(&parts.back(), 1), amax);
      const float a = to_host(b, amax, 1)[0];
      if (begin == end) {
        EXPECT_EQ(a, 0.0f) << where << ": an empty part's amax";
      }
      largest = std::isnan(a) || std::isnan(largest) ? NAN : std::max(largest, a);
    }
    // The gather: every rank casts its part into the one buffer, which then holds every rank's codes.
    b.copy_from_host(amax, &largest, sizeof(float));
    for (const Backend::WeightPart& p : parts) b.cast_weight_parts(std::span(&p, 1), amax, static_cast<uint8_t*>(codes->data()));
    for (const Backend::WeightPart& p : parts) b.weight_copies_from_codes(std::span(&p, 1), static_cast<const uint8_t*>(codes->data()));

    const std::vector<float> expected = outputs(b, whole, static_cast<const float*>(x->data()),
                                                static_cast<const float*>(dout->data()), wp);
    b.fetch_scaling(whole.state);
    for (int64_t r = 0; r < ranks; ++r) {
      Layer& l = *rank[static_cast<size_t>(r)];
      const std::string who = where + ", rank " + std::to_string(r);
      const std::vector<float> got = outputs(b, l, static_cast<const float*>(x->data()),
                                             static_cast<const float*>(dout->data()), wp);
      ASSERT_EQ(got.size(), expected.size());
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
          << who << ": the forward and input gradient from the gathered codes differ from the whole cast's";
      b.fetch_scaling(l.state);
      expect_same_state(l.state.weight, whole.state.weight, who + " weight");
      EXPECT_TRUE(same_bits(l.state.weight_copy_scale, whole.state.weight_copy_scale)) << who;
      EXPECT_EQ(l.fp8_gemms, whole.fp8_gemms) << who;
    }
    if (c.fault == WeightPartsCase::Fault::none) {
      const bool finite = std::all_of(expected.begin(), expected.end(), [](float v) { return std::isfinite(v); });
      EXPECT_TRUE(finite) << where << ": a healthy weight's outputs are finite";
    }
  }
}

}  // namespace octet::testing
