// Mixture-of-experts grouping (expert_grouping.h): a stable counting sort of the N k assignments by expert,
// in one block. The assignments are cut into one contiguous segment per warp, which the warp walks 32 at a
// time, twice. The first walk counts its segment's assignments per expert in the warp's own counters in
// shared memory; then a column sum over the warps gives each expert's count and each warp's first rank
// within it, an exclusive scan of the counts rounded up to the alignment gives each expert's first row, and
// the second walk hands out rows: in a step, __match_any_sync groups the lanes by expert, the group's lowest
// lane takes as many rows from the warp's counter, and each lane adds its rank within the group. Segments
// in order, steps in order and lanes in order give each expert its assignments in assignment order, the
// reference's (src/backends/cpu/cpu_routing.cpp) order; integers only, so the result is the reference's
// exactly. Each warp's counters are its own (no atomics). E is small (routers choose among a few to a few
// hundred experts); shared memory holds the counters of up to 32 warps for 256 experts, fewer warps for
// more experts, up to kMaxExperts.
#include "expert_grouping.h"

#include <algorithm>
#include <climits>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::kFullMask;
using ops_internal::ceil_div;
using ops_internal::kWarp;

constexpr int kMaxWarps = 32;
// Dynamic shared memory: within the 48 KiB a launch gets without opting in, beside the scan's few words.
constexpr int64_t kSharedInts = 46 * 1024 / sizeof(int32_t);

// The ints of shared memory a block of `warps` warps takes for E experts: each warp's counters, each
// expert's first row (E + 1) and its count.
int64_t shared_ints(int64_t warps, int64_t E) {
  return warps * E + 2 * E + 1;
}
// The most experts that one warp's counters leave room for.
constexpr int64_t kMaxExperts = (kSharedInts - 1) / 3;

__device__ __forceinline__ int valid_expert(int32_t e, int E) {
  return e >= 0 && e < E ? e : -1;
}

