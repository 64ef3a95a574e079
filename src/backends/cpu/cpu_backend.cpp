// CPU backend: memory, embeddings, LayerNorm, GELU, residuals, the loss, and the optimizer's ops.
#include "cpu_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "octet/backend/cpu_backend.h"
#include "octet/check.h"

namespace octet {

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<cpu::CpuBackend>();
}

namespace cpu {

CpuBuffer::CpuBuffer(size_t bytes) : bytes_(bytes) {
  // 64-byte alignment for vector loads; at least one byte so that the pointer is unique.
  data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, bytes);
}

CpuBuffer::~CpuBuffer() {
  std::free(data_);
}

std::unique_ptr<Buffer> CpuBackend::allocate(size_t bytes) {
  return std::make_unique<CpuBuffer>(bytes);
}
void CpuBackend::copy_to_host(void* host, const void* source, size_t bytes) {
  std::memcpy(host, source, bytes);
}
void CpuBackend::copy_from_host(void* destination, const void* host, size_t bytes) {
  std::memcpy(destination, host, bytes);
}
void CpuBackend::copy(void* destination, const void* source, size_t bytes) {
  std::memmove(destination, source, bytes);
}
void CpuBackend::fill_zero(float* x, int64_t n) {
  std::memset(x, 0, static_cast<size_t>(n) * sizeof(float));
}

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* table,
                                   const float* positions, int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* o = out + (b * T + t) * C;
      const float* e = table + static_cast<int64_t>(tokens[b * T + t]) * C;
      if (positions == nullptr) {
        for (int64_t i = 0; i < C; ++i) o[i] = e[i];
        continue;
      }
      const float* p = positions + t * C;
      for (int64_t i = 0; i < C; ++i) o[i] = e[i] + p[i];
    }
  }
}

void CpuBackend::embedding_backward(float* dtable, float* dpositions, const float* dout,
                                    const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* d = dout + (b * T + t) * C;
      float* e = dtable + static_cast<int64_t>(tokens[b * T + t]) * C;
      for (int64_t i = 0; i < C; ++i) e[i] += d[i];
      if (dpositions == nullptr) continue;
      float* p = dpositions + t * C;
      for (int64_t i = 0; i < C; ++i) p[i] += d[i];
    }
  }
}

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C) {
  const float eps = 1e-5f;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double sum = 0.0;
    for (int64_t i = 0; i < C; ++i) sum += x[i];
    const float m = static_cast<float>(sum / static_cast<double>(C));
    double var = 0.0;
    for (int64_t i = 0; i < C; ++i) var += static_cast<double>(x[i] - m) * (x[i] - m);
    const float s = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(C) + eps));
    float* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float* d = dout + n * C;
    const float* x = inp + n * C;
    const float m = mean[n], s = rstd[n];
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int64_t i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += static_cast<double>(dnorm) * norm;
    }
    const float a = static_cast<float>(dnorm_mean / static_cast<double>(C));
    const float b = static_cast<float>(dnorm_norm_mean / static_cast<double>(C));
    float* di = dinp + n * C;
    for (int64_t i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * d[i];
      dbias[i] += d[i];
      dweight[i] += norm * d[i];
      di[i] += (dnorm - a - norm * b) * s;
    }
  }
}

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                                 int64_t C) {
  const float eps = 1e-5f;
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double squares = 0.0;
    for (int64_t i = 0; i < C; ++i) squares += static_cast<double>(x[i]) * x[i];
    const float s = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(C) + eps));
    float* o = out + n * C;
    for (int64_t i = 0; i < C; ++i) o[i] = x[i] * s * weight[i];
    rstd[n] = s;
  }
}

void CpuBackend::rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                  const float* weight, const float* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float* d = dout + n * C;
    const float* x = inp + n * C;
    const float s = rstd[n];
    double dnorm_norm_mean = 0.0;
    for (int64_t i = 0; i < C; ++i) dnorm_norm_mean += static_cast<double>(weight[i] * d[i]) * (x[i] * s);
    const float b = static_cast<float>(dnorm_norm_mean / static_cast<double>(C));
    float* di = dinp + n * C;
    for (int64_t i = 0; i < C; ++i) {
      const float norm = x[i] * s;
      dweight[i] += norm * d[i];
      di[i] += (weight[i] * d[i] - norm * b) * s;
    }
  }
}

