// Causal multi-head self-attention on the CPU, flash-style: the forward keeps only the softmax's log-sum-exp
// per row, and the backward recomputes the probabilities from it. Float32 arithmetic with float64 sums.
#include <cmath>
#include <vector>

#include "cpu_backend.h"
#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet::cpu {

void CpuBackend::attention_forward(float* out, float* lse, const float* qkv, const AttentionSizes& s,
                                   AttentionHeads heads) {
  const int64_t B = s.B, T = s.T, C = s.C, W = s.qkv_C, NH = heads.heads, hs = s.hs;
  // Query head h reads key and value head h / group: at column kv_at(h) of k's (and of v's) part of a row.
  auto kv_at = [&](int64_t h) { return h / heads.group() * hs; };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> scores(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * W + h * hs;
        float max = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (b * T + t2) * W + C + kv_at(h);
          float dot = 0.0f;
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          scores[static_cast<size_t>(t2)] = dot * scale;
          max = scores[static_cast<size_t>(t2)] > max ? scores[static_cast<size_t>(t2)] : max;
        }
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2)
          sum += std::exp(static_cast<double>(scores[static_cast<size_t>(t2)] - max));
        const double log_sum = std::log(sum);
        float* o = out + (b * T + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float p = static_cast<float>(
              std::exp(static_cast<double>(scores[static_cast<size_t>(t2)] - max) - log_sum));
          const float* v = qkv + (b * T + t2) * W + C + s.kv_C + kv_at(h);
          for (int64_t i = 0; i < hs; ++i) o[i] += p * v[i];
        }
        lse[(b * NH + h) * T + t] = max + static_cast<float>(log_sum);
      }
    }
  }
}

void CpuBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                    const float* lse, const AttentionSizes& s, AttentionHeads heads) {
  const int64_t B = s.B, T = s.T, C = s.C, W = s.qkv_C, NH = heads.heads, hs = s.hs;
  auto kv_at = [&](int64_t h) { return h / heads.group() * hs; };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  fill_zero(dqkv, B * T * W);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* q = qkv + (b * T + t) * W + h * hs;
        float* dq = dqkv + (b * T + t) * W + h * hs;
        const float* d = dout + (b * T + t) * C + h * hs;
        const float* o = out + (b * T + t) * C + h * hs;
        const float row_lse = lse[(b * NH + h) * T + t];
        float delta = 0.0f;  // sum_t2 p dp = dout . out
        for (int64_t i = 0; i < hs; ++i) delta += d[i] * o[i];
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (b * T + t2) * W + C + kv_at(h);
          const float* v = k + s.kv_C;
          float* dk = dqkv + (b * T + t2) * W + C + kv_at(h);
          float* dv = dk + s.kv_C;
          float dot = 0.0f, dp = 0.0f;
          for (int64_t i = 0; i < hs; ++i) {
            dot += q[i] * k[i];
            dp += d[i] * v[i];
          }
          const float p = std::exp(dot * scale - row_lse);
          const float ds = p * (dp - delta) * scale;
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
            dv[i] += p * d[i];
          }
        }
      }
    }
  }
}

}  // namespace octet::cpu
