// cuda::softmax_cross_entropy (src/backends/cuda/softmax_cross_entropy.h) on float32 and on BF16 logits, held
// to the promises of its header between its paths (test_backend_ops.cpp holds the float32 path to the CPU
// reference):
//  - a BF16 row gives the same loss bits as the float32 row of the same values, and the float32 gradient
//    rounded to nearest even;
//  - the kernel that stages whole rows in shared memory (rows of whole 16-byte copies, 16-byte aligned) gives
//    the bits of the one-pass kernel the launcher takes for other rows: BF16 logits 8 bytes past a 16-byte
//    boundary take that kernel, with the same grouping of the row (four logits per load);
//  - padded columns come out +0 whatever they held (NaN here); with dloss 0 the logits are left alone;
//  - two runs give the same bits, and nothing is written outside the logits and the losses.
// Together (the one-pass kernel's code is the same for both types), the float32 rows that the staged kernel
// takes get the one-pass kernel's losses, bit for bit, and gradients that round to the same BF16.
// Shapes: odd V with a padded Vp, V == Vp, a row too wide for shared memory, Vp not a multiple of 4 (the
// one-logit-per-load kernel), GPT-2's vocabulary; rows with a NaN logit and with -Inf. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>

#include "compare.h"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "octet/numerics/minifloat.h"
#include "random.h"
#include "softmax_cross_entropy.h"

