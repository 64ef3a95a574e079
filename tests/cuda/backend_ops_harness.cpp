// See backend_ops_harness.h.
#include "backend_ops_harness.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "octet/backend/cpu_backend.h"
#include "octet/backend/cuda_backend.h"
#include "octet/backend/cuda_registration.h"
#include "random.h"

namespace octet::testing::backend_ops {

std::vector<const BackendFactory*> tested_backends() {
  register_cuda_backend();
  std::vector<const BackendFactory*> tested;
  for (const BackendFactory* factory : registered_backends()) {
    if (factory->name() != "cpu" && factory->device_count() > 0) tested.push_back(factory);
  }
  return tested;
}

bool tested_backend_available() {
  return cuda_device_count() > 0 && !tested_backends().empty();
}
std::unique_ptr<Backend> make_tested_backend() {
  return make_cuda_backend();
}
std::unique_ptr<Backend> make_reference_backend() {
  return make_cpu_backend();
}

// --- guarded buffers ---

GuardedBuffer::GuardedBuffer(Backend& backend, std::span<const uint8_t> initial)
    : backend_(backend), payload_bytes_(initial.size()) {
  const size_t total = kGuardBytes + payload_bytes_ + kGuardBytes;
  buffer_ = backend_.allocate(total);
  std::vector<uint8_t> host(total, kGuardPattern);
  if (!initial.empty()) std::memcpy(host.data() + kGuardBytes, initial.data(), initial.size());
  backend_.copy_from_host(buffer_->data(), host.data(), total);
}

void* GuardedBuffer::data() {
  return static_cast<uint8_t*>(buffer_->data()) + kGuardBytes;
}

std::vector<uint8_t> GuardedBuffer::download(bool* guards_ok) const {
  const size_t total = kGuardBytes + payload_bytes_ + kGuardBytes;
  std::vector<uint8_t> host(total);
  backend_.copy_to_host(host.data(), buffer_->data(), total);
  const auto intact = [](auto first, auto last) {
    return std::all_of(first, last, [](uint8_t b) { return b == kGuardPattern; });
  };
  *guards_ok =
      intact(host.begin(), host.begin() + kGuardBytes) && intact(host.end() - kGuardBytes, host.end());
  return {host.begin() + kGuardBytes, host.end() - kGuardBytes};
}

void GuardedBuffer::upload(std::span<const uint8_t> values) {
  if (values.size() != payload_bytes_) throw std::invalid_argument("GuardedBuffer::upload: size differs");
  if (!values.empty()) backend_.copy_from_host(data(), values.data(), values.size());
}

// --- host values ---

std::vector<uint8_t> as_bytes(std::span<const float> values) {
  std::vector<uint8_t> bytes(values.size_bytes());
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}
std::vector<uint8_t> as_bytes(std::span<const int32_t> values) {
  std::vector<uint8_t> bytes(values.size_bytes());
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}
std::vector<float> as_floats(std::span<const uint8_t> bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}
std::vector<float> nan_filled(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// --- comparisons ---

::testing::AssertionResult bits_equal_nan_agnostic(std::span<const float> actual,
                                                   std::span<const float> expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: actual " << actual.size() << ", expected " << expected.size();
  }
  std::ostringstream report;
  int64_t failures = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool both_nan = std::isnan(actual[i]) && std::isnan(expected[i]);
    if (both_nan || std::bit_cast<uint32_t>(actual[i]) == std::bit_cast<uint32_t>(expected[i])) continue;
    if (failures < 8) {
      report << "\n  [" << i << "] actual " << actual[i] << " (0x" << std::hex
             << std::bit_cast<uint32_t>(actual[i]) << "), expected " << std::dec << expected[i] << " (0x"
             << std::hex << std::bit_cast<uint32_t>(expected[i]) << std::dec << ")";
    }
    ++failures;
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << actual.size() << " elements are not bit-identical:" << report.str();
}

::testing::AssertionResult bytes_identical(std::span<const uint8_t> actual, std::span<const uint8_t> expected,
                                           const std::string& what) {
  if (actual.size() == expected.size() &&
      (actual.empty() || std::memcmp(actual.data(), expected.data(), actual.size()) == 0)) {
    return ::testing::AssertionSuccess();
  }
  size_t first = 0;
  while (first < std::min(actual.size(), expected.size()) && actual[first] == expected[first]) ++first;
  return ::testing::AssertionFailure() << what << ": " << actual.size() << " bytes against "
                                       << expected.size() << ", first difference at byte " << first;
}

namespace {

struct Margins {
  double max_abs = 0.0;
  double max_rel = 0.0;
  double worst_fraction = 0.0;  // largest error / bound
  int64_t non_finite = 0;
};

Margins margins(std::span<const float> actual, std::span<const float> expected,
                const CompareOptions& options) {
  const Tolerance tol = tolerance_for(options.dtype, options.reduction_length);
  Margins m;
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    const double a = actual[i], e = expected[i];
    if (!std::isfinite(a) || !std::isfinite(e)) {
      ++m.non_finite;
      continue;
    }
    const double err = std::fabs(a - e);
    const double magnitude = options.magnitude.empty() ? std::fabs(e) : options.magnitude[i];
    const double bound = tol.atol + tol.rtol * std::fabs(e) + tol.accumulation * magnitude;
    m.max_abs = std::max(m.max_abs, err);
    if (e != 0.0) m.max_rel = std::max(m.max_rel, err / std::fabs(e));
    if (err > 0.0) {
      m.worst_fraction =
          std::max(m.worst_fraction, bound > 0.0 ? err / bound : std::numeric_limits<double>::infinity());
    }
  }
  return m;
}

}  // namespace

