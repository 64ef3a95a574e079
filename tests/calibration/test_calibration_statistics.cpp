// What calibration measures: the magnitude histogram on planted values (exact amax, percentiles as the
// lower edge of their bin), the observing backend on one linear layer with planted operands, and a whole
// model's calibration against the operands recorded independently (every FP8 layer of GPT-2, of a mixture of
// experts with its experts, and with full activation checkpointing, whose reruns must not count twice).
#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "calibration_observer.h"
#include "forwarding_backend.h"
#include "model_fixture.h"
#include "octet/backend/cpu_backend.h"
#include "octet/model/model.h"
#include "tiny_model.h"

namespace octet {
namespace {

TEST(MagnitudeHistogram, PlantedValuesGiveExactAmaxAndPercentiles) {
  MagnitudeHistogram h;
  std::vector<float> values(98, 1.0f);
  values.push_back(-2.0f);
  values.push_back(4.0f);
  for (int i = 0; i < 5; ++i) values.push_back(i % 2 == 0 ? 0.0f : -0.0f);
  values.push_back(NAN);
  values.push_back(-INFINITY);
  h.add(values);
  const OperandStatistics s = h.statistics();
  EXPECT_EQ(s.values, 107);
  EXPECT_EQ(s.zeros, 5);
  EXPECT_EQ(s.non_finite, 2);
  EXPECT_EQ(s.amax, 4.0f);
  // 100 non-zero finite magnitudes: the 99th smallest is 2, the 100th is 4.
  EXPECT_EQ(s.p99, 2.0f);
  EXPECT_EQ(s.p99_9, 4.0f);
  EXPECT_EQ(s.p99_99, 4.0f);
}

TEST(MagnitudeHistogram, AmaxIsExactAndPercentilesAreTheirBinsLowerEdge) {
  MagnitudeHistogram h;
  // 1 + 1/16 has five significant bits: a bin edge. 1 + 1/32 has six: its bin starts at 1.
  h.add(std::vector<float>{1.0625f, 1.03125f, -3.14159274f});
  const OperandStatistics s = h.statistics();
  EXPECT_EQ(s.amax, 3.14159274f);
  EXPECT_EQ(h.percentile(1, 3), 1.0f) << "the smallest, 1.03125, reads as its bin's lower edge";
  EXPECT_EQ(h.percentile(2, 3), 1.0625f);
  EXPECT_EQ(h.percentile(3, 3), 3.125f) << "3.14159 lies in [3.125, 3.25)";
  // Spread over many powers of two, subnormals included: every percentile is a lower bin edge within 1/16.
  MagnitudeHistogram wide;
  std::vector<float> v;
  for (int i = 0; i < 1000; ++i)
    v.push_back(std::ldexp(1.0f + static_cast<float>(i) / 1000.0f, i % 270 - 149));
  wide.add(v);
  std::vector<float> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  const float exact = sorted[989];  // k = ceil(0.99 * 1000) = 990
  const float p99 = wide.statistics().p99;
  EXPECT_LE(p99, exact);
  EXPECT_GE(p99, exact * (1.0f - 1.0f / 16.0f));
}

TEST(MagnitudeHistogram, NothingButZerosGivesZerosAndTheFallbackScale) {
  MagnitudeHistogram h;
  h.add(std::vector<float>(10, 0.0f));
  const OperandStatistics s = h.statistics();
  EXPECT_EQ(s.values, 10);
  EXPECT_EQ(s.amax, 0.0f);
  EXPECT_EQ(s.p99_99, 0.0f);
  bool fell_back = false;
  EXPECT_EQ(calibrated_scale(s.amax, Dtype::e4m3, 0, 3.0f, &fell_back), 3.0f);
  EXPECT_TRUE(fell_back);
  EXPECT_EQ(calibrated_scale(2.0f, Dtype::e4m3, 0, 3.0f, &fell_back), 224.0f);
  EXPECT_FALSE(fell_back);
  EXPECT_EQ(calibrated_scale(2.0f, Dtype::e5m2, 2, 3.0f, &fell_back), 57344.0f / 2.0f / 4.0f);
}

// One BF16 linear layer [16 -> 16] on the CPU backend behind the observing backend.
struct ObservedLayer {
  static constexpr int64_t N = 16, C = 16, OC = 16;
  std::unique_ptr<ObservingBackend> backend = std::make_unique<ObservingBackend>(make_cpu_backend());
  LinearExecution exec;
  int64_t fp8_gemms = 0, other_gemms = 0;
  std::unique_ptr<WeightCopy> copy;
  std::vector<float> x = std::vector<float>(N * C, 0.5f);
  std::vector<float> w = std::vector<float>(OC * C, 0.25f);
  std::vector<float> dout = std::vector<float>(N * OC, 1.0f / 1024.0f);
  std::vector<float> out = std::vector<float>(N * OC), dinp = std::vector<float>(N * C),
                     dweight = std::vector<float>(OC * C);

