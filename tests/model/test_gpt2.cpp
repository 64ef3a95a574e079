// GPT-2 on the CPU backend: layout, initialisation, gradients against finite differences, and what each
// precision mode does to the forward.
#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "model_fixture.h"
#include "octet/numerics/format.h"
#include "octet/numerics/random.h"

namespace octet {
namespace {

using testing::mode;
using testing::random_tokens;
using testing::tiny_config;

TEST(Gpt2, Gpt2SmallHasTheKnownParameterCount) {
  ModelConfig c;  // GPT-2 124M: 12 layers, 768 channels, vocabulary 50257 padded to 50304
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 1), 1, 1);
  EXPECT_EQ(c.padded_vocab(), 50304);
  EXPECT_EQ(m.parameter_count(), 124475904);  // llm.c's count for the same padded model
  EXPECT_EQ(m.parameters().size(), 2u + 12u * 12u + 2u);
  EXPECT_EQ(m.parameter("h.11.mlp.c_proj.weight").shape, (std::vector<int64_t>{768, 3072}));
  EXPECT_TRUE(m.parameter("wpe").weight_decay);
  EXPECT_FALSE(m.parameter("h.0.ln_1.weight").weight_decay);
}

TEST(Gpt2, HuggingFaceMapNamesShapesAndConvertsBothWays) {
  const ModelConfig c = tiny_config();  // V 61 padded to 64, C 64
  auto backend = make_cpu_backend();
  const std::unique_ptr<Model> built =
      make_model(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 16), 1, 16);
  const Model& m = *built;
  EXPECT_EQ(m.architecture(), "gpt2");
  EXPECT_EQ(m.describe(), c.describe());
  EXPECT_EQ(m.vocab_size(), 61);
  EXPECT_EQ(m.padded_vocab_size(), 64);
  EXPECT_EQ(m.max_seq_len(), 16);
  EXPECT_EQ(m.flop_parameter_count(), m.parameter_count() - 16 * 64);
  EXPECT_EQ(m.hf_name(m.parameter("wte")), "transformer.wte.weight");
  EXPECT_EQ(m.hf_name(m.parameter("wpe")), "transformer.wpe.weight");
  EXPECT_EQ(m.hf_name(m.parameter("h.1.attn.c_attn.weight")), "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(m.hf_name(m.parameter("ln_f.bias")), "transformer.ln_f.bias");
  EXPECT_EQ(m.hf_shape(m.parameter("wte")), (std::vector<int64_t>{61, 64}));
  EXPECT_EQ(m.hf_shape(m.parameter("h.0.mlp.c_fc.weight")), (std::vector<int64_t>{64, 256}));
  EXPECT_EQ(m.hf_shape(m.parameter("h.0.mlp.c_fc.bias")), (std::vector<int64_t>{256}));
  EXPECT_EQ(
      m.model_json(),
      R"({"n_embd":64,"n_head":4,"n_layer":2,"n_positions":16,"padded_vocab_size":64,"vocab_size":61})");

  // Small integers, every one distinct, so that any misplaced element shows; wte's padded rows are zero.
  std::vector<float> params(static_cast<size_t>(m.parameter_count()));
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 4093) + 1.0f;
  const ParameterInfo& wte = m.parameter("wte");
  std::fill(params.begin() + wte.offset + 61 * 64, params.begin() + wte.offset + wte.count, 0.0f);
  const ParameterInfo& fc = m.parameter("h.0.mlp.c_fc.weight");  // octet [256, 64], Hugging Face [64, 256]
  const std::vector<float> fc_hf = m.to_hf(fc, params);
  ASSERT_EQ(fc_hf.size(), 256u * 64u);
  EXPECT_EQ(fc_hf[static_cast<size_t>(3 * 256 + 5)], params[static_cast<size_t>(fc.offset + 5 * 64 + 3)]);
  EXPECT_EQ(m.to_hf(wte, params).size(), 61u * 64u);
  std::vector<float> back(params.size(), -1.0f);
  for (const ParameterInfo& p : m.parameters()) m.from_hf(p, m.to_hf(p, params), back);
  EXPECT_EQ(back, params);
}

