// See calibration_observer.h.
#include "calibration_observer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet {

void MagnitudeHistogram::add(std::span<const float> values) {
  values_ += static_cast<int64_t>(values.size());
  for (const float v : values) {
    const uint32_t magnitude = std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu;
    if (magnitude == 0) {
      ++zeros_;
      continue;
    }
    if (magnitude >= 0x7F800000u) {  // Inf and NaN
      ++non_finite_;
      continue;
    }
    if (bins_.empty()) bins_.assign(kBins, 0);
    ++bins_[magnitude >> (23 - kMantissaBits)];
    amax_ = std::max(amax_, std::bit_cast<float>(magnitude));
  }
}

float MagnitudeHistogram::percentile(int64_t numerator, int64_t denominator) const {
  const int64_t count = values_ - zeros_ - non_finite_;
  if (count == 0) return 0.0f;
  // k = ceil(count * numerator / denominator), without the product overflowing.
  const int64_t k =
      count / denominator * numerator + (count % denominator * numerator + denominator - 1) / denominator;
  uint64_t seen = 0;
  for (size_t bin = 0; bin < bins_.size(); ++bin) {
    seen += bins_[bin];
    if (seen >= static_cast<uint64_t>(std::max<int64_t>(k, 1))) {
      return std::bit_cast<float>(static_cast<uint32_t>(bin << (23 - kMantissaBits)));
    }
  }
  return amax_;
}

OperandStatistics MagnitudeHistogram::statistics() const {
  OperandStatistics s;
  s.values = values_;
  s.zeros = zeros_;
  s.non_finite = non_finite_;
  s.amax = amax_;
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

std::vector<float> ObservingBackend::host_values(const ConstTensorView& x) {
  const auto n = static_cast<size_t>(x.numel());
  if (n == 0) return {};  // an expert that no token chose
  OCTET_CHECK(x.has_data(), "the values of a watched layer's operand, got a view without data");
  std::vector<float> values(n);
  if (x.dtype == Dtype::f32) {
    inner_->copy_to_host(values.data(), x.data, n * sizeof(float));
    return values;
  }
  OCTET_CHECK(x.dtype == Dtype::bf16, "a watched operand in f32 or bf16, got {}", dtype_name(x.dtype));
  std::vector<uint16_t> bits(n);
  inner_->copy_to_host(bits.data(), x.data, n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) values[i] = std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16);
  return values;
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
  if (!rerun) w.histograms[static_cast<size_t>(OperandIndex::activation)].add(host_values(inp));
}

void ObservingBackend::add_weight(const LinearExecution* exec, const ConstTensorView& weight) {
  const auto it = watched_.find(exec);
  OCTET_CHECK(it != watched_.end(), "the weight of a watched layer");
  it->second.histograms[static_cast<size_t>(OperandIndex::weight)].add(host_values(weight));
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
    it->second.histograms[static_cast<size_t>(OperandIndex::gradient)].add(host_values(dout));
  }
  inner_->linear_backward(dinp, dweight, dbias, dout, inp, weight, copy, exec, input, gradient);
}

}  // namespace octet