  ObservedLayer() {
    x[3 * C + 5] = -6.0f;
    w[7] = -0.75f;
    dout[40] = 3.0f;
    exec.forward = exec.input_gradient = exec.weight_gradient = GemmMode::bf16;
    exec.fp8_gemms = &fp8_gemms;
    exec.other_gemms = &other_gemms;
    backend->prepare_weight(copy, w.data(), OC, C, exec);
  }
  void forward() {
    backend->linear_forward(TensorView(out.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                            ConstTensorView(w.data(), {OC, C}), copy.get(), {}, exec, {});
  }
  void backward(LinearExecution& e) {
    backend->linear_backward(TensorView(dinp.data(), {N, C}), TensorView(dweight.data(), {OC, C}), nullptr,
                             ConstTensorView(dout.data(), {N, OC}), ConstTensorView(x.data(), {N, C}),
                             ConstTensorView(w.data(), {OC, C}), copy.get(), e, nullptr, {});
  }
};

TEST(ObservingBackend, PlantedOperandsOfALinearLayer) {
  ObservedLayer layer;
  layer.backend->watch(&layer.exec, "planted");
  layer.backend->begin_batch();
  layer.forward();
  layer.backward(layer.exec);
  layer.backend->add_weight(&layer.exec,
                            ConstTensorView(layer.w.data(), {ObservedLayer::OC, ObservedLayer::C}));
  const std::array<OperandStatistics, 3> s = layer.backend->statistics("planted");
  const OperandStatistics& a = s[static_cast<size_t>(OperandIndex::activation)];
  const OperandStatistics& w = s[static_cast<size_t>(OperandIndex::weight)];
  const OperandStatistics& g = s[static_cast<size_t>(OperandIndex::gradient)];
  EXPECT_EQ(a.values, 256);
  EXPECT_EQ(a.amax, 6.0f);
  EXPECT_EQ(a.p99, 0.5f) << "k = ceil(0.99 * 256) = 254: one of the 255 halves";
  EXPECT_EQ(a.p99_9, 6.0f) << "k = ceil(0.999 * 256) = 256: the planted 6";
  EXPECT_EQ(w.values, 256);
  EXPECT_EQ(w.amax, 0.75f);
  EXPECT_EQ(w.p99, 0.25f);
  EXPECT_EQ(g.values, 256);
  EXPECT_EQ(g.amax, 3.0f);
  EXPECT_EQ(g.p99, 1.0f / 1024.0f);
  // The ops still ran: the layer's output is the BF16 product (w[0][7] is the planted -0.75).
  EXPECT_EQ(layer.out[0], 15 * 0.5f * 0.25f - 0.5f * 0.75f);
  EXPECT_EQ(layer.other_gemms, 3);
}

TEST(ObservingBackend, CountsAForwardOnlyUntilAnotherLayersBackward) {
  ObservedLayer layer;
  LinearExecution other = layer.exec;  // another layer, not watched
  layer.backend->watch(&layer.exec, "planted");
  layer.backend->begin_batch();
  layer.forward();
  layer.backward(layer.exec);
  layer.forward();  // after its own backward only: a chunk of the LM head, counted
  layer.backward(other);
  layer.forward();  // after another layer's backward: a rerun, not counted
  auto s = layer.backend->statistics("planted");
  EXPECT_EQ(s[0].values, 512);
  EXPECT_EQ(s[1].values, 0) << "weights are added by add_weight only";
  EXPECT_EQ(s[2].values, 256);
  layer.backend->begin_batch();
  layer.forward();
  s = layer.backend->statistics("planted");
  EXPECT_EQ(s[0].values, 768);
}

// Keeps a copy of every linear layer's input in each forward and output gradient in each backward (on the
// host, the CPU backend's memory), beside the observing backend's histograms.
class RecordingBackend final : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string_view name() const override { return "recording cpu"; }
  struct Record {
    std::vector<float> inputs, gradients;
  };
  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override {
    append(records[&exec].inputs, inp);
    ForwardingBackend::linear_forward(out, inp, weight, copy, epilogue, exec, input);
  }
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override {
    append(records[&exec].gradients, dout);
    ForwardingBackend::linear_backward(dinp, dweight, dbias, dout, inp, weight, copy, exec, input, gradient);
  }
  std::map<const LinearExecution*, Record> records;