TEST(Gpt2, InitialisationFollowsGpt2) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  m.init_weights(7);
  auto stddev = [&](const std::string& name) {
    const ParameterInfo& p = m.parameter(name);
    double s = 0;
    for (int64_t i = 0; i < p.count; ++i) s += double(m.params()[p.offset + i]) * m.params()[p.offset + i];
    return std::sqrt(s / double(p.count));
  };
  EXPECT_NEAR(stddev("h.0.mlp.c_fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(stddev("h.1.attn.c_proj.weight"), 0.02 / std::sqrt(4.0), 0.002);
  EXPECT_EQ(stddev("h.0.attn.c_attn.bias"), 0.0);
  EXPECT_EQ(m.params()[m.parameter("ln_f.weight").offset], 1.0f);
  const ParameterInfo& wte = m.parameter("wte");
  for (int64_t i = c.vocab_size * c.channels; i < wte.count; ++i) ASSERT_EQ(m.params()[wte.offset + i], 0.0f);
  // The same seed gives the same weights.
  Decoder again(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  again.init_weights(7);
  EXPECT_EQ(std::vector<float>(m.params(), m.params() + m.parameter_count()),
            std::vector<float>(again.params(), again.params() + again.parameter_count()));
}

TEST(Gpt2, InitialisationIsTheSeedsNormalDrawsWhateverTheThreads) {
  // A model of 13 million parameters, whose draws are spread over threads (decoder_parameters.cpp): every
  // weight element is the Box-Muller draw of the counter generator at its index, scaled by its tensor's
  // standard deviation, computed here from the definition.
  ModelConfig c = tiny_config();
  c.channels = 512;
  c.layers = 4;
  c.heads = 8;
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  m.init_weights(11);
  const CounterRng rng(11);
  int64_t checked = 0;
  for (const ParameterInfo& p : m.parameters()) {
    if (p.shape.size() != 2) continue;
    const bool residual = p.name.find("c_proj.weight") != std::string::npos;
    const float std = residual ? 0.02f / std::sqrt(2.0f * 4.0f) : 0.02f;
    const int64_t count = p.name == "wte" ? c.vocab_size * c.channels : p.count;
    for (int64_t i = 0; i < count; ++i) {
      const auto index = static_cast<uint64_t>(p.offset + i);
      const double u1 = (static_cast<double>(rng.bits(index, 0)) + 1.0) / 4294967297.0;
      const double u2 = static_cast<double>(rng.bits(index, 1)) / 4294967296.0;
      const float z = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      if (m.params()[p.offset + i] != std * z) {
        ADD_FAILURE() << p.name << " element " << i << ": " << m.params()[p.offset + i] << ", drawn "
                      << std * z;
        return;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 12'000'000);
  EXPECT_GT(m.parameter_count(), 12'000'000);
}

TEST(Gpt2, InitialLossIsNearLogV) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  m.init_weights(1);
  const auto tokens = random_tokens(32, 1, c.vocab_size), targets = random_tokens(32, 2, c.vocab_size);
  EXPECT_NEAR(m.forward(tokens.data(), targets.data(), 2, 16), std::log(61.0), 0.05);
}

TEST(Gpt2, GradientsMatchFiniteDifferences) {
  ModelConfig c = tiny_config();
  c.channels = 32;
  auto backend = make_cpu_backend();
  const int64_t B = 3, T = 11;
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, B * T), B, T);
  m.init_weights(1);
  for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 5.0f;  // gradients well above noise
  m.refresh_weight_copies();
  const auto tokens = random_tokens(B * T, 3, c.vocab_size), targets = random_tokens(B * T, 4, c.vocab_size);
  testing::expect_gradients_match_finite_differences(m, tokens, targets, B, T);
}

TEST(Gpt2, EveryModeComputesTheSameFunctionWithinItsPrecision) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const auto tokens = random_tokens(32, 5, c.vocab_size), targets = random_tokens(32, 6, c.vocab_size);
  auto loss = [&](MixedPrecision mp, GemmCounters* counters) {
    Decoder m(c, *backend, PrecisionPolicy(mode(mp), c, 32), 2, 16);
    m.init_weights(3);
    for (int64_t i = 0; i < m.parameter_count(); ++i) m.params()[i] *= 4.0f;  // logits far from uniform
    m.refresh_weight_copies();
    const float l = m.forward(tokens.data(), targets.data(), 2, 16);
    m.zero_grad();
    m.backward(1.0f / 32);
    if (counters) *counters = m.counters();
    return l;
  };
  const float f32 = loss(MixedPrecision::fp32, nullptr);
  EXPECT_GT(std::fabs(f32 - std::log(61.0f)), 0.5f)
      << "the comparison needs a loss far from its initial value";
  // Each format's unit roundoff (BF16 2^-8, FP16 2^-11, E4M3 2^-4) bounds the relative error of one
  // rounding; a few layers' errors add up, so each mode is allowed about four of them.
  EXPECT_NEAR(loss(MixedPrecision::bf16, nullptr), f32, 4 * 0x1p-8f * f32);
  EXPECT_NEAR(loss(MixedPrecision::fp16, nullptr), f32, 4 * 0x1p-11f * f32);
  GemmCounters counters;
  const float fp8 = loss(MixedPrecision::fp8, &counters);
  EXPECT_NEAR(fp8, f32, 4 * 0x1p-4f * f32);
  EXPECT_NE(fp8, f32);
  // 8 FP8 layers x 3 GEMMs; the LM head's 3 in BF16, and its forward GEMM once more: a forward without the
  // loss gradient keeps no BF16 logits for backward, which makes them again.
  EXPECT_EQ(counters.fp8_gemms, 24);
  EXPECT_EQ(counters.other_gemms, 4);
}