::testing::AssertionResult close_with_report(const std::string& label, std::span<const float> actual,
                                             std::span<const float> expected, const CompareOptions& options) {
  const Margins m = margins(actual, expected, options);
  std::printf("  %-64s max abs %.3g  max rel %.3g  err/bound %.3g  (%s, K=%lld, %lld non-finite)\n",
              label.c_str(), m.max_abs, m.max_rel, m.worst_fraction,
              std::string(dtype_name(options.dtype)).c_str(),
              static_cast<long long>(options.reduction_length), static_cast<long long>(m.non_finite));
  ::testing::AssertionResult result = all_close(actual, expected, options);
  if (!result) result << "\n  in " << label;
  return result;
}

::testing::AssertionResult exact_with_report(const std::string& label, std::span<const float> actual,
                                             std::span<const float> expected) {
  ::testing::AssertionResult result = bits_equal_nan_agnostic(actual, expected);
  std::printf("  %-64s %s (%zu elements)\n", label.c_str(), result ? "bit-exact" : "NOT bit-exact",
              expected.size());
  if (!result) result << "\n  in " << label;
  return result;
}

int64_t gemm_reduction_length(int64_t K, int accumulator_bits) {
  // all_close charges reduction_length * 2^-24 per unit of magnitude. The K accumulations and up to four
  // float32 roundings of the same terms (the scales, the bias, adding into an existing output, one spare)
  // each cost 2^-accumulator_bits.
  constexpr int64_t kExtraRoundings = 4;
  return (K + kExtraRoundings) << (24 - accumulator_bits);
}

// --- op cases ---

Operand input(std::string name, std::span<const float> values) {
  return {std::move(name), Access::input, as_bytes(values)};
}
Operand input_ints(std::string name, std::span<const int32_t> values) {
  return {std::move(name), Access::input, as_bytes(values)};
}
Operand in_out(std::string name, std::span<const float> values) {
  return {std::move(name), Access::in_out, as_bytes(values)};
}
Operand output(std::string name, size_t count) {
  return {std::move(name), Access::output, as_bytes(nan_filled(count))};
}

Check exact(std::string target, std::string why) {
  Check c;
  c.target = std::move(target);
  c.exact = true;
  c.why = std::move(why);
  return c;
}

Check exact_ints(std::string target, std::string why) {
  Check c = exact(std::move(target), std::move(why));
  c.integers = true;
  return c;
}

Check nan_free(Check check) {
  check.finite = true;
  return check;
}

Check close(std::string target, int64_t reduction_length, std::vector<float> magnitude, std::string why,
            Dtype dtype) {
  Check c;
  c.target = std::move(target);
  c.options.dtype = dtype;
  c.options.reduction_length = reduction_length;
  c.magnitude = std::move(magnitude);
  c.why = std::move(why);
  return c;
}

