// The CPU backend's mixture-of-experts routing ops (backend.h): the reference the GPU backend is held to,
// written as the formulas read, in float32 with float64 sums where an order must not matter.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "octet/check.h"

namespace octet::cpu {

namespace {

constexpr std::initializer_list<Dtype> kF32 = {Dtype::f32};

}  // namespace

void CpuBackend::top_k_softmax(const TensorView& probs, int32_t* experts, float* weights,
                               const ConstTensorView& logits, int64_t k) {
  check_dtype("top_k_softmax", "logits", logits.dtype, kF32);
  check_dtype("top_k_softmax", "probs", probs.dtype, kF32);
  const auto [N, E] = routing_sizes("top_k_softmax", logits.shape, k);
  check_shape("top_k_softmax", "probs", probs.shape, logits.shape);
  const float* z = logits.f32();
  float* p = probs.f32();
  for (int64_t n = 0; n < N; ++n) {
    const float* zr = z + n * E;
    float* pr = p + n * E;
    float max = zr[0];
    for (int64_t e = 1; e < E; ++e) max = std::max(max, zr[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      pr[e] = std::exp(zr[e] - max);
      sum += pr[e];
    }
    for (int64_t e = 0; e < E; ++e) pr[e] /= sum;
    // Selection by repeated maximum: the largest first, the lower index among equals.
    int32_t* chosen = experts + n * k;
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= chosen[i] == e;
        if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
      }
      chosen[j] = static_cast<int32_t>(best);
      total += pr[best];
    }
    for (int64_t j = 0; j < k; ++j) weights[n * k + j] = pr[chosen[j]] / total;
  }
}

void CpuBackend::top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs,
                                        const int32_t* experts, const float* weights, const float* dweights,
                                        int64_t k, const float* dprobs) {
  check_dtype("top_k_softmax_backward", "probs", probs.dtype, kF32);
  check_dtype("top_k_softmax_backward", "dlogits", dlogits.dtype, kF32);
  const auto [N, E] = routing_sizes("top_k_softmax_backward", probs.shape, k);
  check_shape("top_k_softmax_backward", "dlogits", dlogits.shape, probs.shape);
  const float* p = probs.f32();
  float* dz = dlogits.f32();
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* pr = p + n * E;
    const int32_t* chosen = experts + n * k;
    const float* w = weights + n * k;
    const float* dw = dweights + n * k;
    for (int64_t e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = dprobs != nullptr ? dprobs[e] : 0.0f;
    // w_j = p_j / S, S the chosen probabilities' sum: d p_j = (dw_j - sum_i dw_i w_i) / S.
    float total = 0.0f, weighted = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      total += pr[chosen[j]];
      weighted += dw[j] * w[j];
    }
    for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(chosen[j])] += (dw[j] - weighted) / total;
    // The softmax: dz_e = p_e (dp_e - sum_f p_f dp_f).
    float inner = 0.0f;
    for (int64_t e = 0; e < E; ++e) inner += pr[e] * dp[static_cast<size_t>(e)];
    for (int64_t e = 0; e < E; ++e) dz[n * E + e] = pr[e] * (dp[static_cast<size_t>(e)] - inner);
  }
}

void CpuBackend::group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts,
                                 int64_t N, int64_t k, int64_t E, int64_t align) {
  OCTET_CHECK(N >= 0 && k >= 1 && E >= k && align >= 1,
              "group_by_expert: N >= 0 tokens choosing 1 <= k <= E experts, aligned to >= 1 rows, given N = {}, "
              "k = {}, E = {}, align = {}",
              N, k, E, align);
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  for (int64_t a = 0; a < N * k; ++a) {
    OCTET_CHECK(experts[a] >= 0 && experts[a] < E, "group_by_expert: assignment {} chooses expert {} of {}", a,
                experts[a], E);
    ++counts[static_cast<size_t>(experts[a])];
  }
  std::vector<int64_t> next(static_cast<size_t>(E));
  int64_t at = 0;
  for (int64_t e = 0; e < E; ++e) {
    offsets[e] = static_cast<int32_t>(at);
    next[static_cast<size_t>(e)] = at;
    at += (counts[static_cast<size_t>(e)] + align - 1) / align * align;
  }
  offsets[E] = static_cast<int32_t>(at);
  std::fill(slots, slots + grouped_rows(N, k, E, align), -1);
  for (int64_t a = 0; a < N * k; ++a) {
    const int64_t row = next[static_cast<size_t>(experts[a])]++;
    slots[row] = static_cast<int32_t>(a);
    positions[a] = static_cast<int32_t>(row);
  }
}