// zero_grad zeroes every gradient but the linear layers' weights, whose first backward writes them instead
// of adding to them: after stale values, the gradients of one and of two accumulated backwards are those of
// a model whose gradients were never touched, and grads() zeroes the weights no backward wrote.
TEST(Gpt2, ZeroGradLeavesTheLinearWeightsToTheirFirstBackward) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const int64_t B = 2, T = 16;
  const auto tokens = random_tokens(B * T, 21, c.vocab_size),
             targets = random_tokens(B * T, 22, c.vocab_size);
  for (const MixedPrecision mp : {MixedPrecision::fp32, MixedPrecision::bf16, MixedPrecision::fp8}) {
    SCOPED_TRACE(static_cast<int>(mp));
    auto make = [&] {
      auto m = std::make_unique<Decoder>(c, *backend, PrecisionPolicy(mode(mp), c, B * T), B, T);
      m->init_weights(13);
      return m;
    };
    auto grads = [](Decoder& m) { return std::vector<float>(m.grads(), m.grads() + m.parameter_count()); };
    auto stale = [](Decoder& m) { std::fill(m.grads(), m.grads() + m.parameter_count(), 7.0f); };
    auto micro_batch = [&](Decoder& m) {
      m.forward(tokens.data(), targets.data(), B, T);
      m.backward(1.0f / static_cast<float>(B * T));
    };
    auto untouched = make();  // its gradients start zero and are only ever added to
    micro_batch(*untouched);
    const std::vector<float> once = grads(*untouched);
    micro_batch(*untouched);
    const std::vector<float> twice = grads(*untouched);
    ASSERT_NE(once, twice);

    auto m = make();
    stale(*m);
    m->zero_grad();
    micro_batch(*m);
    EXPECT_EQ(grads(*m), once);  // equal as floats: a -0 written where +0 was added is the same gradient
    micro_batch(*m);
    EXPECT_EQ(grads(*m), twice);

    stale(*m);
    m->zero_grad();
    EXPECT_EQ(grads(*m), std::vector<float>(once.size(), 0.0f)) << "grads() before any backward";
    // The LM head's backward ran in the forward (wte written), the blocks' not yet.
    stale(*m);
    m->zero_grad();
    m->forward(tokens.data(), targets.data(), B, T, 1.0f / static_cast<float>(B * T));
    const std::vector<float> head_only = grads(*m);
    const ParameterInfo& wte = m->parameter("wte");
    const ParameterInfo& fc = m->parameter("h.1.mlp.c_fc.weight");
    EXPECT_NE(head_only[static_cast<size_t>(wte.offset)], 0.0f);
    EXPECT_NE(head_only[static_cast<size_t>(wte.offset)], 7.0f);
    for (int64_t i = 0; i < fc.count; ++i) ASSERT_EQ(head_only[static_cast<size_t>(fc.offset + i)], 0.0f);
  }
}