namespace {

#define SKIP_WITHOUT_GPU() \
  if (octet::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU"

constexpr size_t kGuardBytes = 256;  // before and after every buffer; keeps the payload 256-byte aligned
constexpr uint8_t kSentinel = 0xA5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// `count` values of T on the device, `offset_bytes` past a guard zone and followed by another.
template <typename T>
class Guarded {
 public:
  Guarded(size_t count, size_t offset_bytes)
      : count_(count), begin_(kGuardBytes + offset_bytes), bytes_(begin_ + count * sizeof(T) + kGuardBytes) {
    bytes_.fill_bytes(kSentinel);
  }
  T* data() { return reinterpret_cast<T*>(bytes_.data() + begin_); }
  void upload(const std::vector<T>& values) {
    ASSERT_EQ(values.size(), count_);
    OCTET_CUDA_CHECK(cudaMemcpy(data(), values.data(), count_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  // The payload; `guards_ok` says whether every byte around it still holds the sentinel.
  std::vector<T> read(bool* guards_ok) const {
    std::vector<uint8_t> raw(bytes_.size());
    bytes_.copy_to_host(raw);
    const size_t end = begin_ + count_ * sizeof(T);
    *guards_ok = true;
    for (size_t i = 0; i < raw.size(); ++i) {
      if ((i < begin_ || i >= end) && raw[i] != kSentinel) *guards_ok = false;
    }
    std::vector<T> out(count_);
    std::memcpy(out.data(), raw.data() + begin_, count_ * sizeof(T));
    return out;
  }

 private:
  size_t count_;
  size_t begin_;
  octet::cuda::DeviceBuffer<uint8_t> bytes_;
};

struct LossShape {
  int64_t N, V, Vp;
};

std::string describe(const LossShape& s, float dloss) {
  std::ostringstream out;
  out << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss;
  return out.str();
}

// The logits, BF16 values so that both types hold them exactly, NaN in the padded columns; `plant` puts a
// NaN logit in row 0, -Inf in column 0 of row 1 (the first logit its thread sees, while its running maximum
// is still -Inf) and the largest logit of row 2 in its last column.
std::vector<float> logits_of(const LossShape& s, uint64_t seed, bool plant) {
  std::vector<float> logits = octet::testing::random_normal(static_cast<size_t>(s.N * s.Vp), seed, 3.0f);
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t v = 0; v < s.Vp; ++v) {
      float& x = logits[static_cast<size_t>(n * s.Vp + v)];
      x = v < s.V ? octet::round_to_bf16(x) : kNaN;
    }
  }
  if (plant && s.N >= 3 && s.V >= 2) {
    logits[static_cast<size_t>(s.V / 2)] = kNaN;
    logits[static_cast<size_t>(s.Vp)] = -kInf;
    logits[static_cast<size_t>(2 * s.Vp + s.V - 1)] = 64.0f;
  }
  return logits;
}

// Targets in [0, V), the first row's the last column and the second row's the first (the second, where
// the first holds -Inf).
std::vector<int32_t> targets_of(const LossShape& s, uint64_t seed, bool plant) {
  const std::vector<float> u = octet::testing::random_uniform(static_cast<size_t>(s.N), seed, 0.0f, 1.0f);
  std::vector<int32_t> targets(static_cast<size_t>(s.N));
  for (size_t n = 0; n < targets.size(); ++n) {
    targets[n] = static_cast<int32_t>(
        std::min<int64_t>(static_cast<int64_t>(u[n] * static_cast<float>(s.V)), s.V - 1));
  }
  if (s.N > 0) targets[0] = static_cast<int32_t>(s.V - 1);
  if (s.N > 1) targets[1] = plant ? 1 : 0;
  return targets;
}

std::vector<uint16_t> bf16_codes(const std::vector<float>& values) {
  std::vector<uint16_t> codes(values.size());
  for (size_t i = 0; i < values.size(); ++i) codes[i] = octet::float_to_bf16(values[i]);
  return codes;
}

// What one call wrote: the losses and the logits' memory afterwards.
template <typename T>
struct Result {
  std::vector<float> losses;
  std::vector<T> logits;
};

// One call of softmax_cross_entropy on logits of type T (float or BF16 codes) placed `offset_bytes` past a
// 256-byte boundary; losses start as NaN. Checks the guards.
template <typename T>
Result<T> run(const LossShape& s, float dloss, const std::vector<T>& logits,
              const std::vector<int32_t>& targets, size_t offset_bytes) {
  Guarded<T> d_logits(logits.size(), offset_bytes);
  Guarded<float> d_losses(static_cast<size_t>(s.N), 0);
  octet::cuda::DeviceBuffer<int32_t> d_targets(targets.size());
  d_logits.upload(logits);
  d_losses.upload(std::vector<float>(static_cast<size_t>(s.N), kNaN));
  d_targets.copy_from_host(targets);
  if constexpr (std::is_same_v<T, float>) {
    octet::cuda::softmax_cross_entropy(d_losses.data(), d_logits.data(), d_targets.data(), s.N, s.V, s.Vp,
                                       dloss, nullptr);
  } else {
    octet::cuda::softmax_cross_entropy(d_losses.data(), reinterpret_cast<__nv_bfloat16*>(d_logits.data()),
                                       d_targets.data(), s.N, s.V, s.Vp, dloss, nullptr);
  }
  OCTET_CUDA_CHECK(cudaDeviceSynchronize());
  Result<T> r;
  bool guards_ok = false;
  r.logits = d_logits.read(&guards_ok);
  EXPECT_TRUE(guards_ok) << "bytes around the logits were written";
  r.losses = d_losses.read(&guards_ok);
  EXPECT_TRUE(guards_ok) << "bytes around the losses were written";
  return r;
}

template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& actual, const std::vector<T>& expected,
                                     const std::string& what) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << actual.size() << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

void check(const LossShape& s, float dloss, bool plant) {
  SCOPED_TRACE(describe(s, dloss) + (plant ? " with NaN and -Inf logits" : ""));
  const uint64_t seed = 9000 + static_cast<uint64_t>(s.N * 131 + s.Vp) + (plant ? 7 : 0);
  const std::vector<float> logits = logits_of(s, seed, plant);
  const std::vector<int32_t> targets = targets_of(s, seed + 1, plant);
  const std::vector<uint16_t> codes = bf16_codes(logits);

  const Result<float> f32 = run(s, dloss, logits, targets, 0);
  const Result<uint16_t> bf16 = run(s, dloss, codes, targets, 0);

  // The losses: all written, finite where no NaN or -Inf target was planted, the same bits on both types.
  for (int64_t n = 0; n < s.N; ++n) {
    const float loss = f32.losses[static_cast<size_t>(n)];
    if (!(plant && n == 0)) {
      EXPECT_TRUE(std::isfinite(loss) && loss >= 0.0f) << "row " << n << " loss " << loss;
    } else {
      EXPECT_TRUE(std::isnan(loss)) << "a NaN logit makes the row's loss NaN, got " << loss;
    }
  }
  EXPECT_TRUE(same_bits(bf16.losses, f32.losses, "BF16 losses against float32"));

  if (dloss == 0.0f) {
    EXPECT_TRUE(same_bits(f32.logits, logits, "float32 logits with dloss 0"));
    EXPECT_TRUE(same_bits(bf16.logits, codes, "BF16 logits with dloss 0"));
  } else {
    // The BF16 gradient is the float32 one rounded; padded columns +0 on both.
    std::vector<float> real;  // the float32 gradient's real columns, for the non-zero check
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t v = 0; v < s.Vp; ++v) {
        const auto i = static_cast<size_t>(n * s.Vp + v);
        const float g = f32.logits[i];
        if (v >= s.V) {
          ASSERT_EQ(std::bit_cast<uint32_t>(g), 0u)
              << "float32 padded column " << v << " of row " << n << ": " << g;
          ASSERT_EQ(bf16.logits[i], 0u) << "BF16 padded column " << v << " of row " << n;
          continue;
        }
        real.push_back(g);
        const uint16_t rounded = octet::float_to_bf16(g);
        const bool both_nan = std::isnan(g) && std::isnan(octet::bf16_to_float(bf16.logits[i]));
        ASSERT_TRUE(both_nan || bf16.logits[i] == rounded)
            << "row " << n << " column " << v << ": BF16 gradient 0x" << std::hex << bf16.logits[i]
            << " against the float32 gradient " << g << " rounded, 0x" << rounded;
        if (plant && n == 0) {
          EXPECT_TRUE(std::isnan(g)) << "a NaN logit makes its row's gradient NaN";
        } else if (plant && n == 1 && v == 0) {
          EXPECT_EQ(g, 0.0f) << "-Inf has probability 0";
        }
      }
    }
    if (s.V > 1) {
      EXPECT_TRUE(octet::testing::has_nonzero(real)) << "an all-zero gradient";
    }
  }