 private:
  static void append(std::vector<float>& to, const ConstTensorView& x) {
    ASSERT_EQ(x.dtype, Dtype::f32) << "the CPU backend keeps every tensor in float32";
    const float* f = static_cast<const float*>(x.data);
    to.insert(to.end(), f, f + x.numel());
  }
};

// The statistics of `values` computed here from the sorted magnitudes, independently of the histogram.
OperandStatistics sorted_statistics(const std::vector<float>& values) {
  OperandStatistics s;
  std::vector<float> magnitudes;
  for (const float v : values) {
    s.values += 1;
    if (v == 0.0f) {
      s.zeros += 1;
    } else if (!std::isfinite(v)) {
      s.non_finite += 1;
    } else {
      magnitudes.push_back(std::fabs(v));
    }
  }
  std::sort(magnitudes.begin(), magnitudes.end());
  if (magnitudes.empty()) return s;
  s.amax = magnitudes.back();
  auto quantile = [&](double q) {
    const auto k = static_cast<size_t>(std::ceil(q * static_cast<double>(magnitudes.size()) - 1e-9));
    const uint32_t bits = std::bit_cast<uint32_t>(magnitudes[std::max<size_t>(k, 1) - 1]);
    return std::bit_cast<float>(bits & ~((1u << 19) - 1u));  // the lower edge of its 1/16 bin
  };
  s.p99 = quantile(0.99);
  s.p99_9 = quantile(0.999);
  s.p99_99 = quantile(0.9999);
  return s;
}

struct ModelCase {
  const char* name;
  ModelConfig config;
  PrecisionSettings fp8;
};

Calibration calibrate_and_compare(const ModelCase& c, int64_t batches) {
  const int64_t B = 2, T = 16;
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  auto recording = std::make_unique<RecordingBackend>(*cpu);
  RecordingBackend* recorder = recording.get();
  ObservingBackend backend(std::move(recording));
  PrecisionSettings bf16 = c.fp8;
  bf16.mode = MixedPrecision::bf16;
  const std::unique_ptr<Model> model =
      make_model(c.config, backend, PrecisionPolicy(bf16, c.config, B * T), B, T);
  model->init_weights(7);
  PrecisionSettings fp8 = c.fp8;
  fp8.mode = MixedPrecision::fp8;
  fp8.recipe = RecipeKind::static_scale;
  const PrecisionPolicy fp8_policy(fp8, c.config, B * T);
  const BatchSource data = testing::pattern_stream(3, B, T, c.config.vocab_size);
  CalibrationPass pass;
  pass.batches = batches;
  pass.batch_size = B;
  pass.seq_len = T;
  pass.dloss = 1.0f / static_cast<float>(B * T);
  Calibration result;
  result.layers = calibrate_layers(*model, backend, fp8_policy, data, pass);

  std::map<std::string_view, const LinearExecution*> exec_of;
  std::map<std::string_view, int64_t> weight_offset;
  for (const Model::WeightCopySlot& slot : model->weight_copy_slots()) {
    exec_of[slot.layer] = slot.exec;
    weight_offset[slot.layer] = slot.offset;
  }
  int64_t calibrated = 0;
  for (const CalibratedLayer& l : result.layers) {
    SCOPED_TRACE(l.name);
    if (!l.excluded.empty()) {
      EXPECT_FALSE(fp8_policy.layer(l.name).fp8());
      continue;
    }
    ++calibrated;
    const RecordingBackend::Record& r = recorder->records.at(exec_of.at(l.name));
    // Under full activation checkpointing blocks run their forward again (all but the last): the recorded
    // inputs hold those reruns, which the observer leaves out; the comparison with a run without
    // checkpointing (below) covers the inputs there.
    const bool reruns = c.fp8.activation_checkpointing == ActivationCheckpointing::full;
    const std::vector<float>& inputs = r.inputs;
    const std::vector<float> weight(
        model->params() + weight_offset.at(l.name),
        model->params() + weight_offset.at(l.name) + l.in_features * l.out_features);
    const std::array<OperandStatistics, 3> want = {sorted_statistics(inputs), sorted_statistics(weight),
                                                   sorted_statistics(r.gradients)};
    for (size_t k = reruns ? 1 : 0; k < 3; ++k) {
      SCOPED_TRACE(std::string(kOperandNames[k]));
      const OperandStatistics& got = l.operands[k].statistics;
      EXPECT_EQ(got.values, want[k].values);
      EXPECT_EQ(got.zeros, want[k].zeros);
      EXPECT_EQ(got.non_finite, 0);
      EXPECT_EQ(got.amax, want[k].amax);
      EXPECT_EQ(got.p99, want[k].p99);
      EXPECT_EQ(got.p99_9, want[k].p99_9);
      EXPECT_EQ(got.p99_99, want[k].p99_99);
      const float fp8_max = k == 2 ? 57344.0f : 448.0f;
      if (want[k].amax > 0.0f) {
        EXPECT_GT(got.amax, 0.0f);
        EXPECT_EQ(l.operands[k].scale, static_cast<float>(static_cast<double>(fp8_max) / got.amax));
      }
    }
  }
  EXPECT_EQ(calibrated, fp8_policy.fp8_layer_count());
  EXPECT_GT(calibrated, 0);
  return result;
}

TEST(CalibrateLayers, Gpt2EveryFp8LayerAgainstItsRecordedOperands) {
  const Calibration c = calibrate_and_compare({"gpt2", testing::tiny_config(), {}}, 2);
  EXPECT_EQ(c.layers.back().name, "lm_head");
  EXPECT_EQ(c.layers.back().excluded, "excluded by config");
}

TEST(CalibrateLayers, MixtureOfExpertsWithItsExpertsInFp8) {
  PrecisionSettings s;
  s.experts = true;
  s.lm_head = true;
  const Calibration c = calibrate_and_compare({"moe", testing::tiny_moe_config(true), s}, 2);
  int64_t experts = 0;
  for (const CalibratedLayer& l : c.layers)
    experts += l.name.find(".experts.") != std::string::npos && l.excluded.empty();
  EXPECT_EQ(experts, 2 * 4 * 2) << "two blocks of four experts, each with two layers";
}

TEST(CalibrateLayers, FullActivationCheckpointingCountsEachForwardOnce) {
  PrecisionSettings s;
  s.activation_checkpointing = ActivationCheckpointing::full;
  const Calibration full = calibrate_and_compare({"llama", testing::tiny_llama_config(), s}, 2);
  const Calibration none = calibrate_and_compare({"llama", testing::tiny_llama_config(), {}}, 2);
  EXPECT_EQ(calibration_json(full), calibration_json(none));
}

}  // namespace
}  // namespace octet
