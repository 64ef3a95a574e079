// CPU emulation of Hopper's FP8 GEMM (see fp8_gemm.h for the contract).
#include "octet/numerics/fp8_gemm.h"

#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"

#if defined(OCTET_HAVE_BLAS)
#include <cblas.h>
#endif

namespace octet {

bool blas_available() {
#if defined(OCTET_HAVE_BLAS)
  return true;
#else
  return false;
#endif
}

// The K extent over which one scale of `q` stays constant: K for per-tensor scales, else the block width.
static int64_t k_block(const QuantizedTensor& q) {
  const BlockShape bs = block_shape(q.granularity);
  return bs.cols == 0 ? q.cols : bs.cols;
}

std::string fp8_gemm_can_implement(const Fp8GemmArguments& args) {
  if (args.a == nullptr || args.b == nullptr) return "both operands A and B are required";
  const QuantizedTensor& a = *args.a;
  const QuantizedTensor& b = *args.b;
  if (!is_fp8(a.format) || !is_fp8(b.format)) {
    return fmt::format("operands must be e4m3 or e5m2, got {} x {}", dtype_name(a.format),
                       dtype_name(b.format));
  }
  if (a.format == Dtype::e5m2 && b.format == Dtype::e5m2) {
    return "e5m2 x e5m2 is not an FP8 GEMM Hopper supports (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3 are)";
  }
  if (a.cols != b.cols) {
    return fmt::format("A is [{}, {}] and B is [{}, {}]: both must be K-major with the same K", a.rows,
                       a.cols, b.rows, b.cols);
  }
  if (a.rows < 1 || b.rows < 1 || a.cols < 1) {
    return fmt::format("M, N and K must be at least 1, got M={} N={} K={}", a.rows, b.rows, a.cols);
  }
  for (const QuantizedTensor* q : {&a, &b}) {
    if (static_cast<int64_t>(q->data.size()) != q->rows * q->cols) {
      return fmt::format("an operand of shape [{}, {}] holds {} codes", q->rows, q->cols, q->data.size());
    }
  }
  const bool a_blocked = a.granularity != ScaleGranularity::per_tensor;
  const bool b_blocked = b.granularity != ScaleGranularity::per_tensor;
  if (a_blocked != b_blocked || (a_blocked && k_block(a) != k_block(b))) {
    return fmt::format(
        "scale layouts {} x {} do not pair: both per-tensor, or both blocked with the same K block",
        granularity_name(a.granularity), granularity_name(b.granularity));
  }
  if (args.beta != 0.0f && static_cast<int64_t>(args.c.size()) != a.rows * b.rows) {
    return fmt::format("beta is {} but C holds {} values, not M*N = {}", args.beta, args.c.size(),
                       a.rows * b.rows);
  }
  if (args.output != Dtype::f32 && args.output != Dtype::bf16 && !is_fp8(args.output)) {
    return fmt::format("output must be f32, bf16, e4m3 or e5m2, got {}", dtype_name(args.output));
  }
  if (is_fp8(args.output) && !(args.output_scale > 0.0f && std::isfinite(args.output_scale))) {
    return fmt::format("an FP8 output needs a positive finite output scale, got {}", args.output_scale);
  }
  if (args.accumulation == GemmAccumulation::blas && !blas_available()) {
    return "BLAS accumulation requested but octet was built without a BLAS";
  }
  return {};
}

std::vector<float> reference_gemm_f32(std::span<const float> a, std::span<const float> b, int64_t m,
                                      int64_t n, int64_t k) {
  OCTET_CHECK(static_cast<int64_t>(a.size()) == m * k && static_cast<int64_t>(b.size()) == n * k,
              "A [{}, {}] and B [{}, {}], got {} and {} values", m, k, n, k, a.size(), b.size());
  std::vector<float> d(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        acc += a[static_cast<size_t>(i * k + p)] * b[static_cast<size_t>(j * k + p)];
      d[static_cast<size_t>(i * n + j)] = acc;
    }
  }
  return d;
}