void CpuBackend::normalize(Normalization kind, float* out, float* mean, float* rstd, const float* inp,
                           const float* weight, const float* bias, int64_t N, int64_t C) {
  if (kind == Normalization::rmsnorm) return rmsnorm_forward(out, rstd, inp, weight, N, C);
  layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
}

void CpuBackend::activate(Activation kind, float* out, const float* inp, int64_t N, int64_t C) {
  if (kind == Activation::swiglu) return swiglu_forward(out, inp, N, C);
  gelu_forward(out, inp, N * C);
}

void CpuBackend::activate_backward(Activation kind, float* dinp, const float* inp, const float* dout,
                                   int64_t N, int64_t C) {
  if (kind == Activation::swiglu) return swiglu_backward(dinp, inp, dout, N, C);
  gelu_backward(dinp, inp, dout, N * C);
}

void CpuBackend::swiglu_forward(float* out, const float* inp, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float* gate = inp + n * 2 * C;
    const float* up = gate + C;
    for (int64_t i = 0; i < C; ++i) {
      const float g = gate[i];
      out[n * C + i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

void CpuBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const float* gate = inp + n * 2 * C;
    const float* up = gate + C;
    float* dgate = dinp + n * 2 * C;
    float* dup = dgate + C;
    for (int64_t i = 0; i < C; ++i) {
      const float g = gate[i], u = up[i], d = dout[n * C + i];
      const float sigmoid = 1.0f / (1.0f + std::exp(-g));
      const float silu = g * sigmoid;
      // Read both inputs before writing: dinp may alias inp.
      dgate[i] = d * u * (sigmoid * (1.0f + g * (1.0f - sigmoid)));
      dup[i] = d * silu;
    }
  }
}

// GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
static constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

void CpuBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}

void CpuBackend::add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void CpuBackend::softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N,
                                       int64_t V, int64_t Vp, float dloss) {
  // Exponentials in float32 (as the GPU computes them), their sum in float64.
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * Vp;
    float max = -INFINITY;
    for (int64_t v = 0; v < V; ++v) max = row[v] > max ? row[v] : max;
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
    const int64_t target = targets[n];
    const float log_sum = static_cast<float>(std::log(sum));
    losses[n] = log_sum - (row[target] - max);
    if (dloss != 0.0f) {
      const float inverse_sum = static_cast<float>(1.0 / sum);
      for (int64_t v = 0; v < V; ++v) row[v] = std::exp(row[v] - max) * inverse_sum * dloss;
      row[target] -= dloss;
      for (int64_t v = V; v < Vp; ++v) row[v] = 0.0f;
    }
  }
}

double CpuBackend::sum_of_squares(const ConstTensorView& tensor) {
  check_dtype("sum_of_squares", "x", tensor.dtype, {Dtype::f32});
  const float* x = tensor.f32();
  const int64_t n = tensor.numel();
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

bool CpuBackend::all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

void CpuBackend::scale(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void CpuBackend::optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                                  std::span<const UpdateSegment> segments) {
  check_segments(segments, false);
  for (const UpdateSegment& s : segments) {
    float* params = tensors.params + s.offset;
    AdamWStep scaled = step;
    scaled.learning_rate = step.learning_rate * s.learning_rate_scale;  // its parameter group's
    adamw_update(params, tensors.m + s.offset, tensors.v + s.offset, tensors.grads + s.grad_at(), s.count,
                 scaled, s.weight_decay);
    if (s.is_weight()) prepare_weight(*s.copy, params, s.rows, s.cols, *s.exec);
  }
}

void CpuBackend::adamw_update(float* params, float* m, float* v, const float* grads, int64_t n,
                              const AdamWStep& step, float weight_decay) {
  const float learning_rate = step.learning_rate, beta1 = step.beta1, beta2 = step.beta2, eps = step.eps;
  const float grad_scale = step.grad_scale;
  const float bias1 = 1.0f - std::pow(beta1, static_cast<float>(step.step));
  const float bias2 = 1.0f - std::pow(beta2, static_cast<float>(step.step));
  const float bias2_sqrt = std::sqrt(bias2);
  const float step_size = learning_rate / bias1;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i] * grad_scale;
    float p = params[i] * (1.0f - learning_rate * weight_decay);
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    p -= step_size * m[i] / denom;
    params[i] = p;
  }
}

}  // namespace cpu
}  // namespace octet