std::vector<float> host_copy(Backend& backend, const float* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  backend.copy_to_host(out.data(), x, out.size() * sizeof(float));
  return out;
}

// train.weight_gradients = "bf16" on the CPU, which stores them in float32: each block layer's weight
// gradient is the float32 one rounded to bf16 once per backward (after adding to the rounded gradient of the
// micro-batches before it), bit for bit; every other gradient, and the LM head's (wte's), is unchanged. FP8
// mode, whose weight gradient adds the whole micro-batch's product at once, so that the sum over two
// micro-batches is known exactly; and bf16 mode over one.
TEST(Gpt2, Bf16WeightGradientsAreTheFloat32OnesRounded) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const int64_t B = 2, T = 16;
  const auto tokens = random_tokens(B * T, 31, c.vocab_size),
             targets = random_tokens(B * T, 32, c.vocab_size);
  const auto tokens2 = random_tokens(B * T, 33, c.vocab_size),
             targets2 = random_tokens(B * T, 34, c.vocab_size);
  auto rounded = [](float x) { return bf16_to_float(float_to_bf16(x)); };
  for (const MixedPrecision mp : {MixedPrecision::fp8, MixedPrecision::bf16}) {
    SCOPED_TRACE(mixed_precision_name(mp));
    auto make = [&](bool bf16_gradients) {
      PrecisionSettings p = mode(mp);
      p.bf16_weight_gradients = bf16_gradients;
      auto m = std::make_unique<Decoder>(c, *backend, PrecisionPolicy(p, c, B * T), B, T);
      m->init_weights(17);
      m->zero_grad();
      return m;
    };
    auto micro_batch = [&](Decoder& m, const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
      m.forward(x.data(), y.data(), B, T);
      m.backward(1.0f / static_cast<float>(B * T));
      return std::vector<float>(m.grads(), m.grads() + m.parameter_count());
    };
    auto reference = make(false);
    const std::vector<float> first = micro_batch(*reference, tokens, targets);
    reference->zero_grad();
    const std::vector<float> second = micro_batch(*reference, tokens2, targets2);
    auto model = make(true);
    const std::vector<float> once = micro_batch(*model, tokens, targets);
    const std::vector<float> twice =
        mp == MixedPrecision::fp8 ? micro_batch(*model, tokens2, targets2) : once;
    int64_t rounded_values = 0;
    for (const ParameterInfo& p : model->parameters()) {
      EXPECT_EQ(p.grad_type, Dtype::f32) << p.name << ": the CPU stores every gradient in float32";
      EXPECT_EQ(p.grad_offset, p.offset) << p.name;
      const bool block_weight = p.shape.size() == 2 && p.name.rfind("h.", 0) == 0;
      for (int64_t i = 0; i < p.count; ++i) {
        const auto k = static_cast<size_t>(p.offset + i);
        if (!block_weight) {
          ASSERT_EQ(once[k], first[k]) << p.name << "[" << i << "]";
          continue;
        }
        ASSERT_EQ(once[k], rounded(first[k])) << p.name << "[" << i << "]";
        if (rounded(first[k]) != first[k]) ++rounded_values;
        if (mp == MixedPrecision::fp8) {
          ASSERT_EQ(twice[k], rounded(rounded(first[k]) + second[k])) << p.name << "[" << i << "], twice";
        }
      }
    }
    EXPECT_GT(rounded_values, 1000) << "the float32 gradients were bf16 values already";
  }
}

