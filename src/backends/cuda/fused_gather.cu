// A mixture of experts' gather of rows with the FP8 cast of what it gathers (fused.h), in the same pass: an
// expert's rows gathered for its FP8 layer (its input in the forward, its output gradient in the backward)
// are written as codes and transposed codes without a float32 copy in between. Each value is expert_rows.cu's
// (one product by the row's scale, or a copy), and the cast is every producer's (fused_common.cuh).
// Bytes moved per element: read 4 (the source row), write 1 (codes) + 1 (transposed), or 4 more with the
// float32 rows kept; unfused (gather 8, cast 6) 14.
#include "fused.h"

#include <cstdint>

#include "elementwise.cuh"
#include "gathered_rows.cuh"
#include "fused_common.cuh"
#include "octet/check.h"
#include "octet/cuda/device.h"
#include "ops_common.cuh"

namespace octet::cuda {
namespace {

using elementwise::Pack;
using elementwise::store_pack;
using fused_internal::check_cast;
using fused_internal::launch_elementwise;
using fused_internal::launch_elementwise_grouped;
using ops_internal::aligned16;

// The gather's producer (fused_common.cuh describes its two steps). Element i is the flat index into out
// [M, C]; a pack of four lies in one row (the launcher asks for packs only where C % 4 == 0). The load reads
// the row's index and then its values, scaled; finish stores the float32 rows where they are kept.
struct GatherProducer {
  static constexpr bool kLoadRowsFirst = true;
  float* out;  // may be null
  const float* src;
  const int32_t* index;
  const float* scale;  // null: 1
  int64_t R;
  int64_t C;
  int64_t divisor;
  template <int W>
  using Loaded = Pack<W>;
  template <int W>
  __device__ __forceinline__ Pack<W> load(int64_t i) const {
    const int64_t m = i / C;
    return elementwise::gathered<W>(src, index, scale, R, C, divisor, m, i - m * C);
  }
  template <int W>
  __device__ __forceinline__ Pack<W> finish(const Pack<W>& x, int64_t i) const {
    if (out != nullptr) store_pack<W>(out + i, x);
    return x;
  }
  // The producer of rows r, r + 1, ... (a group's, launch_elementwise_grouped).
  __device__ __forceinline__ GatherProducer rows_from(int64_t r) const {
    return {out != nullptr ? out + r * C : nullptr, src, index + r, scale, R, C, divisor};
  }
};

}  // namespace

void gather_rows_cast(float* out, const float* src, const int32_t* index, const float* scale, int64_t M,
                      int64_t R, int64_t C, int64_t divisor, const FusedCast& cast, cudaStream_t stream) {
  OCTET_REQUIRE(
      M >= 0 && R >= 0 && C >= 0 && divisor >= 1,
      "gather_rows_cast: the shapes must not be negative and the divisor at least 1, got M {}, R {}, "
      "C {}, divisor {}",
      M, R, C, divisor);
  check_cast(cast, M * C, "gather_rows_cast");
  OCTET_REQUIRE(M * C == 0 || (src != nullptr && index != nullptr),
                "gather_rows_cast: src and index must be given");
  const bool vector = C % 4 == 0 && elementwise::pack_aligned(src) && (out == nullptr || aligned16(out));
  launch_elementwise(GatherProducer{out, src, index, scale, R, C, divisor}, vector, M, C, cast, stream);
  OCTET_CUDA_CHECK_LAUNCH("gather_rows_cast");
}

void gather_rows_cast_grouped(float* out, const float* src, const int32_t* index, const float* scale, int64_t R,
                              int64_t C, int64_t divisor, std::span<const FusedCastGroup> groups,
                              cudaStream_t stream) {
  OCTET_REQUIRE(R >= 0 && C >= 0 && divisor >= 1,
                "gather_rows_cast_grouped: the shapes must not be negative and the divisor at least 1, got R {}, "
                "C {}, divisor {}",
                R, C, divisor);
  OCTET_REQUIRE(src != nullptr && index != nullptr, "gather_rows_cast_grouped: src and index must be given");
  const bool vector = C % 4 == 0 && elementwise::pack_aligned(src) && (out == nullptr || aligned16(out));
  launch_elementwise_grouped(GatherProducer{out, src, index, scale, R, C, divisor}, vector, C, groups,
                             "gather_rows_cast_grouped", stream);
  OCTET_CUDA_CHECK_LAUNCH("gather_rows_cast_grouped");
}

}  // namespace octet::cuda