  // The one-pass kernel: BF16 logits aligned to 8 bytes but not 16 (four logits per load, as the staged
  // kernel groups them). Vp % 4 != 0 takes one logit per load on every path.
  if (s.Vp % 4 == 0) {
    const Result<uint16_t> one_pass = run(s, dloss, codes, targets, 8);
    EXPECT_TRUE(same_bits(one_pass.losses, bf16.losses, "losses of the one-pass kernel"));
    EXPECT_TRUE(same_bits(one_pass.logits, bf16.logits, "logits of the one-pass kernel"));
  }

  // Determinism.
  const Result<uint16_t> bf16_again = run(s, dloss, codes, targets, 0);
  EXPECT_TRUE(same_bits(bf16_again.losses, bf16.losses, "BF16 losses, second run"));
  EXPECT_TRUE(same_bits(bf16_again.logits, bf16.logits, "BF16 logits, second run"));
  const Result<float> f32_again = run(s, dloss, logits, targets, 0);
  EXPECT_TRUE(same_bits(f32_again.losses, f32.losses, "float32 losses, second run"));
  EXPECT_TRUE(same_bits(f32_again.logits, f32.logits, "float32 logits, second run"));
}

const std::vector<LossShape> kShapes = {
    {1, 1, 8},            // one logit: loss 0, gradient 0
    {3, 8, 8},            // no padding
    {3, 13, 16},          // the padding inside the last 16-byte copy of a BF16 row
    {37, 61, 64},         // odd V
    {13, 97, 128},        // a float32 row of whole copies, a BF16 row too
    {5, 97, 100},         // a float32 row of whole copies, a BF16 row not (200 bytes): the one-pass kernel
    {3, 61, 63},          // Vp % 4 != 0: one logit per load
    {5, 1000, 1024},      // many rows to a multiprocessor
    {4, 50257, 50304},    // GPT-2: BF16 rows staged two blocks to a multiprocessor, float32 rows one
    {2, 60000, 60000},    // float32 rows too wide to stage, BF16 rows not
    {2, 120001, 120064},  // too wide to stage on either type
};

TEST(SoftmaxCrossEntropy, Bf16MatchesFloat32AndTheOnePassKernel) {
  SKIP_WITHOUT_GPU();
  for (const LossShape& s : kShapes) {
    for (const float dloss : {0.0f, 1.0f / static_cast<float>(s.N), -3.0f}) check(s, dloss, false);
  }
}

TEST(SoftmaxCrossEntropy, NanAndInfiniteLogits) {
  SKIP_WITHOUT_GPU();
  for (const LossShape& s :
       {LossShape{3, 13, 16}, LossShape{4, 61, 64}, LossShape{3, 61, 63}, LossShape{4, 50257, 50304}}) {
    for (const float dloss : {0.0f, 0.25f}) check(s, dloss, true);
  }
}

}  // namespace