TEST(Gpt2, TheLmHeadRunsInChunks) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const int64_t B = 260, T = 16, N = B * T, Vp = c.padded_vocab();
  ASSERT_GT(N, Decoder::kHeadChunkRows) << "two chunks: 4096 rows and 64";
  auto make = [&] {
    auto m = std::make_unique<Decoder>(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, N), B, T);
    m->init_weights(9);
    for (int64_t i = 0; i < m->parameter_count(); ++i) m->params()[i] *= 4.0f;  // logits far from uniform
    m->refresh_weight_copies();
    m->zero_grad();
    return m;
  };
  const auto tokens = random_tokens(N, 11, c.vocab_size), targets = random_tokens(N, 12, c.vocab_size);
  const float dloss = 1.0f / static_cast<float>(N);

  // Each row's loss is the one of the full logits.
  auto fused = make();
  fused->forward_logits(tokens.data(), B, T);
  auto logits = backend->allocate(static_cast<size_t>(N * Vp) * sizeof(float));
  auto device_targets = backend->allocate(static_cast<size_t>(N) * sizeof(int32_t));
  auto expected_losses = backend->allocate(static_cast<size_t>(N) * sizeof(float));
  backend->copy_from_host(logits->floats(), host_copy(*backend, fused->logits(), N * Vp).data(),
                          logits->bytes());
  backend->copy_from_host(device_targets->ints(), targets.data(), device_targets->bytes());
  backend->softmax_cross_entropy(expected_losses->floats(), TensorView(logits->floats(), {N, Vp}),
                                 device_targets->ints(), c.vocab_size, 0.0f);
  fused->counters() = {};
  const float loss = fused->forward(tokens.data(), targets.data(), B, T, dloss);
  // Equal up to the last bits of the logits: OpenBLAS blocks a product by its row count, so on some CPUs a
  // row's logits from the 4096-row chunk and from the 4160-row product differ by an ulp (seen on AMD EPYC),
  // which moves a loss by about 1e-6. A row taken from the wrong chunk would be off by whole units.
  const std::vector<float> chunked = host_copy(*backend, fused->losses(), N);
  const std::vector<float> whole = host_copy(*backend, expected_losses->floats(), N);
  for (int64_t i = 0; i < N; ++i) {
    const float a = chunked[static_cast<size_t>(i)], b = whole[static_cast<size_t>(i)];
    ASSERT_TRUE(std::isfinite(a) && std::isfinite(b)) << "row " << i;
    ASSERT_LE(std::fabs(a - b), 1e-5f) << "row " << i << ": " << a << " against " << b;
  }
  EXPECT_THROW(fused->logits(), Error) << "a forward with targets keeps no logits";
  EXPECT_THROW(fused->backward(2.0f * dloss), Error) << "the head's backward ran with another scale";
  fused->backward(dloss);
  const std::vector<float> grads = host_copy(*backend, fused->grads(), fused->parameter_count());
  EXPECT_TRUE(testing::has_nonzero(grads));
  // The chunks count as the GEMMs they split: 3 per linear layer, 8 block layers and the head.
  EXPECT_EQ(fused->counters().other_gemms, 27);

  // The head's backward run by backward() after a loss-only forward (the logits made again) is the same.
  auto separate = make();
  EXPECT_EQ(separate->forward(tokens.data(), targets.data(), B, T), loss);
  separate->backward(dloss);
  EXPECT_EQ(host_copy(*backend, separate->grads(), separate->parameter_count()), grads);

  // Two micro-batches of one chunk each add up to the same gradient, up to float32 summation order.
  auto halves = make();
  const int64_t half = N / 2;
  const float first = halves->forward(tokens.data(), targets.data(), B / 2, T, dloss);
  halves->backward(dloss);
  const float second = halves->forward(tokens.data() + half, targets.data() + half, B / 2, T, dloss);
  halves->backward(dloss);
  EXPECT_NEAR((first + second) / 2.0f, loss, 4e-7 * loss);
  const std::vector<float> accumulated = host_copy(*backend, halves->grads(), halves->parameter_count());
  for (const ParameterInfo& p : fused->parameters()) {
    const std::span<const float> a(grads.data() + p.offset, static_cast<size_t>(p.count));
    const std::span<const float> e(accumulated.data() + p.offset, static_cast<size_t>(p.count));
    // The largest gradient of the tensor stands in for each element's sum of |terms|.
    float largest = 0.0f;
    for (const float x : e) largest = std::max(largest, std::fabs(x));
    const std::vector<float> magnitude(e.size(), largest);
    EXPECT_TRUE(testing::all_close(a, e, {Dtype::f32, N, magnitude})) << p.name;
  }
}

