// Google Benchmark for the CPU cast path: float32 -> E4M3 quantization with amax (the reference that the
// fused GPU cast kernel replaces), and its parts. Figures are recorded in docs/benchmarks.md by
// scripts/bench_numerics.sh.
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "octet/numerics/quantize.h"

namespace {

std::vector<float> normal_values(size_t n) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Full per-tensor quantization with the current recipe: amax pass, scale, cast, saturation/underflow counts.
void BM_QuantizeE4m3CurrentScaling(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> x = normal_values(static_cast<size_t>(n));
  const octet::CurrentScaling recipe;
  octet::ScalingState scaling = recipe.initial_state();
  for (auto _ : state) {
    octet::QuantizedTensor q =
        octet::quantize(x, 1, n, octet::Dtype::e4m3, octet::TensorRole::activation, recipe, scaling);
    benchmark::DoNotOptimize(q.data.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float) + 1));
}
BENCHMARK(BM_QuantizeE4m3CurrentScaling)->Arg(1 << 16)->Arg(1 << 22)->Unit(benchmark::kMicrosecond);

// Delayed scaling: the scale is known before the cast; the amax is still measured for the history.
void BM_QuantizeE4m3DelayedScaling(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> x = normal_values(static_cast<size_t>(n));
  const octet::DelayedScaling recipe(16);
  octet::ScalingState scaling = recipe.initial_state();
  for (auto _ : state) {
    octet::QuantizedTensor q =
        octet::quantize(x, 1, n, octet::Dtype::e4m3, octet::TensorRole::activation, recipe, scaling);
    benchmark::DoNotOptimize(q.data.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float) + 1));
}
BENCHMARK(BM_QuantizeE4m3DelayedScaling)->Arg(1 << 22)->Unit(benchmark::kMicrosecond);

void BM_Amax(benchmark::State& state) {
  const std::vector<float> x = normal_values(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(octet::compute_amax(x));
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_Amax)->Arg(1 << 22)->Unit(benchmark::kMicrosecond);

// The bare encoder, one value at a time.
void BM_EncodeE4m3(benchmark::State& state) {
  const std::vector<float> x = normal_values(4096);
  for (auto _ : state) {
    uint32_t acc = 0;
    for (const float v : x) acc += octet::float_to_e4m3(v * 100.0f);
    benchmark::DoNotOptimize(acc);
  }
  state.SetItemsProcessed(state.iterations() * 4096);
}
BENCHMARK(BM_EncodeE4m3);

}  // namespace

BENCHMARK_MAIN();
