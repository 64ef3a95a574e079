// The collectives' names, and the reductions of communicator.h, one rank's values folded into the running result at a time, in rank
// order: the arithmetic that every CPU communicator (InProcessGroup, SocketGroup) shares, so that ranks as
// threads and ranks as processes give the same bits. Internal to src/dist/.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "octet/numerics/minifloat.h"

namespace octet::dist {

// The collectives, for the messages that say which one the ranks disagreed on or failed in.
enum class CollectiveOp : uint8_t {
  all_reduce_sum_f32,
  all_reduce_sum_bf16,
  all_reduce_sum_f64,
  all_reduce_max_f32,
  reduce_scatter_sum_f32,
  all_gather_f32,
  all_gather_bytes,
  broadcast,
  barrier,
  reduce_scatter_sum_in_place_f32,
  reduce_scatter_sum_in_place_bf16
};

inline const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce_sum_f32:
      return "all_reduce_sum (float32)";
    case CollectiveOp::all_reduce_sum_bf16:
      return "all_reduce_sum (bf16)";
    case CollectiveOp::all_reduce_sum_f64:
      return "all_reduce_sum (float64)";
    case CollectiveOp::all_reduce_max_f32:
      return "all_reduce_max (float32)";
    case CollectiveOp::reduce_scatter_sum_f32:
      return "reduce_scatter_sum (float32)";
    case CollectiveOp::all_gather_f32:
      return "all_gather (float32)";
    case CollectiveOp::all_gather_bytes:
      return "all_gather (bytes)";
    case CollectiveOp::broadcast:
      return "broadcast";
    case CollectiveOp::barrier:
      return "barrier";
    case CollectiveOp::reduce_scatter_sum_in_place_f32:
      return "reduce_scatter_sum_in_place (float32)";
    case CollectiveOp::reduce_scatter_sum_in_place_bf16:
      return "reduce_scatter_sum_in_place (bf16)";
  }
  return "an unknown collective";
}

namespace rank_order {

// result[i] = result[i] + next[i], in the values' own type.
template <typename T>
void add(T* result, const T* next, size_t n) {
  for (size_t i = 0; i < n; ++i) result[i] = result[i] + next[i];
}

// BF16 codes: the sum of the two in float32, rounded to BF16 (to nearest even), as a BF16 all-reduce rounds
// at every hop.
inline void add_bf16(uint16_t* result, const uint16_t* next, size_t n) {
  for (size_t i = 0; i < n; ++i)
    result[i] = float_to_bf16(bf16_to_float(result[i]) + bf16_to_float(next[i]));
}

// The larger of the two; the first NaN in rank order wins, so that every rank keeps the same bits.
inline void max(float* result, const float* next, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isnan(result[i]) && (std::isnan(next[i]) || next[i] > result[i])) result[i] = next[i];
  }
}

}  // namespace rank_order
}  // namespace octet::dist