TEST(Gpt2, LayersMovedToBf16KeepTheirFloat32Input) {
  // FP8 layers whose input's FP8 cast is all they read have no float32 input buffer until they move to BF16;
  // then they train exactly as layers that ran in BF16 from the start.
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  const std::vector<std::string> moved = {"h.0.attn.c_attn", "h.0.mlp.c_fc", "h.0.mlp.c_proj", "lm_head"};
  PrecisionSettings all = mode(MixedPrecision::fp8);
  all.lm_head = true;
  Decoder a(c, *backend, PrecisionPolicy(all, c, 32), 2, 16);
  a.init_weights(6);
  for (const std::string& layer : moved) a.move_layer_to_bf16(layer, "BF16 by test");
  PrecisionSettings some = mode(MixedPrecision::fp8);
  some.exclude = {"h.0.attn.c_attn", "h.0.mlp.*"};
  Decoder b(c, *backend, PrecisionPolicy(some, c, 32), 2, 16);
  b.init_weights(6);
  for (const std::string& layer : moved)
    ASSERT_EQ(a.policy().layer(layer).fp8(), b.policy().layer(layer).fp8());
  TrainSettings s;
  s.batch_size = 2;
  s.seq_len = 16;
  Trainer ta(a, s), tb(b, s);
  const BatchSource data_a = testing::pattern_stream(4, 2, 16, c.vocab_size);
  const BatchSource data_b = testing::pattern_stream(4, 2, 16, c.vocab_size);
  for (int step = 0; step < 3; ++step) {
    const StepResult ra = ta.step(data_a), rb = tb.step(data_b);
    EXPECT_EQ(ra.loss, rb.loss) << "step " << step;
    EXPECT_EQ(ra.fp8_gemms, rb.fp8_gemms);
    EXPECT_EQ(ra.fp8_gemms, 5 * 3);  // h.0.attn.c_proj and the 4 layers of block 1
  }
  EXPECT_EQ(std::vector<float>(a.params(), a.params() + a.parameter_count()),
            std::vector<float>(b.params(), b.params() + b.parameter_count()));
  EXPECT_EQ(ta.evaluate(data_a, 1), tb.evaluate(data_b, 1));
}

TEST(Gpt2, BadTokensAndShapesAreRefused) {
  const ModelConfig c = tiny_config();
  auto backend = make_cpu_backend();
  Decoder m(c, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16);
  std::vector<int32_t> tokens(32, 1), targets(32, 1);
  tokens[5] = 61;
  try {
    m.forward(tokens.data(), targets.data(), 2, 16);
    FAIL() << "accepted a token outside the vocabulary";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("token 61 at position 5"), std::string::npos) << e.what();
  }
  tokens[5] = 1;
  EXPECT_THROW(m.forward(tokens.data(), targets.data(), 3, 16), Error);
  EXPECT_THROW(m.forward(tokens.data(), targets.data(), 1, 17), Error);
  ModelConfig bad = c;
  bad.channels = 30;
  EXPECT_THROW(Decoder(bad, *backend, PrecisionPolicy(mode(MixedPrecision::fp32), c, 32), 2, 16), Error);
}

}  // namespace
}  // namespace octet