// In place over values[0 .. n): each count rounded up to a multiple of align, then replaced by the sum of
// those before it; values[n] the sum of them all. Every thread of the block calls it.
__device__ void aligned_exclusive_scan(int32_t* values, int n, int align) {
  __shared__ int32_t warp_totals[kMaxWarps];
  __shared__ int32_t carry;  // the sum of the chunks before
  const int lane = static_cast<int>(threadIdx.x % kWarp), warp = static_cast<int>(threadIdx.x / kWarp);
  const int warps = static_cast<int>(blockDim.x / kWarp);
  if (threadIdx.x == 0) carry = 0;
  for (int chunk = 0; chunk < n; chunk += static_cast<int>(blockDim.x)) {
    const int i = chunk + static_cast<int>(threadIdx.x);
    const int32_t v = i < n ? (values[i] + align - 1) / align * align : 0;
    int32_t inclusive = v;
    for (int offset = 1; offset < kWarp; offset *= 2) {
      const int32_t below = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += below;
    }
    if (lane == kWarp - 1) warp_totals[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      int32_t total = lane < warps ? warp_totals[lane] : 0;
      for (int offset = 1; offset < kWarp; offset *= 2) {
        const int32_t below = __shfl_up_sync(kFullMask, total, offset);
        if (lane >= offset) total += below;
      }
      if (lane < warps) warp_totals[lane] = total;  // now inclusive over the warps
    }
    __syncthreads();
    const int32_t chunk_total = warp_totals[warps - 1];
    if (i < n) values[i] = carry + (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - v;
    __syncthreads();  // carry and warp_totals read before they change
    if (threadIdx.x == 0) carry += chunk_total;
  }
  __syncthreads();
  if (threadIdx.x == 0) values[n] = carry;
  __syncthreads();
}

__global__ void __launch_bounds__(kMaxWarps* kWarp)
    group_by_expert_kernel(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts,
                           int64_t assignments, int E, int align, int64_t rows, int64_t segment) {
  extern __shared__ int32_t shared[];
  const int lane = static_cast<int>(threadIdx.x % kWarp), warp = static_cast<int>(threadIdx.x / kWarp);
  const int warps = static_cast<int>(blockDim.x / kWarp);
  int32_t* counter = shared + warp * E;  // this warp's, per expert: its count, then its next row
  int32_t* start = shared + warps * E;   // [E + 1]: each expert's count, then its first row
  int32_t* count = start + E + 1;        // [E]
  for (int i = static_cast<int>(threadIdx.x); i < warps * E; i += static_cast<int>(blockDim.x)) shared[i] = 0;
  __syncthreads();
  const int64_t begin = warp * segment < assignments ? warp * segment : assignments;
  const int64_t end = begin + segment < assignments ? begin + segment : assignments;
  const unsigned lanes_below = (1u << lane) - 1u;

  // Walk one: count. The loop's trip count is the warp's, so every lane takes part in the match.
  for (int64_t step = begin; step < end; step += kWarp) {
    const int64_t a = step + lane;
    const int e = a < end ? valid_expert(experts[a], E) : -1;
    const unsigned same = __match_any_sync(kFullMask, e);
    if (e >= 0 && lane == __ffs(same) - 1) counter[e] += __popc(same);
    __syncwarp();  // the next step's lowest lane for e may be another lane
  }
  __syncthreads();

  // Each expert's count, and each warp's first rank within the expert: the counts of the warps before it.
  for (int e = static_cast<int>(threadIdx.x); e < E; e += static_cast<int>(blockDim.x)) {
    int32_t running = 0;
    for (int w = 0; w < warps; ++w) {
      const int32_t c = shared[w * E + e];
      shared[w * E + e] = running;
      running += c;
    }
    count[e] = running;
    start[e] = running;
  }
  __syncthreads();
  aligned_exclusive_scan(start, E, align);
  for (int e = static_cast<int>(threadIdx.x); e <= E; e += static_cast<int>(blockDim.x))
    offsets[e] = start[e];
  // The rows that hold no assignment: each expert's padding up to the next expert's start, and the rows past
  // the last expert's (the slots' length allows for every expert's padding).
  for (int e = static_cast<int>(threadIdx.x); e < E; e += static_cast<int>(blockDim.x)) {
    for (int32_t row = start[e] + count[e]; row < start[e + 1]; ++row) slots[row] = -1;
  }
  for (int64_t row = start[E] + threadIdx.x; row < rows; row += blockDim.x) slots[row] = -1;
  for (int i = static_cast<int>(threadIdx.x); i < warps * E; i += static_cast<int>(blockDim.x)) {
    shared[i] += start[i % E];
  }
  __syncthreads();

  // Walk two: the same steps; each group of lanes with one expert takes its rows from the warp's counter.
  for (int64_t step = begin; step < end; step += kWarp) {
    const int64_t a = step + lane;
    const int e = a < end ? valid_expert(experts[a], E) : -1;
    const unsigned same = __match_any_sync(kFullMask, e);
    const int lowest = __ffs(same) - 1;
    int32_t first = 0;
    if (e >= 0 && lane == lowest) {
      first = counter[e];
      counter[e] = first + __popc(same);
    }
    first = __shfl_sync(kFullMask, first, lowest);
    if (a < end) {
      const int32_t row = e >= 0 ? first + __popc(same & lanes_below) : -1;
      if (row >= 0) slots[row] = static_cast<int32_t>(a);
      positions[a] = row;
    }
    __syncwarp();
  }
}

}  // namespace

void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts, int64_t N,
                     int64_t k, int64_t E, int64_t align, cudaStream_t stream) {
  OCTET_CHECK(
      N >= 0 && k >= 1 && E >= k && align >= 1,
      "group_by_expert: N >= 0 tokens choosing 1 <= k <= E experts, aligned to >= 1 rows, given N = {}, "
      "k = {}, E = {}, align = {}",
      N, k, E, align);
  OCTET_CHECK(E <= kMaxExperts, "group_by_expert: the CUDA backend groups at most {} experts, given {}",
              kMaxExperts, E);
  OCTET_CHECK(
      N <= INT_MAX / k && align <= INT_MAX / E && N * k + E * (align - 1) <= INT_MAX,
      "group_by_expert: the grouped rows are numbered in int32, given N = {}, k = {}, E = {}, align = {}", N,
      k, E, align);
  const int64_t assignments = N * k;
  const int64_t rows = assignments + E * (align - 1);
  const int64_t fit = (kSharedInts - 2 * E - 1) / E;  // warps whose counters fit beside the starts and counts
  const int64_t warps =
      std::clamp<int64_t>(ceil_div(assignments, kWarp), 1, std::min<int64_t>(kMaxWarps, fit));
  const int64_t segment = ceil_div(ceil_div(assignments, warps), kWarp) * kWarp;
  const size_t shared_bytes = static_cast<size_t>(shared_ints(warps, E)) * sizeof(int32_t);
  group_by_expert_kernel<<<1, static_cast<unsigned>(warps * kWarp), shared_bytes, stream>>>(
      offsets, slots, positions, experts, assignments, static_cast<int>(E), static_cast<int>(align), rows,
      segment);
  OCTET_CUDA_CHECK_LAUNCH("group_by_expert_kernel");
}

}  // namespace octet::cuda
