// Token embeddings with learned positions or without (embedding.h): the forward adds each position's rows of
// the token table and the position table (or copies the token's row where there are no positions); the
// backward adds the gradient into both in the CPU reference's (b, t) order, so that its results are the
// reference's bits. The conventions that every op follows are ops_common.cuh's.
#include "embedding.h"

#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

#include "elementwise.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::kWarp;
using elementwise::load_pack;
using elementwise::Pack;
using elementwise::store_pack;
using ops_internal::aligned16;
using ops_internal::at_offset;
using ops_internal::ceil_div;
using ops_internal::for_each;
using ops_internal::kThreads;
using ops_internal::Layout;

struct EmbeddingForward {
  float* out;
  const int32_t* tokens;
  const float* table;
  const float* positions;  // null: none
  int64_t T;
  int64_t C;
  // With W = 4, C is a multiple of 4, so the group lies in one row.
  template <int W>
  __device__ void apply(int64_t i) const {
    const int64_t row = i / C;
    const int64_t c = i - row * C;
    const int64_t t = row % T;
    const Pack<W> e = load_pack<W>(table + static_cast<int64_t>(tokens[row]) * C + c);
    if (positions == nullptr) {  // a copy, not + 0.0f, which would turn -0 into +0
      store_pack<W>(out + i, e);
      return;
    }
    Pack<W> p = load_pack<W>(positions + t * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) p.v[k] = __fadd_rn(e.v[k], p.v[k]);
    store_pack<W>(out + i, p);
  }
};

// dpositions[t, c] += dout[b, t, c] for b = 0, 1, ...: the reference's order. Element i of dpositions [T*C]
// gathers element b*T*C + i of dout, so groups of four stay aligned when T*C is a multiple of 4.
struct EmbeddingBackwardPosition {
  float* dpositions;
  const float* dout;
  int64_t B;
  int64_t TC;
  template <int W>
  __device__ void apply(int64_t i) const {
    Pack<W> acc = load_pack<W>(dpositions + i);
    for (int64_t b = 0; b < B; ++b) {
      const Pack<W> d = load_pack<W>(dout + b * TC + i);
#pragma unroll
      for (int k = 0; k < W; ++k) acc.v[k] = __fadd_rn(acc.v[k], d.v[k]);
    }
    store_pack<W>(dpositions + i, acc);
  }
};

__global__ void iota_kernel(int32_t* x, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) x[i] = i;
}

// One block per sorted position; the block at the start of a token's run adds the run's rows of dout into
// that token's row of dtable in position order, i.e. in the reference's (b, t) order (the sort is stable).
// blockIdx.y picks a chunk of channels.
template <int W>
__global__ void embedding_backward_token_kernel(float* dtable, const float* dout,
                                                const int32_t* sorted_tokens, const int32_t* sorted_positions,
                                                int n, int64_t C) {
  const int first = static_cast<int>(blockIdx.x);
  const int32_t token = sorted_tokens[first];
  if (first > 0 && sorted_tokens[first - 1] == token) return;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  if (c >= C) return;
  // The run's end by binary search, so that the loop below has a known trip count and its loads can be
  // issued ahead of the (ordered) additions: a frequent token's run can be thousands of positions long.
  int low = first + 1;
  int high = n;
  while (low < high) {
    const int middle = low + (high - low) / 2;
    if (sorted_tokens[middle] == token) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  const int end = low;
  float* e = dtable + static_cast<int64_t>(token) * C + c;
  Pack<W> acc = load_pack<W>(e);
#pragma unroll 8
  for (int j = first; j < end; ++j) {
    const Pack<W> d = load_pack<W>(dout + static_cast<int64_t>(sorted_positions[j]) * C + c);
#pragma unroll
    for (int k = 0; k < W; ++k) acc.v[k] = __fadd_rn(acc.v[k], d.v[k]);
  }
  store_pack<W>(e, acc);
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* table, const float* positions,
                       int64_t B, int64_t T, int64_t C, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding_forward: non-negative B, T, C, got {} {} {}", B, T, C);
  const int64_t n = B * T * C;
  if (n == 0) return;
  const bool vectorize =
      C % 4 == 0 && aligned16(out) && aligned16(table) && (positions == nullptr || aligned16(positions));
  for_each(EmbeddingForward{out, tokens, table, positions, T, C}, n, vectorize, stream);
  OCTET_CUDA_CHECK_LAUNCH("embedding_forward");
}

void embedding_backward(float* dtable, float* dpositions, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C, Workspace& workspace, cudaStream_t stream) {
  OCTET_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding_backward: non-negative B, T, C, got {} {} {}", B, T, C);
  const int64_t rows = B * T;
  if (rows == 0 || C == 0) return;
  OCTET_CHECK(rows <= INT32_MAX, "embedding_backward: at most 2^31 - 1 positions, got {}", rows);
  const int n = static_cast<int>(rows);

  // Positions sorted by token id, stably, so that each token's positions keep the reference's (b, t) order.
  size_t sort_bytes = 0;
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, tokens, static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), n, 0, 32, stream));
  Layout layout;
  const size_t sorted_tokens_at = layout.reserve(rows * sizeof(int32_t));
  const size_t positions_at = layout.reserve(rows * sizeof(int32_t));
  const size_t sorted_positions_at = layout.reserve(rows * sizeof(int32_t));
  const size_t sort_at = layout.reserve(sort_bytes);
  void* base = workspace.get(layout.bytes, stream);
  auto* sorted_tokens = at_offset<int32_t>(base, sorted_tokens_at);
  auto* positions = at_offset<int32_t>(base, positions_at);
  auto* sorted_positions = at_offset<int32_t>(base, sorted_positions_at);

  iota_kernel<<<static_cast<unsigned>(ceil_div(rows, kThreads)), kThreads, 0, stream>>>(positions, n);
  OCTET_CUDA_CHECK_LAUNCH("iota_kernel");
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(at_offset<void>(base, sort_at), sort_bytes, tokens,
                                                   sorted_tokens, positions, sorted_positions, n, 0, 32,
                                                   stream));

  const bool vectorize = C % 4 == 0 && aligned16(dtable) && aligned16(dout);
  const int width = vectorize ? 4 : 1;
  const int64_t lanes = ceil_div(C, width);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, ceil_div(lanes, kWarp) * kWarp));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(ceil_div(lanes, threads)));
  if (vectorize) {
    embedding_backward_token_kernel<4>
        <<<grid, threads, 0, stream>>>(dtable, dout, sorted_tokens, sorted_positions, n, C);
  } else {
    embedding_backward_token_kernel<1>
        <<<grid, threads, 0, stream>>>(dtable, dout, sorted_tokens, sorted_positions, n, C);
  }
  OCTET_CUDA_CHECK_LAUNCH("embedding_backward_token_kernel");

  if (dpositions == nullptr) return;
  const int64_t TC = T * C;
  for_each(EmbeddingBackwardPosition{dpositions, dout, B, TC}, TC,
           TC % 4 == 0 && aligned16(dpositions) && aligned16(dout), stream);
  OCTET_CUDA_CHECK_LAUNCH("embedding_backward (positions)");
}

}  // namespace octet::cuda