void CpuBackend::gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                             int64_t divisor, const float* scale, const Fp8CastTarget& cast_for,
                             TensorRole cast_as) {
  check_dtype("gather_rows", "out", out.dtype, kF32);
  check_dtype("gather_rows", "src", src.dtype, kF32);
  const int64_t M = out.rows(), C = out.cols(), R = src.rows();
  check_matrix("gather_rows", "src", src.shape, R, C);
  OCTET_CHECK(divisor >= 1, "gather_rows: the divisor is at least 1, given {}", divisor);
  const float* s = src.f32();
  // With a cast target, the rows are gathered (into scratch where out has no data), then cast.
  std::vector<float> scratch;
  float* o = out.f32();
  if (cast_for.given()) {
    const bool suffices = cast_as == TensorRole::activation ? input_cast_suffices(*cast_for.layer)
                                                            : gradient_cast_suffices(*cast_for.layer);
    OCTET_CHECK(o != nullptr || suffices, "gather_rows: the rows kept for a consumer that reads them");
    if (o == nullptr) {
      scratch.resize(static_cast<size_t>(M * C));
      o = scratch.data();
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    float* row = o + m * C;
    const int64_t i = index[m];
    if (i < 0) {
      std::fill(row, row + C, 0.0f);
      continue;
    }
    const int64_t r = i / divisor;
    OCTET_CHECK(r < R, "gather_rows: row {} reads source row {} of {}", m, r, R);
    const float f = scale != nullptr ? scale[i] : 1.0f;
    for (int64_t c = 0; c < C; ++c) row[c] = f * s[r * C + c];
  }
  if (cast_for.given()) cast_produced(o, M, C, *cast_for.layer, cast_as, cast_for.tensor);
}

void CpuBackend::combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                              const int32_t* positions, int64_t k, const float* weights) {
  check_dtype("combine_rows", "out", out.dtype, kF32);
  check_dtype("combine_rows", "src", src.dtype, kF32);
  const int64_t R = out.rows(), C = out.cols(), M = src.rows();
  check_matrix("combine_rows", "src", src.shape, M, C);
  const float* s = src.f32();
  float* o = out.f32();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      float sum = base != nullptr ? base[r * C + c] : 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t m = positions[r * k + j];
        const float w = weights != nullptr ? weights[r * k + j] : 1.0f;
        sum += w * s[m * C + c];
      }
      o[r * C + c] = sum;
    }
  }
}

void CpuBackend::scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) {
  check_dtype("scatter_rows", "out", out.dtype, kF32);
  check_dtype("scatter_rows", "src", src.dtype, kF32);
  const int64_t R = out.rows(), C = out.cols(), M = src.rows();
  check_matrix("scatter_rows", "src", src.shape, M, C);
  const float* s = src.f32();
  float* o = out.f32();
  for (int64_t m = 0; m < M; ++m) {
    const int64_t r = index[m];
    OCTET_CHECK(r >= 0 && r < R, "scatter_rows: row {} goes to row {} of {}", m, r, R);
    std::copy(s + m * C, s + (m + 1) * C, o + r * C);
  }
}

void CpuBackend::row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src,
                          const int32_t* positions, int64_t k) {
  check_dtype("row_dots", "a", a.dtype, kF32);
  check_dtype("row_dots", "src", src.dtype, kF32);
  const int64_t R = a.rows(), C = a.cols(), M = src.rows();
  check_matrix("row_dots", "src", src.shape, M, C);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const float* x = a.f32() + r * C;
      const float* y = src.f32() + static_cast<int64_t>(positions[r * k + j]) * C;
      float sum = 0.0f;
      for (int64_t c = 0; c < C; ++c) sum += x[c] * y[c];
      out[r * k + j] = sum;
    }
  }
}

void CpuBackend::column_sums(float* out, const ConstTensorView& x) {
  check_dtype("column_sums", "x", x.dtype, kF32);
  const int64_t N = x.rows(), C = x.cols();
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += x.f32()[n * C + c];
    out[c] = static_cast<float>(sum);
  }
}

}  // namespace octet::cpu