namespace {

::testing::AssertionResult ints_equal_with_report(const std::string& label, std::span<const float> actual,
                                                  std::span<const float> expected) {
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  if (actual.size() != expected.size()) {
    result = ::testing::AssertionFailure()
             << "sizes differ: actual " << actual.size() << ", expected " << expected.size();
  } else {
    std::ostringstream report;
    int64_t failures = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      const auto a = std::bit_cast<int32_t>(actual[i]), e = std::bit_cast<int32_t>(expected[i]);
      if (a == e) continue;
      if (failures < 8) report << "\n  [" << i << "] actual " << a << ", expected " << e;
      ++failures;
    }
    if (failures > 0) {
      result = ::testing::AssertionFailure()
               << failures << " of " << actual.size() << " integers differ:" << report.str();
    }
  }
  std::printf("  %-64s %s (%zu integers)\n", label.c_str(), result ? "identical" : "NOT identical",
              expected.size());
  if (!result) result << "\n  in " << label;
  return result;
}

::testing::AssertionResult finite_everywhere(const std::string& label, std::span<const float> actual,
                                             std::span<const float> expected) {
  const auto non_finite = [](std::span<const float> v) {
    return std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
  };
  const auto in_actual = non_finite(actual), in_expected = non_finite(expected);
  if (in_actual == 0 && in_expected == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << label << ": " << in_actual << " non-finite values in the tested output, " << in_expected
         << " in the reference's, where none may be";
}

}  // namespace

::testing::AssertionResult check_output(const std::string& label, const Check& check,
                                        std::span<const float> actual, std::span<const float> expected) {
  if (check.finite) {
    ::testing::AssertionResult finite = finite_everywhere(label, actual, expected);
    if (!finite) return finite << "\ntolerance: " << check.why;
  }
  if (check.integers) return ints_equal_with_report(label, actual, expected) << "\ntolerance: " << check.why;
  if (check.exact) return exact_with_report(label, actual, expected) << "\ntolerance: " << check.why;
  CompareOptions options = check.options;
  options.magnitude = check.magnitude;
  return close_with_report(label, actual, expected, options) << "\ntolerance: " << check.why;
}

std::vector<Check> adamw_checks(const Backend::AdamWStep& h, std::span<const Backend::UpdateSegment> segments,
                                std::span<const float> params, std::span<const float> m,
                                std::span<const float> v, std::span<const float> grads) {
  // Elements in no segment keep their values: a magnitude of 0 bounds an error of 0.
  std::vector<float> p_terms(params.size(), 0.0f), m_terms(m.size(), 0.0f), v_terms(v.size(), 0.0f);
  const double beta1 = h.beta1, beta2 = h.beta2;
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(h.step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(h.step));
  for (const Backend::UpdateSegment& s : segments) {
    for (int64_t k = 0; k < s.count; ++k) {
      const auto i = static_cast<size_t>(s.offset + k);
      const double g = grads[static_cast<size_t>(s.grad_at() + k)] * h.grad_scale;
      const double m_new = beta1 * m[i] + (1.0 - beta1) * g, v_new = beta2 * v[i] + (1.0 - beta2) * g * g;
      m_terms[i] = static_cast<float>(beta1 * std::fabs(m[i]) + (1.0 - beta1) * std::fabs(g));
      v_terms[i] = static_cast<float>(v_new);
      const double update = h.learning_rate * s.learning_rate_scale / bias1 * std::fabs(m_new) /
                            (std::sqrt(v_new / bias2) + h.eps);
      p_terms[i] = static_cast<float>(std::fabs(params[i]) + update);
    }
  }
  return {
      close("m", 4, m_terms, "grad scaling, two products and a sum (FMA or not)"),
      close("v", 6, v_terms, "grad scaling, a square, two products and a sum (FMA or not)"),
      close("params", 16, p_terms,
            "a dozen roundings incl. powf and sqrt (<= 2 ulps), 1 - beta^step amplifying powf's by <= 2.3 "
            "from step 7 on")};
}

uint64_t seed_of(const std::string& op, const std::string& shape) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char ch : op + "|" + shape) {
    h ^= static_cast<uint8_t>(ch);
    h *= 1099511628211ull;
  }
  return h;
}

std::string shape_label(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string label;
  for (const auto& [name, value] : dims) {
    if (!label.empty()) label += ' ';
    label += std::string(name) + "=" + std::to_string(value);
  }
  return label;
}

