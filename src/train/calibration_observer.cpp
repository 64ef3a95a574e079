// See calibration_observer.h.
#include "calibration_observer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

float MagnitudeHistogram::percentile(int64_t numerator, int64_t denominator) const {
  const int64_t count = counts_.values - counts_.zeros - counts_.non_finite;
  if (count == 0) return 0.0f;
  // k = ceil(count * numerator / denominator), without the product overflowing.
  const int64_t k =
      count / denominator * numerator + (count % denominator * numerator + denominator - 1) / denominator;
  uint64_t seen = 0;
  for (size_t bin = 0; bin < kBins; ++bin) {
    seen += counts_.bins[bin];
    if (seen >= static_cast<uint64_t>(std::max<int64_t>(k, 1))) {
      return std::bit_cast<float>(static_cast<uint32_t>(bin << (23 - kMantissaBits)));
    }
  }
  return counts_.amax;
}

OperandStatistics MagnitudeHistogram::statistics() const {
  OperandStatistics s;
  s.values = counts_.values;
  s.zeros = counts_.zeros;
  s.non_finite = counts_.non_finite;
  s.amax = counts_.amax;
  s.p99 = percentile(99, 100);
  s.p99_9 = percentile(999, 1000);
  s.p99_99 = percentile(9999, 10000);
  return s;
}

ObservingBackend::ObservingBackend(std::unique_ptr<Backend> inner)
    : owned_(std::move(inner)), inner_(owned_.get()) {
  OCTET_CHECK(inner_ != nullptr, "a backend to run the ops on");
}

ObservingBackend::ObservingBackend(Backend& inner) : inner_(&inner) {}

void ObservingBackend::watch(const LinearExecution* exec, std::string name) {
  watched_[exec].name = std::move(name);
}

std::array<OperandStatistics, 3> ObservingBackend::statistics(const std::string& name) const {
  for (const auto& [exec, w] : watched_) {
    if (w.name == name)
      return {w.histograms[0].statistics(), w.histograms[1].statistics(), w.histograms[2].statistics()};
  }
  OCTET_CHECK(false, "a watched layer named {}", name);
  return {};
}

void ObservingBackend::count(MagnitudeHistogram& histogram, const ConstTensorView& x) {
  if (x.numel() == 0) return;  // an expert that no token chose
  OCTET_CHECK(x.has_data(), "the values of a watched layer's operand, got a view without data");
  MagnitudeCounts counts;
  inner_->count_magnitudes(counts, x);
  histogram.add(counts);
}

void ObservingBackend::linear_forward(const TensorView& out, const ConstTensorView& inp,
                                      const ConstTensorView& weight, const WeightCopy* copy,
                                      const Epilogue& epilogue, LinearExecution& exec,
                                      const Fp8Operand& input) {
  inner_->linear_forward(out, inp, weight, copy, epilogue, exec, input);
  const auto it = watched_.find(&exec);
  if (it == watched_.end()) return;
  Watched& w = it->second;
  const bool rerun = std::any_of(backward_seen_.begin(), backward_seen_.end(),
                                 [&](const LinearExecution* e) { return e != &exec; });
  if (!rerun) count(w.histograms[static_cast<size_t>(OperandIndex::activation)], inp);
}

void ObservingBackend::add_weight(const LinearExecution* exec, const ConstTensorView& weight) {
  const auto it = watched_.find(exec);
  OCTET_CHECK(it != watched_.end(), "the weight of a watched layer");
  count(it->second.histograms[static_cast<size_t>(OperandIndex::weight)], weight);
}

void ObservingBackend::linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                                       const ConstTensorView& dout, const ConstTensorView& inp,
                                       const ConstTensorView& weight, const WeightCopy* copy,
                                       LinearExecution& exec, const Fp8Tensor* input,
                                       const Fp8Operand& gradient) {
  backward_seen_.insert(&exec);
  const auto it = watched_.find(&exec);
  // dout is read before the op runs, so that nothing the op writes can have changed it.
  if (it != watched_.end()) {
    count(it->second.histograms[static_cast<size_t>(OperandIndex::gradient)], dout);
  }
  inner_->linear_backward(dinp, dweight, dbias, dout, inp, weight, copy, exec, input, gradient);
}

}  // namespace octet
