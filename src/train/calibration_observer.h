// What `octet calibrate` measures, and where: a histogram of magnitudes that keeps an operand's amax exactly
// and its upper percentiles to 1/16 in bounded memory, and a backend that runs every op on another backend
// unchanged while it counts the operands of the linear layers it watches (input, weight, output gradient)
// into their histograms, where the operands are (Backend::count_magnitudes: on the device for a GPU). Internal to the engine (src/train/calibration_run.cpp and the
// tests).
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/model/calibration.h"
#include "octet/model/model.h"

namespace octet {

// Counts of float32 magnitudes in bins of 16 per power of two (MagnitudeCounts, backend.h: the exponent and
// the top four mantissa bits of |x|), with the exact amax and the numbers of zeros and of Inf and NaN beside
// them: 32 KiB whatever it is fed. OperandStatistics (calibration.h) says how its percentiles are read.
class MagnitudeHistogram {
 public:
  void add(std::span<const float> values) { counts_.add(values); }
  // Counts a backend made (Backend::count_magnitudes).
  void add(const MagnitudeCounts& counts) { counts_.add(counts); }
  OperandStatistics statistics() const;
  // The q-quantile of the finite non-zero magnitudes, q = numerator / denominator: the lower edge of the bin
  // of the k-th smallest, k = ceil(q * count); 0 when there are none.
  float percentile(int64_t numerator, int64_t denominator) const;

  static constexpr int kMantissaBits = MagnitudeCounts::kMantissaBits;
  static constexpr size_t kBins = MagnitudeCounts::kBins;

 private:
  MagnitudeCounts counts_;
};

// Runs every op on `inner`; for the linear layers it is told to watch, adds the values of each forward's
// input and each backward's output gradient to the layer's histograms (and its weight when told). A forward
// that runs again after the backward has begun (full activation checkpointing reruns a block's forward before
// its backward) is not counted twice: a layer's forward counts only while no other layer's backward has run
// since begin_batch. The LM head's chunks, whose backward runs between its own forwards, all count.
class ObservingBackend final : public Backend {
 public:
  explicit ObservingBackend(std::unique_ptr<Backend> inner);
  // Runs every op on `inner`, which it does not own and which must outlive it (a run's own backend, which a
  // recalibration in the run observes through a second model: src/train/shadow_check.h).
  explicit ObservingBackend(Backend& inner);

  // Watch the layer whose ops take `exec`, under `name`.
  void watch(const LinearExecution* exec, std::string name);
  void begin_batch() { backward_seen_.clear(); }
  // Watches nothing any more, and forgets what was observed.
  void clear_watched() {
    watched_.clear();
    backward_seen_.clear();
  }
  // Adds the values of a watched layer's weight [OC, C] (in this backend's memory) to its histogram: once,
  // since calibrating changes no weight; also for an expert that no token chose.
  void add_weight(const LinearExecution* exec, const ConstTensorView& weight);
  // The statistics of a watched layer's activation, weight and gradient (OperandIndex order).
  std::array<OperandStatistics, 3> statistics(const std::string& name) const;
  Backend& inner() { return *inner_; }