// D before the output conversion, with the fixed reduction order of the reference.
static std::vector<float> accumulate_reference(const Fp8GemmArguments& args) {
  const QuantizedTensor& a = *args.a;
  const QuantizedTensor& b = *args.b;
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  const int64_t chunk = k_block(a);
  const bool blocked = a.granularity != ScaleGranularity::per_tensor;
  // Decode once; FP8 x FP8 products are exact in float32, so only the additions round.
  std::vector<float> av(a.data.size()), bv(b.data.size());
  const MinifloatSpec sa = minifloat_spec(a.format), sb = minifloat_spec(b.format);
  for (size_t i = 0; i < av.size(); ++i) av[i] = decode(sa, a.data[i]);
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = decode(sb, b.data[i]);

  std::vector<float> d(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < k; k0 += chunk) {
        const int64_t k1 = std::min(k, k0 + chunk);
        float partial = 0.0f;
        for (int64_t p = k0; p < k1; ++p) {
          partial += av[static_cast<size_t>(i * k + p)] * bv[static_cast<size_t>(j * k + p)];
        }
        // Blocked: promote each block's partial sum with its two scales.
        acc += blocked ? partial * (a.scale_inv_at(i, k0) * b.scale_inv_at(j, k0)) : partial;
      }
      const float scaled = blocked ? args.alpha * acc : (args.alpha * a.scale_inv[0] * b.scale_inv[0]) * acc;
      d[static_cast<size_t>(i * n + j)] =
          args.beta != 0.0f ? scaled + args.beta * args.c[static_cast<size_t>(i * n + j)] : scaled;
    }
  }
  return d;
}

static std::vector<float> accumulate_blas(const Fp8GemmArguments& args) {
  const QuantizedTensor& a = *args.a;
  const QuantizedTensor& b = *args.b;
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  std::vector<float> d(static_cast<size_t>(m * n));
#if defined(OCTET_HAVE_BLAS)
  const std::vector<float> af = dequantize(a), bf = dequantize(b);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), args.alpha, af.data(), static_cast<int>(k), bf.data(), static_cast<int>(k),
              0.0f, d.data(), static_cast<int>(n));
  if (args.beta != 0.0f) {
    for (size_t i = 0; i < d.size(); ++i) d[i] += args.beta * args.c[i];
  }
#else
  (void)m;
  (void)n;
  (void)k;
  OCTET_CHECK(false, "BLAS accumulation in a build without a BLAS");
#endif
  return d;
}

GemmOutput fp8_gemm(const Fp8GemmArguments& args) {
  const std::string reason = fp8_gemm_can_implement(args);
  OCTET_REQUIRE(reason.empty(), "fp8 gemm: {}", reason);
  std::vector<float> d =
      args.accumulation == GemmAccumulation::blas ? accumulate_blas(args) : accumulate_reference(args);

  GemmOutput out;
  out.dtype = args.output;
  out.rows = args.a->rows;
  out.cols = args.b->rows;
  out.amax = compute_amax(d);
  if (args.output == Dtype::f32) {
    out.values = std::move(d);
    return out;
  }
  out.codes.resize(d.size());
  out.values.resize(d.size());
  if (args.output == Dtype::bf16) {
    for (size_t i = 0; i < d.size(); ++i) {
      out.codes[i] = float_to_bf16(d[i]);
      out.values[i] = bf16_to_float(out.codes[i]);
    }
    return out;
  }
  const MinifloatSpec spec = minifloat_spec(args.output);
  const float scale_inv = 1.0f / args.output_scale;
  const CastOptions options;
  for (size_t i = 0; i < d.size(); ++i) {
    out.codes[i] = cast_scaled(d[i] * args.output_scale, args.output, options, i, out.stats);
    out.values[i] = decode(spec, out.codes[i]) * scale_inv;
  }
  return out;
}

}  // namespace octet
