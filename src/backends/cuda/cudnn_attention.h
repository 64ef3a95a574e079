// Causal self-attention through cuDNN's fused flash-attention engines (its graph API, the same engines
// PyTorch's scaled_dot_product_attention picks on Hopper). The library is loaded at run time (dlopen of
// libcudnn.so.9), so octet neither links against cuDNN nor needs it installed: where it cannot be loaded, or
// has no engine for a shape, the caller learns why and runs octet's own kernels (attention.h) instead.
//
// Same layouts as attention.h, with bf16 activations:
//   qkv   [B, T, C + 2 KVH hs] bf16: q (NH heads of hs = C / NH), then k and v (KVH heads each, KVH dividing
//                    NH: grouped-query attention, query head h reading kv head h / (NH / KVH); KVH = NH:
//                    multi-head attention, qkv [B, T, 3C])
//   out   [B, T, C]  bf16
//   lse   [B, NH, T] float32, natural log of the row's softmax denominator, max included (the same quantity
//                    as attention.h's lse, so either implementation's forward can feed the other's backward)
//   dout  [B, T, C]  bf16
//   dqkv  qkv's shape, bf16 (overwritten; a kv head's gradient summed over its group's query heads)
// Grouped-query attention is cuDNN's own: the K and V tensors of the graphs have KVH heads (strides into the
// packed qkv row), the products broadcast them over the query heads, and the backward's dK and dV are
// per-query-head products reduced over each group (a reduction node, as cuDNN's frontend builds it).
// The products run on BF16 tensor cores with float32 accumulation; softmax and its statistics are float32.
// The backward uses only engines without cuDNN's "non-deterministic" note; even so, the one cuDNN 9.19 picks
// on Hopper adds the blocks' parts of dQ into its float32 accumulator atomically, and at training sizes a
// few dQ elements round differently from run to run (test
// CudnnAttention.RepeatedBackwardsAtTrainingShapes). octet's own kernels (attention.h) repeat bit for bit.
// Internal to the CUDA backend.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <cuda_runtime_api.h>

#include "octet/cuda/device.h"

namespace octet::cuda {

struct CudnnApi;   // the entry points taken from the loaded library
struct CudnnPlan;  // one finalised execution plan and everything it refers to

class CudnnAttention {
 public:
  // nullptr where libcudnn.so.9 cannot be loaded, lacks an entry point, is older than 9.0, or cannot create a
  // handle; *why_not then says which (with what the user can do about it).
  static std::unique_ptr<CudnnAttention> load(std::string* why_not);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // "9.19.0"
  const std::string& version() const { return version_; }

  // Whether cuDNN has engines (without the non-deterministic note) for the forward and the backward of this
  // shape. Builds and keeps both plans (the first call per shape costs milliseconds to seconds; later calls
  // are a map lookup). On false, *why_not says what cuDNN answered.
  bool supports(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH, std::string* why_not);
  bool supports(int64_t B, int64_t T, int64_t C, int64_t NH, std::string* why_not) {
    return supports(B, T, C, NH, NH, why_not);
  }

  // The engines chosen for this shape, e.g. "forward engine 2, backward engine 6" (after supports()).
  std::string engines(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH);
  std::string engines(int64_t B, int64_t T, int64_t C, int64_t NH) { return engines(B, T, C, NH, NH); }

  // Both require supports(B, T, C, NH, KVH) to have returned true. Pointers must be 16-byte aligned and C * 2
  // bytes a multiple of 16. The overloads without KVH are multi-head attention.
  void forward(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
               int64_t KVH, cudaStream_t stream);
  void forward(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
               cudaStream_t stream) {
    forward(out, lse, qkv, B, T, C, NH, NH, stream);
  }
  void backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH,
                cudaStream_t stream);
  void backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, cudaStream_t stream) {
    backward(dqkv, dout, qkv, out, lse, B, T, C, NH, NH, stream);
  }

 private:
  CudnnAttention() = default;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;  // B, T, C, NH, KVH
  struct Plans;
  Plans& plans_for(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH);
  void* reserve_workspace(size_t bytes, cudaStream_t stream);
  // The backward's float32 dQ accumulator of at least `bytes`, all zero once `stream` gets there.
  void* zeroed_accumulator(size_t bytes, cudaStream_t stream);
  // Zeroes the accumulator again after the backward just queued on `stream`, on a stream of its own.
  void zero_accumulator_after(cudaStream_t stream);

  std::unique_ptr<CudnnApi> api_;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::string version_;
  std::map<Key, std::unique_ptr<Plans>> plans_;
  DeviceBuffer<uint8_t> workspace_;
  // The backward's dQ accumulator, which cuDNN adds into and which must start at zero (B*T*C floats: 52 MB a
  // layer at GPT-2 1.5B's batch). Each backward zeroes it for the next one on `zeroing_`, after the event
  // `used_`; the next backward waits for `zeroed_`. So the zeroing runs beside the GEMMs that follow the
  // backward, compute-bound, instead of in front of the next backward on the caller's stream.
  DeviceBuffer<uint8_t> accumulator_;
  std::unique_ptr<Stream> zeroing_;
  cudaEvent_t used_ = nullptr;
  cudaEvent_t zeroed_ = nullptr;
  bool accumulator_zeroed_ = false;  // whether the last record of zeroed_ zeroes the whole accumulator
};

}  // namespace octet::cuda