  std::string_view name() const override { return inner_->name(); }
  void synchronize() override { inner_->synchronize(); }
  void fetch_scaling(Fp8LinearState& state) override { inner_->fetch_scaling(state); }
  void publish_scaling(const Fp8LinearState& state) override { inner_->publish_scaling(state); }
  void fetch_telemetry(Fp8LinearTelemetry& telemetry) override { inner_->fetch_telemetry(telemetry); }
  void set_op_timing(bool on) override { inner_->set_op_timing(on); }
  OpTimes take_op_times() override { return inner_->take_op_times(); }
  FusionSupport supports(Fusion fusion, const LinearExecution& layer) const override {
    return inner_->supports(fusion, layer);
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void copy_to_host(void* host, const void* source, size_t bytes) override {
    inner_->copy_to_host(host, source, bytes);
  }
  void copy_from_host(void* destination, const void* host, size_t bytes) override {
    inner_->copy_from_host(destination, host, bytes);
  }
  void fill_zero(float* x, int64_t n) override { inner_->fill_zero(x, n); }
  void fill_zero_ranges(float* x, std::span<const Range> ranges) override {
    inner_->fill_zero_ranges(x, ranges);
  }
  void embedding_forward(const TensorView& out, const int32_t* tokens, const ConstTensorView& table,
                         const ConstTensorView& positions) override {
    inner_->embedding_forward(out, tokens, table, positions);
  }
  void embedding_backward(const TensorView& dtable, const TensorView& dpositions, const ConstTensorView& dout,
                          const int32_t* tokens) override {
    inner_->embedding_backward(dtable, dpositions, dout, tokens);
  }
  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             const Fp8CastTarget& cast_for) override {
    inner_->normalization_forward(kind, out, mean, rstd, inp, weight, bias, cast_for);
  }
  void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                              const ConstTensorView& dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd) override {
    inner_->normalization_backward(kind, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
  }
  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override {
    inner_->prepare_weight(copy, weight, OC, C, exec);
  }
  void weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) override {
    inner_->weight_part_amaxes(parts, amaxes);
  }
  void cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) override {
    inner_->cast_weight_parts(parts, amaxes, codes);
  }
  void weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) override {
    inner_->weight_copies_from_codes(parts, codes);
  }
  void weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) override {
    inner_->weight_part_codes(parts, codes);
  }
  void release_weight_copies(std::span<const WeightPart> parts) override {
    inner_->release_weight_copies(parts);
  }
  void copy(void* destination, const void* source, size_t bytes) override {
    inner_->copy(destination, source, bytes);
  }

  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override;
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) override {
    inner_->linear_recompute(out, weight, copy, epilogue, exec, input);
  }
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override;
  Dtype storage_type(const StorageQuery& query) const override { return inner_->storage_type(query); }
  void attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                         AttentionHeads heads) override {
    inner_->attention_forward(out, lse, qkv, heads);
  }
  void attention_backward(const TensorView& dqkv, const ConstTensorView& dout, const ConstTensorView& qkv,
                          const ConstTensorView& out, const float* lse, AttentionHeads heads) override {
    inner_->attention_backward(dqkv, dout, qkv, out, lse, heads);
  }
  void rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                        bool inverse) override {
    inner_->rotary_embedding(x, table, heads, inverse);
  }
  void top_k_softmax(const TensorView& probs, int32_t* experts, float* weights, const ConstTensorView& logits,
                     int64_t k) override {
    inner_->top_k_softmax(probs, experts, weights, logits, k);
  }
  void top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs, const int32_t* experts,
                              const float* weights, const float* dweights, int64_t k,
                              const float* dprobs) override {
    inner_->top_k_softmax_backward(dlogits, probs, experts, weights, dweights, k, dprobs);
  }
  void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts,
                       int64_t N, int64_t k, int64_t E, int64_t align) override {
    inner_->group_by_expert(offsets, slots, positions, experts, N, k, E, align);
  }
  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override {
    inner_->gather_rows(out, src, index, divisor, scale, cast_for, cast_as);
  }
  void combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                    const int32_t* positions, int64_t k, const float* weights) override {
    inner_->combine_rows(out, base, src, positions, k, weights);
  }
  void scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) override {
    inner_->scatter_rows(out, src, index);
  }
  void row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src, const int32_t* positions,
                int64_t k) override {
    inner_->row_dots(out, a, src, positions, k);
  }
  void column_sums(float* out, const ConstTensorView& x) override { inner_->column_sums(out, x); }
  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override {
    inner_->activation_forward(kind, out, inp, cast_for);
  }
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias,
                           const Fp8CastTarget& cast_for) override {
    inner_->activation_backward(kind, dinp, inp, dout, dbias, cast_for);
  }
  void gather_rows_grouped(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                           int64_t divisor, const float* scale, const RowGroupCasts& casts,
                           TensorRole cast_as) override {
    inner_->gather_rows_grouped(out, src, index, divisor, scale, casts, cast_as);
  }
  void activation_forward_grouped(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                  const RowGroupCasts& casts) override {
    inner_->activation_forward_grouped(kind, out, inp, casts);
  }
  void activation_backward_grouped(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                   const ConstTensorView& dout, const RowGroupCasts& casts) override {
    inner_->activation_backward_grouped(kind, dinp, inp, dout, casts);
  }
  void add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) override {
    inner_->add(out, a, b);
  }
  void round_in_place(float* x, int64_t n, Dtype dtype) override { inner_->round_in_place(x, n, dtype); }
  void softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets, int64_t V,
                             float dloss) override {
    inner_->softmax_cross_entropy(losses, logits, targets, V, dloss);
  }
  double sum_of_squares(const ConstTensorView& x) override { return inner_->sum_of_squares(x); }
  bool all_finite(const float* x, int64_t n) override { return inner_->all_finite(x, n); }
  void scale(float* x, int64_t n, float factor) override { inner_->scale(x, n, factor); }
  void optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                        std::span<const UpdateSegment> segments) override {
    inner_->optimizer_update(step, tensors, segments);
  }

 private:
  struct Watched {
    std::string name;
    std::array<MagnitudeHistogram, 3> histograms;  // OperandIndex order
  };
  // The values of a float32 or bf16 tensor in backend memory, as float32 on the host.
  // Adds x's magnitudes to `histogram`, counted by the inner backend where x is.
  void count(MagnitudeHistogram& histogram, const ConstTensorView& x);

  std::unique_ptr<Backend> owned_;  // null where the inner backend is not this one's
  Backend* inner_;
  std::map<const LinearExecution*, Watched> watched_;
  std::set<const LinearExecution*> backward_seen_;  // layers whose backward ran since begin_batch
};

// How calibrate_layers runs its batches and turns statistics into scales.
struct CalibrationPass {
  int64_t batches = 8;
  int64_t batch_size = 1;  // B
  int64_t seq_len = 1;     // T
  float dloss = 1.0f;      // the gradient of the loss the backward starts from (1 / (B T accumulation))
  CalibrationStatistic statistic = CalibrationStatistic::amax;
  int margin = 0;
  float fallback_scale = 1.0f;  // for an operand whose statistic is 0
  std::FILE* out = nullptr;     // a line per batch; null: none
};

// Watches the layers that `fp8_policy` runs in FP8 of `model` (which runs its ops on `backend`), runs
// pass.batches batches from `next_batch` (tokens and targets, B x T each) forward and backward, and returns
// every layer of fp8_policy with its operands' statistics and scales (or why it is excluded).
std::vector<CalibratedLayer> calibrate_layers(Model& model, ObservingBackend& backend,
                                              const PrecisionPolicy& fp8_policy,
                                              const std::function<void(int32_t*, int32_t*)>& next_batch,
                                              const CalibrationPass& pass);

}  // namespace octet
