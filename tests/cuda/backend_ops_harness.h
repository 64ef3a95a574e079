// The op-test harness behind test_backend_ops.cpp and backend_ops_linear.cpp: one backend op run on the CPU
// reference and on the backend under test from the same host inputs, its outputs compared with the suite's
// one comparator. Every buffer an op sees comes from its own backend's allocate() and sits between two guard
// zones that must be intact afterwards (writes out of bounds); inputs must come back unchanged (writes to
// const operands); outputs start as NaN (elements left unwritten); and the op runs twice on the tested
// backend, which must give the same bits (determinism). Each comparison prints its margins.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "compare.h"
#include "octet/backend/backend.h"
#include "octet/backend/registry.h"

namespace octet::testing::backend_ops {

// The backends held to the reference: every registered backend (octet/backend/registry.h) but the CPU
// reference itself that has a device on this machine. The generic op cases (test_backend_ops.cpp) run on
// each of them, so that a backend is tested by registering it; the cases that drive one backend's own
// options and fusions (the CUDA backend's) make it with make_tested_backend(). Without any, the tests skip.
std::vector<const BackendFactory*> tested_backends();
bool tested_backend_available();
// The CUDA backend with its default options.
std::unique_ptr<Backend> make_tested_backend();
std::unique_ptr<Backend> make_reference_backend();

#define SKIP_WITHOUT_TESTED_BACKEND() \
  if (!::octet::testing::backend_ops::tested_backend_available()) GTEST_SKIP() << "no CUDA GPU"

// One buffer of `bytes` on one backend, with kGuardBytes of a known pattern before and after it. The front
// guard is a multiple of 256 bytes, so the payload keeps the allocation's alignment.
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr uint8_t kGuardPattern = 0xA5;

  GuardedBuffer(Backend& backend, std::span<const uint8_t> initial);
  void* data();
  float* floats() { return static_cast<float*>(data()); }
  size_t bytes() const { return payload_bytes_; }
  // Downloads the payload; `guards_ok` says whether both guard zones still hold the pattern.
  std::vector<uint8_t> download(bool* guards_ok) const;
  // Uploads new payload bytes (same size).
  void upload(std::span<const uint8_t> values);

 private:
  Backend& backend_;
  std::unique_ptr<Buffer> buffer_;
  size_t payload_bytes_;
};

// Host values <-> bytes.
std::vector<uint8_t> as_bytes(std::span<const float> values);
std::vector<uint8_t> as_bytes(std::span<const int32_t> values);
std::vector<float> as_floats(std::span<const uint8_t> bytes);
// n floats, all quiet NaN: what a write-only output holds before the op.
std::vector<float> nan_filled(size_t n);

// Float comparisons that are not tolerances. Cross-backend exactness: bit-identical, except that NaNs of any
// payload agree (CPUs and GPUs write different NaN payloads). Determinism: bit-identical, NaNs included.
::testing::AssertionResult bits_equal_nan_agnostic(std::span<const float> actual,
                                                   std::span<const float> expected);
::testing::AssertionResult bytes_identical(std::span<const uint8_t> actual, std::span<const uint8_t> expected,
                                           const std::string& what);

// all_close, plus one log line with the margins seen: largest absolute and relative error and the largest
// error as a fraction of its bound. `label` names the op, shape and output.
::testing::AssertionResult close_with_report(const std::string& label, std::span<const float> actual,
                                             std::span<const float> expected, const CompareOptions& options);
::testing::AssertionResult exact_with_report(const std::string& label, std::span<const float> actual,
                                             std::span<const float> expected);

// A float32 GEMM output's reduction length for all_close (which charges reduction_length * 2^-24 per unit of
// magnitude, the magnitude being sum |a_k b_k| of the rounded operands): K accumulations and a few more
// float32 roundings (scales, bias, adding into an existing output) in an accumulator that keeps
// `accumulator_bits` mantissa bits.
int64_t gemm_reduction_length(int64_t K, int accumulator_bits);

// --- the table-driven op cases ---

enum class Access { input, output, in_out };

struct Operand {
  std::string name;
  Access access;
  std::vector<uint8_t> initial;  // inputs and in_out: the values; outputs: NaN, so unwritten elements show
};
Operand input(std::string name, std::span<const float> values);
Operand input_ints(std::string name, std::span<const int32_t> values);
Operand in_out(std::string name, std::span<const float> values);
// count float32 or int32 values, all quiet NaN (as int32, 0x7FC00000: no index an op writes).
Operand output(std::string name, size_t count);

// How one output (or the op's scalar result) is held to the reference.
struct Check {
  std::string target;     // operand name, or "result" for the op's scalar results
  bool exact = false;     // bit for bit (NaNs agree whatever their payload)
  bool integers = false;  // int32 values, equal one for one (read as floats, two negative integers would
                          // both be NaN and agree)
  bool finite = false;    // and no NaN or Inf on either side (the comparisons let a NaN agree with a NaN)
  CompareOptions options;
  std::vector<float> magnitude;  // per element, for options.magnitude; empty: |expected|
  std::string why;               // the tolerance's rationale, one line
};
Check exact(std::string target, std::string why);
Check exact_ints(std::string target, std::string why);
Check close(std::string target, int64_t reduction_length, std::vector<float> magnitude, std::string why,
            Dtype dtype = Dtype::f32);
// The same check, that also requires every value of both outputs to be finite.
Check nan_free(Check check);

// One op on one shape: its operands, how to run it given pointers into one backend's buffers (in operand
// order), and its checks. `run` returns the op's scalar results (sum_of_squares, all_finite), if any.
struct OpCase {
  std::string op;
  std::string shape;
  std::vector<Operand> operands;
  std::function<std::vector<double>(Backend&, const std::vector<void*>&)> run;
  std::vector<Check> checks;
};

// One check applied to an output: `label` names the op, shape and output in the report.
::testing::AssertionResult check_output(const std::string& label, const Check& check,
                                        std::span<const float> actual, std::span<const float> expected);

// optimizer_update's checks of params, m and v, given their values before the update ([n] each), the
// gradients it reads (each segment's at its grad_at() in grads) and its segments: per element, the
// magnitudes of its float32 roundings; an element in no segment must keep its value. For h.step >= 7 (the
// bias correction amplifies powf's error more in the first steps).
std::vector<Check> adamw_checks(const Backend::AdamWStep& h, std::span<const Backend::UpdateSegment> segments,
                                std::span<const float> params, std::span<const float> m,
                                std::span<const float> v, std::span<const float> grads);

// Helpers for writing cases: a seed from the case's name (so every case has its own inputs and a failure
// reproduces), a shape label such as "B=2 T=37 C=24", and the operand pointers a `run` receives.
uint64_t seed_of(const std::string& op, const std::string& shape);
std::string shape_label(std::initializer_list<std::pair<const char*, int64_t>> dims);
inline float* floats_at(const std::vector<void*>& p, size_t i) {
  return static_cast<float*>(p[i]);
}
inline const int32_t* ints_at(const std::vector<void*>& p, size_t i) {
  return static_cast<const int32_t*>(p[i]);
}
// Integers uniform in [0, n), seeded.
std::vector<int32_t> random_indices(size_t count, uint64_t seed, int64_t n);

// Runs the case on both backends and makes every check; then the determinism and guard checks.
void run_case(Backend& reference, Backend& tested, const OpCase& c);
// Every case on every tested backend (each registered backend with a device here), made with its default
// options, against the reference.
void run_all(const std::vector<OpCase>& cases);

}  // namespace octet::testing::backend_ops