std::vector<int32_t> random_indices(size_t count, uint64_t seed, int64_t n) {
  const std::vector<float> u = random_uniform(count, seed, 0.0f, 1.0f);
  std::vector<int32_t> out(count);
  for (size_t i = 0; i < count; ++i) {
    out[i] =
        static_cast<int32_t>(std::min<int64_t>(n - 1, static_cast<int64_t>(u[i] * static_cast<float>(n))));
  }
  return out;
}

namespace {

struct SideResult {
  std::vector<std::vector<uint8_t>> operands;  // payloads after the op
  std::vector<double> scalars;
};

SideResult run_on(Backend& backend, const OpCase& c, const std::string& side) {
  std::vector<GuardedBuffer> buffers;
  buffers.reserve(c.operands.size());
  std::vector<void*> pointers;
  for (const Operand& operand : c.operands) {
    buffers.emplace_back(backend, operand.initial);
    pointers.push_back(buffers.back().data());
  }
  SideResult result;
  result.scalars = c.run(backend, pointers);
  backend.synchronize();
  for (size_t i = 0; i < c.operands.size(); ++i) {
    const Operand& operand = c.operands[i];
    bool guards_ok = false;
    result.operands.push_back(buffers[i].download(&guards_ok));
    EXPECT_TRUE(guards_ok) << side << " " << c.op << " " << c.shape << ": the guard bytes around '"
                           << operand.name << "' were overwritten (a write out of bounds)";
    if (operand.access == Access::input) {
      EXPECT_TRUE(bytes_identical(result.operands.back(), operand.initial, "input '" + operand.name + "'"))
          << side << " " << c.op << " " << c.shape << " changed an input it must only read";
    }
  }
  return result;
}

size_t operand_index(const OpCase& c, const std::string& name) {
  for (size_t i = 0; i < c.operands.size(); ++i) {
    if (c.operands[i].name == name) return i;
  }
  ADD_FAILURE() << c.op << ": a check names '" << name << "', which is not an operand";
  return c.operands.size();
}

std::vector<float> scalars_as_floats(const std::vector<double>& scalars) {
  std::vector<float> out;
  for (const double s : scalars) out.push_back(static_cast<float>(s));
  return out;
}

}  // namespace

void run_case(Backend& reference, Backend& tested, const OpCase& c) {
  SCOPED_TRACE(c.op + " " + c.shape);
  std::printf("[ op ] %s %s\n", c.op.c_str(), c.shape.c_str());
  const SideResult expected = run_on(reference, c, std::string(reference.name()));
  const SideResult actual = run_on(tested, c, std::string(tested.name()));

  for (const Check& check : c.checks) {
    std::vector<float> a, e;
    if (check.target == "result") {
      a = scalars_as_floats(actual.scalars);
      e = scalars_as_floats(expected.scalars);
    } else {
      const size_t i = operand_index(c, check.target);
      if (i == c.operands.size()) continue;
      a = as_floats(actual.operands[i]);
      e = as_floats(expected.operands[i]);
    }
    EXPECT_TRUE(check_output(c.op + " " + c.shape + " " + check.target, check, a, e));
  }

  // Determinism: the same inputs again, fresh buffers, the same bits.
  const SideResult again = run_on(tested, c, "second run");
  for (size_t i = 0; i < c.operands.size(); ++i) {
    if (c.operands[i].access == Access::input) continue;
    EXPECT_TRUE(bytes_identical(again.operands[i], actual.operands[i], "'" + c.operands[i].name + "'"))
        << tested.name() << " " << c.op << " " << c.shape << " is not deterministic";
  }
  const bool same_scalars =
      again.scalars.size() == actual.scalars.size() &&
      std::equal(again.scalars.begin(), again.scalars.end(), actual.scalars.begin(),
                 [](double x, double y) { return std::bit_cast<uint64_t>(x) == std::bit_cast<uint64_t>(y); });
  EXPECT_TRUE(same_scalars) << tested.name() << " " << c.op << " " << c.shape
                            << " is not deterministic: its scalar results differ between two runs";
}

void run_all(const std::vector<OpCase>& cases) {
  const auto reference = make_reference_backend();
  const std::vector<const BackendFactory*> backends = tested_backends();
  ASSERT_FALSE(backends.empty());
  for (const BackendFactory* factory : backends) {
    SCOPED_TRACE(std::string("backend ") + std::string(factory->name()));
    const auto tested = factory->make(BackendOptions{});
    for (const OpCase& c : cases) run_case(*reference, *tested, c);
  }
}

}  // namespace octet::testing::backend_ops
