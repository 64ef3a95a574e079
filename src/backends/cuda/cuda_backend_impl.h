// The CUDA backend's class, CudaBackend, and what its files share: device scratch memory, a layer's weight
// copy (which owns the layer's device scaling state, device_scaling.h) and the forward's saved FP8 input.
// The class's methods are defined by responsibility: cuda_backend.cu (construction, memory, op timing, the
// tensor entries), device_scaling.cu, operand_casts.cu, norm_activation.cu, linear.cu, weight_update.cu,
// attention_dispatch.cu, fusions.cu, routing.cu (mixture-of-experts routing); staged_uploads.h (small
// host-to-device copies) and grouped_casts.h (the grouped ops' casts) are parts of it that few files need.
// Internal to the CUDA backend: include only from its .cu files.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention.h"
#include "cudnn_attention.h"
#include "device_scaling.h"
#include "device_table.h"
#include "fused.h"
#include "octet/backend/cuda_backend.h"
#include "octet/check.h"
#include "octet/cuda/cast.h"
#include "octet/cuda/device.h"
#include "octet/cuda/gemm.h"
#include "octet/numerics/format.h"
#include "ops.h"
#include "staged_uploads.h"

namespace octet::cuda::backend_internal {

// Blocks of 256 threads for a grid-stride loop over n elements: at least 1, at most 4096.
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

// Device memory that grows on demand. Growing waits for the stream, so memory still in use by enqueued work
// is never freed under it.
class DeviceScratch {
 public:
  ~DeviceScratch() { cudaFree(data_); }
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes > bytes_) {
      OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaFree(data_);
      data_ = nullptr;
      OCTET_CUDA_CHECK(cudaMalloc(&data_, bytes));
      bytes_ = bytes;
      pooled_ = false;
    }
    return data_;
  }
  template <typename T>
  T* as(size_t count, cudaStream_t stream) {
    return static_cast<T*>(get(count * sizeof(T), stream));
  }
  // Frees the memory once the stream's work is done with it.
  void release(cudaStream_t stream) {
    if (data_ == nullptr) return;
    if (pooled_) {
      release_in_order(stream);
      return;
    }
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  // Memory that comes and goes every step (the weight copies of fully sharded weights): taken from the
  // device's memory pool in the stream's order (cudaMallocAsync), without waiting for the device, and given
  // back by release_in_order. Memory already held and large enough is kept.
  void* get_in_order(size_t bytes, cudaStream_t stream) {
    if (bytes > bytes_) {
      release_in_order(stream);
      OCTET_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
      bytes_ = bytes;
      pooled_ = true;
    }
    return data_;
  }
  // Gives the memory back to the pool once the work enqueued on the stream so far is done with it (memory
  // from cudaMalloc: after waiting for the stream).
  void release_in_order(cudaStream_t stream) {
    if (data_ == nullptr) return;
    if (pooled_) {
      OCTET_CUDA_CHECK(cudaFreeAsync(data_, stream));
      data_ = nullptr;
      bytes_ = 0;
      pooled_ = false;
      return;
    }
    release(stream);
  }
  bool empty() const { return data_ == nullptr; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pooled_ = false;  // from cudaMallocAsync
};

class CudaBackend;

// A releasable buffer of device memory (device_pages.cpp, Backend::allocate_releasable); null where the
// driver or the device cannot map memory chunk by chunk.
std::unique_ptr<Buffer> make_device_pages_buffer(size_t bytes);

void forget_layer(CudaBackend* backend, const DeviceLayer* layer);
struct CudaWeightCopy;
// The CUDA copy in `copy`, made there where it holds none (or another backend's).
CudaWeightCopy& cuda_weight_copy(std::unique_ptr<WeightCopy>& copy);

// How a forward GEMM's epilogue reads a bias (CudaBackend::epilogue_bias) where it is rounded: bf16 bits (FP8
// GEMMs, and GEMMs writing bf16), or float32 values rounded to bf16 (BF16 GEMMs writing float32).
enum class BiasCopy { none, bf16_bits, bf16_values };

// A linear layer's weight as its GEMMs read it. It also owns the layer's device state, so that the state
// lives exactly as long as the layer (a host state is only an address, which a later layer may reuse).
struct CudaWeightCopy final : public WeightCopy {
  DeviceScratch fp8;             // codes of W [OC, C]
  DeviceScratch fp8_transposed;  // codes of W^T [C, OC]; empty with LinearExecution::transpose_weight_per_use
  DeviceScratch wide;            // BF16/FP16 W [OC, C]
  bool has_fp8 = false;
  bool has_wide = false;
  // The layer's bias as the last forward's epilogue read it: bias_count values of bias_source in the form
  // bias_form. bias_current: `bias` holds them for the bias's present values, which holds from AdamW's pass
  // over the bias that wrote them (optimizer_update) until the weight is updated or prepared again, so
  // that the forwards in between round nothing.
  DeviceScratch bias;
  const float* bias_source = nullptr;
  int64_t bias_count = 0;
  BiasCopy bias_form = BiasCopy::none;
  bool bias_current = false;
  std::unique_ptr<DeviceLayer> layer;  // FP8 layers
  CudaBackend* owner = nullptr;        // the backend that maps host states to `layer`; outlives the copy
  ~CudaWeightCopy() override {
    if (layer != nullptr && owner != nullptr) forget_layer(owner, layer.get());
  }
};

// The CUDA backend's FP8 tensor: the codes of x [rows, cols] and of x^T in device memory, and the scale_inv
// its cast wrote. A layer's input cast (role activation) keeps x^T's codes for the weight-gradient GEMM and
// its own scale_inv; the codes of x, which only the forward GEMM reads, live in the backend's input_codes_
// until the next input cast, unless the layer's backward recomputes its forward
// (LinearExecution::keep_input_codes): then here. An output-gradient cast (role gradient) keeps both here;
// its scale_inv is the layer's device state's gradient_scale_inv.
struct CudaFp8Tensor final : public Fp8Tensor {
  DeviceScratch codes;
  DeviceScratch codes_transposed;
  DeviceScratch own_scale_inv;  // one float (input casts)
  // Where the last cast wrote, and what: the codes of x (codes or the backend's input_codes_), of x^T, and
  // the scale_inv.
  uint8_t* row_codes = nullptr;
  uint8_t* transposed = nullptr;
  float* scale_inv = nullptr;
  Dtype format = Dtype::e4m3;
  int64_t rows = 0;
  int64_t cols = 0;
  TensorRole role = TensorRole::activation;
  const ScalingState* state = nullptr;
  Fp8TensorView view() const override {
    Fp8TensorView v;
    v.codes = row_codes;
    v.codes_transposed = transposed;
    v.scale_inv = scale_inv;
    v.format = format;
    if (row_codes != nullptr || transposed != nullptr) v.shape = Shape{rows, cols};
    v.role = role;
    v.state = state;
    return v;
  }
};

class CudaBackend final : public Backend {
  // Times the ops enqueued while it lives, as one op of `kind`, when timing is on. Scopes nest: the
  // outermost one counts (prepare_weight is a cast as a whole, its inner cast not separately).
  class OpScope {
   public:
    OpScope(CudaBackend& backend, OpKind kind) : backend_(backend.timing_ ? &backend : nullptr) {
      // A bias gradient's sum on the second stream may overlap GEMMs only (see PartialSumsAside).
      if (kind != OpKind::gemm_fp8 && kind != OpKind::gemm_wide) backend.sums_aside_.join(backend.stream_);
      if (backend_ != nullptr && backend_->timing_depth_++ == 0) backend_->begin_op(kind);
    }
    ~OpScope() {
      if (backend_ != nullptr && --backend_->timing_depth_ == 0) backend_->end_op();
    }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

   private:
    CudaBackend* backend_;
  };

 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  FusionSupport supports(Fusion fusion, const LinearExecution& layer) const override;  // fusions.cu

  void set_op_timing(bool on) override {
    timing_ = on;
    if (!on) timed_used_ = 0;
  }
  OpTimes take_op_times() override;
  void* native_stream() override { return stream_; }
  void synchronize() override {
    sums_aside_.join(stream_);
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::unique_ptr<Buffer> allocate(size_t bytes) override;
  std::unique_ptr<Buffer> allocate_releasable(size_t bytes) override;
  void copy_to_host(void* host, const void* source, size_t bytes) override {
    sums_aside_.join(stream_);
    OCTET_CUDA_CHECK(cudaMemcpyAsync(host, source, bytes, cudaMemcpyDeviceToHost, stream_));
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_from_host(void* destination, const void* host, size_t bytes) override {
    sums_aside_.join(stream_);
    // The host memory may be reused as soon as this returns: a small copy goes through pinned memory of
    // the backend's own, a large one is waited for.
    if (uploads_.upload(destination, host, bytes, stream_)) return;
    OCTET_CUDA_CHECK(cudaMemcpyAsync(destination, host, bytes, cudaMemcpyHostToDevice, stream_));
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void fill_zero_ranges(float* x, std::span<const Range> ranges) override;
  void fill_zero(float* x, int64_t n) override {
    const OpScope scope(*this, OpKind::other);
    cuda::fill_zero(x, n, stream_);
  }

  // The tensor entries of the Backend interface: each checks its tensors and dispatches on their dtypes to
  // the ops on raw pointers below, which the backend's files call directly.
  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             const Fp8CastTarget& cast_for) override;
  void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                              const ConstTensorView& dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd) override;
  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                      const Fp8Operand& input) override;
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec, const Fp8Tensor& input) override;
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec, const Fp8Tensor* input,
                       const Fp8Operand& gradient) override;
  Dtype storage_type(const StorageQuery& query) const override;
  void attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                         AttentionHeads heads) override;
  void attention_backward(const TensorView& dqkv, const ConstTensorView& dout, const ConstTensorView& qkv,
                          const ConstTensorView& out, const float* lse, AttentionHeads heads) override;
  void rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                        bool inverse) override;
  void top_k_softmax(const TensorView& probs, int32_t* experts, float* weights, const ConstTensorView& logits,
                     int64_t k) override;
  void top_k_softmax_backward(const TensorView& dlogits, const ConstTensorView& probs, const int32_t* experts,
                              const float* weights, const float* dweights, int64_t k,
                              const float* dprobs) override;
  void group_by_expert(int32_t* offsets, int32_t* slots, int32_t* positions, const int32_t* experts, int64_t N,
                       int64_t k, int64_t E, int64_t align) override;
  void gather_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index, int64_t divisor,
                   const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as) override;
  void combine_rows(const TensorView& out, const float* base, const ConstTensorView& src,
                    const int32_t* positions, int64_t k, const float* weights) override;
  void scatter_rows(const TensorView& out, const ConstTensorView& src, const int32_t* index) override;
  void row_dots(float* out, const ConstTensorView& a, const ConstTensorView& src, const int32_t* positions,
                int64_t k) override;
  void column_sums(float* out, const ConstTensorView& x) override;

  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          const Fp8CastTarget& cast_for) override;
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias, const Fp8CastTarget& cast_for) override;
  void gather_rows_grouped(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                           int64_t divisor, const float* scale, const RowGroupCasts& casts,
                           TensorRole cast_as) override;
  void activation_forward_grouped(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                  const RowGroupCasts& casts) override;
  void activation_backward_grouped(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                   const ConstTensorView& dout, const RowGroupCasts& casts) override;
  double sum_of_squares(const ConstTensorView& x) override {
    return sum_of_squares_as(x.data, x.dtype, x.numel());
  }

  void embedding_forward(const TensorView& out, const int32_t* tokens, const ConstTensorView& table,
                         const ConstTensorView& positions) override;
  void embedding_backward(const TensorView& dtable, const TensorView& dpositions, const ConstTensorView& dout,
                          const int32_t* tokens) override;
  void layernorm_forward_as(void* out, Dtype out_type, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t N, int64_t C);
  void layernorm_backward_as(float* dinp, float* dweight, float* dbias, const void* dout, Dtype dout_type,
                             const float* inp, const float* weight, const float* mean, const float* rstd,
                             int64_t N, int64_t C);

  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override;
  // Weights gathered as FP8 codes (weight_parts.cu).
  void weight_part_amaxes(std::span<const WeightPart> parts, float* amaxes) override;
  void cast_weight_parts(std::span<const WeightPart> parts, const float* amaxes, uint8_t* codes) override;
  void weight_copies_from_codes(std::span<const WeightPart> parts, const uint8_t* codes) override;
  void weight_part_codes(std::span<const WeightPart> parts, uint8_t* codes) override;
  void release_weight_copies(std::span<const WeightPart> parts) override;
  void copy(void* destination, const void* source, size_t bytes) override {
    const OpScope scope(*this, OpKind::other);
    if (bytes == 0) return;
    OCTET_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void linear_recompute(float* out, const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                        int64_t C, int64_t OC, LinearExecution& exec, const Fp8Tensor& input);
  Dtype bf16_storage_type() const { return options_.hidden_in_bf16 ? Dtype::bf16 : Dtype::f32; }
  void linear_recompute_as(void* out, Dtype out_type, const float* weight, const WeightCopy* copy,
                           const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                           const Fp8Tensor& input);
  void linear_recompute_residual(float* out, const float* residual, const float* weight,
                                 const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                                 LinearExecution& exec, const Fp8Tensor& input);

  // The storage of attention's input and of its output and gradients for C channels in NH query heads and
  // KVH kv heads: the kernels' choice depends on the head size C / NH alone (octet's kernels and cuDNN's
  // take grouped-query attention wherever they take multi-head attention), so KVH only has to divide NH.
  Dtype attention_input_type(int64_t C, int64_t NH, int64_t KVH) const {
    const bool heads = KVH > 0 && NH % KVH == 0;
    return heads && cuda::attention_uses_tensor_cores(C, NH, attention_options_) ? Dtype::bf16 : Dtype::f32;
  }
  Dtype attention_output_type(int64_t C, int64_t NH, int64_t KVH) const {
    const bool cudnn = cudnn_ != nullptr && options_.attention_outputs_in_bf16;
    return cudnn && attention_input_type(C, NH, KVH) == Dtype::bf16 ? Dtype::bf16 : Dtype::f32;
  }
  void linear_forward_as(void* out, Dtype out_type, const void* inp, Dtype inp_type, const float* weight,
                         const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                         LinearExecution& exec, const Fp8Operand& input);
  void linear_forward_residual_as(float* out, const float* residual, const void* inp, Dtype inp_type,
                                  const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                                  int64_t C, int64_t OC, LinearExecution& exec, const Fp8Operand& input);
  void linear_backward_as(void* dinp, Dtype dinp_type, void* dweight, Dtype dweight_type, float* dbias,
                          const void* dout, Dtype dout_type, const void* inp, Dtype inp_type,
                          const float* weight, const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                          LinearExecution& exec, const Fp8Tensor* input, const Fp8Operand& gradient);
  // The weight-gradient GEMMs write (and add to) a bf16 gradient themselves: BF16 ones, and FP8 ones on FP8
  // tensor cores (the emulation's dequantizing epilogue writes float32).
  Dtype weight_gradient_type(const LinearExecution& exec) const {
    const bool bf16 =
        exec.weight_gradient == GemmMode::bf16 || (exec.weight_gradient == GemmMode::fp8 && !emulate_fp8_);
    return bf16 && options_.weight_gradients_in_bf16 ? Dtype::bf16 : Dtype::f32;
  }
  // Attention over NH query heads and KVH kv heads (attention_dispatch.cu).
  void attention_forward_as(void* out, Dtype out_type, float* lse, const void* qkv, Dtype qkv_type, int64_t B,
                            int64_t T, int64_t C, int64_t NH, int64_t KVH);
  void attention_backward_as(void* dqkv, const void* dout, const void* qkv, Dtype qkv_type, const void* out,
                             Dtype out_type, const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                             int64_t KVH);

  void gelu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t n);
  void layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int64_t N, int64_t C, const Fp8CastTarget& cast);
  void gelu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                            const Fp8CastTarget& cast);
  void gelu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                        int64_t n);
  void gelu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N, int64_t C,
                             float* dbias, const Fp8CastTarget& cast);
  // RMSNorm and SwiGLU (norm_activation.cu), as LayerNorm's and GELU's entries above: outputs stored as
  // `*_type`, inputs read as stored, and the consumer's FP8 cast written in the producing pass where
  // producer_casts says so.
  void rmsnorm_forward_as(void* out, Dtype out_type, float* rstd, const float* inp, const float* weight,
                          int64_t N, int64_t C);
  void rmsnorm_forward_cast(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                            int64_t C, const Fp8CastTarget& cast);
  void rmsnorm_backward_as(float* dinp, float* dweight, const void* dout, Dtype dout_type, const float* inp,
                           const float* weight, const float* rstd, int64_t N, int64_t C);
  // SwiGLU over inp [N, 2C] into out [N, C]; the backward writes dinp [N, 2C] from dout [N, C].
  void swiglu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t N, int64_t C);
  void swiglu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                              const Fp8CastTarget& cast);
  void swiglu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                          int64_t N, int64_t C);
  void swiglu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N,
                               int64_t C, float* dbias, const Fp8CastTarget& cast);
  void add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) override;
  void add(float* out, const float* a, const float* b, int64_t n) {
    const OpScope scope(*this, OpKind::other);
    cuda::add(out, a, b, n, stream_);
  }
  void round_in_place(float* x, int64_t n, Dtype dtype) override {
    const OpScope scope(*this, OpKind::casts);
    cuda::round_in_place(x, n, dtype, stream_);
  }
  void softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets, int64_t V,
                             float dloss) override;

  double sum_of_squares(const float* x, int64_t n) {
    const OpScope scope(*this, OpKind::optimizer);
    return cuda::sum_of_squares(x, n, workspace_, stream_);
  }
  double sum_of_squares_as(const void* x, Dtype type, int64_t n) {
    check_stored(type, "a gradient");
    if (type == Dtype::f32) return sum_of_squares(static_cast<const float*>(x), n);
    const OpScope scope(*this, OpKind::optimizer);
    return cuda::sum_of_squares(static_cast<const uint16_t*>(x), n, workspace_, stream_);
  }
  void count_magnitudes(MagnitudeCounts& counts, const ConstTensorView& x) override {
    check_dtype("count_magnitudes", "x", x.dtype, {Dtype::f32, Dtype::bf16});
    const OpScope scope(*this, OpKind::other);
    if (x.dtype == Dtype::f32) {
      cuda::count_magnitudes(counts, static_cast<const float*>(x.data), x.numel(), workspace_, stream_);
    } else {
      cuda::count_magnitudes(counts, static_cast<const uint16_t*>(x.data), x.numel(), workspace_, stream_);
    }
  }
  bool all_finite(const float* x, int64_t n) override {
    const OpScope scope(*this, OpKind::optimizer);
    return cuda::all_finite(x, n, workspace_, stream_);
  }
  void scale(float* x, int64_t n, float factor) override {
    const OpScope scope(*this, OpKind::optimizer);
    cuda::scale(x, n, factor, stream_);
  }
  void optimizer_update(const AdamWStep& step, const OptimizerTensors& tensors,
                        std::span<const UpdateSegment> segments) override;

  void fetch_scaling(Fp8LinearState& state) override;
  void publish_scaling(const Fp8LinearState& state) override;
  void fetch_scaling(std::span<Fp8LinearState* const> states) override;
  void publish_scaling(std::span<const Fp8LinearState* const> states) override;
  void fetch_telemetry(Fp8LinearTelemetry& telemetry) override;

  // Drops the host-state and telemetry mappings of a layer whose weight copy is going away.
  void forget(const DeviceLayer* layer) {
    if (layer->pending != 0) apply_scaling_updates();
    std::erase_if(layers_, [layer](const auto& entry) { return entry.second == layer; });
    std::erase_if(telemetry_layers_, [layer](const auto& entry) { return entry.second == layer; });
  }

 private:
  using Layer = DeviceLayer;
  // The device state of an FP8 layer, made with its weight copy (from the host state as it is then).
  Layer& layer_of(LinearExecution& exec, CudaWeightCopy& copy);
  Layer& prepared_layer(LinearExecution& exec, const CudaWeightCopy* copy);
  // The scale a cast of `operand` uses, in device memory. Applies the pending updates first when this operand
  // has one. Delayed scaling reads the state's scale itself; current scaling takes x's amax (x [n]) first;
  // the others write it to `slot`.
  const float* begin_cast(Layer& layer, int operand, Dtype format, const float* x, int64_t n, float* slot);
  // Records the cast's scaling update and telemetry, applied with the others by apply_scaling_updates.
  void end_cast(Layer& layer, int operand, Dtype format, int64_t n, bool update, bool count);
  // One kernel for every pending scaling update.
  void apply_scaling_updates();
  // Casts x [rows, cols] as `operand` of the layer, writing codes and their transpose.
  void cast_operand(Layer& layer, int operand, Dtype format, const float* x, int64_t rows, int64_t cols,
                    uint8_t* codes, uint8_t* codes_transposed, float* scale_out, float* scale_inv_out,
                    bool update, const LinearExecution& exec);
  // cast_operand's cast of a part of x [n] (no transpose) whose whole amax is known: *amax (device memory)
  // takes the place of the part's own in the scale and in the scaling update (cast_weight_parts).
  void cast_operand_part(Layer& layer, int operand, Dtype format, const float* amax, const float* x, int64_t n,
                         uint8_t* codes, float* scale_out, float* scale_inv_out, const LinearExecution& exec);
  // The device state of an FP8 layer whose weight copy exists (prepare_weight made it).
  Layer& mapped_layer(LinearExecution& exec);
  // The cast in `tensor` that a GEMM of exec's layer reads: [rows, cols], cast as `role` of that layer;
  // refused otherwise, naming `op`.
  static const CudaFp8Tensor& cast_of(const Fp8Tensor* tensor, const LinearExecution& exec, TensorRole role,
                                      int64_t rows, int64_t cols, std::string_view op);
  // The cast that an FP8 layer's forward kept with the codes of x [N, C], for linear_recompute.
  static const CudaFp8Tensor* recomputed_input(const Fp8Tensor& input, const LinearExecution& exec, int64_t N,
                                               int64_t C);
  // The input tensor in `slot` of an FP8 layer, sized for a cast of x [N, C]. Its codes of x go to the
  // tensor where the layer keeps them, else to the backend's input_codes_: at its start, as the only input
  // codes there (input_codes_for_), or at `shared` within it, beside the other groups' of a grouped cast
  // (produce_grouped clears input_codes_for_ first).
  CudaFp8Tensor& input_tensor(std::unique_ptr<Fp8Tensor>* slot, const LinearExecution& exec, int64_t N,
                              int64_t C, uint8_t* shared = nullptr);
  // The output-gradient tensor in `slot` of an FP8 layer, sized for a cast of dout [N, OC].
  CudaFp8Tensor& gradient_tensor(std::unique_ptr<Fp8Tensor>* slot, Layer& layer, const LinearExecution& exec,
                                 int64_t N, int64_t OC);
  // Casts the forward's input x [N, C] into the tensor in `slot`.
  void cast_input(const float* x, int64_t N, int64_t C, LinearExecution& exec,
                  std::unique_ptr<Fp8Tensor>* slot);
  // The same for a bf16 input (its bits): in one pass that reads the bf16 values where producer_casts(exec),
  // else cast_input of their float32 values.
  void cast_input_bf16(const uint16_t* x, int64_t N, int64_t C, LinearExecution& exec,
                       std::unique_ptr<Fp8Tensor>* slot);
  // Refuses a storage type other than f32 and bf16 for `what`.
  static void check_stored(Dtype type, std::string_view what) {
    OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "{} stored in f32 or bf16, got {}", what,
                dtype_name(type));
  }
  // An FP8 forward's input cast (null for other forwards): the producer's, or made of inp now (Fp8Operand).
  const CudaFp8Tensor* forward_input(const ConstTensorView& inp, const CudaWeightCopy* copy,
                                     LinearExecution& exec, const Fp8Operand& input);
  // x as float32: itself, or its bf16 values widened into widened_[slot]. (The tensors stored as float32 or
  // bf16: attention's output and the gradients on either side of it, the MLP's hidden activation and its
  // gradient, a linear layer's input where its GEMMs are BF16.)
  const float* as_f32(const ConstTensorView& x, int slot);
  // x as a GEMM in `mode` (BF16 or FP16) reads it: a 16-byte aligned bf16 x itself in BF16 mode, else
  // its wide_copy (in wide_[slot]).
  const void* as_wide(const ConstTensorView& x, GemmMode mode, int slot);
  // Whether a producer may write the layer's input cast in its own pass: supports(Fusion::input_cast), which
  // holds where the recipe knows the scale before the cast (delayed, static) and no SQNR pass needs the
  // float values. The output gradient's cast fuses on the same terms.
  bool producer_casts(const LinearExecution& exec) const;
  // The input cast written by a producer kernel: prepares the scale, lets `write` run the producer with the
  // FusedCast it is given, then updates the scaling state and telemetry as cast_operand does.
  template <typename Write>
  void producer_cast(int64_t N, int64_t C, LinearExecution& exec, std::unique_ptr<Fp8Tensor>* slot,
                     Write write);
  // A normalization or activation forward [N, C] that casts its output for the FP8 layer of `target`
  // (Backend::normalization_forward and activation_forward with a cast target): `fused(cast)` writes out
  // (when not null) and the cast in one pass where producer_casts says so; otherwise `plain(y)` writes the
  // float32 output into y (out, or scratch where out is null) and cast_input casts it.
  template <typename Fused, typename Plain>
  void produce_input(float* out, int64_t N, int64_t C, const Fp8CastTarget& target, Fused fused, Plain plain);
  // The grouped ops' casts (Backend::gather_rows_grouped and the grouped activations) of the producer's rows
  // out [M, width] (null: not written) for each group's layer, as its input (`role` activation: the codes
  // of x side by side in input_codes_) or its output gradient: where producer_casts, every such group's
  // cast by `fused(groups)` (std::span<const cuda::FusedCastGroup>, one format a call), then each group's
  // end_cast; else `plain(row0, rows, y)` writes the group's float32 rows to y and the layer's own cast
  // follows. A group without a target is only `plain`, into out.
  template <typename Fused, typename Plain>
  void produce_grouped(float* out, int64_t M, int64_t width, const RowGroupCasts& casts, TensorRole role,
                       Fused fused, Plain plain);
  // gather_rows with a cast target: the rows' cast for the consumer's input (as produce_input) or output
  // gradient (as an activation backward's target), in the gather's pass where producer_casts says so.
  void gather_rows_cast(const TensorView& out, const ConstTensorView& src, const int32_t* index,
                        int64_t divisor, const float* scale, const Fp8CastTarget& cast_for, TensorRole cast_as);
  // Casts the backward's output gradient dout [N, OC] as the layer's gradient operand into the tensor in
  // `slot` (linear_backward's cast; gelu_backward_cast's where it cannot fuse), and adds the column sums of
  // dout to dbias when given: in the cast's own pass where producer_casts(exec), else by bias_backward
  // before the cast.
  void cast_gradient(Layer& layer, const float* dout, int64_t N, int64_t OC, const LinearExecution& exec,
                     std::unique_ptr<Fp8Tensor>* slot, float* dbias = nullptr);
  // The same for a bf16 dout (its bits): in one pass that reads the bf16 values where producer_casts(exec),
  // else cast_gradient of their float32 values.
  void cast_gradient_bf16(Layer& layer, const uint16_t* dout, int64_t N, int64_t OC,
                          const LinearExecution& exec, std::unique_ptr<Fp8Tensor>* slot, float* dbias);
  // The FusedCast of a gradient dout [N, C] as the layer's gradient operand, for a kernel that writes the
  // cast in its own pass (bias_backward_cast, gelu_backward_cast): the scale from begin_cast, the codes into
  // the tensor in `slot`, scale_inv and results in the layer's state. The caller runs the kernel and then
  // end_cast.
  FusedCast gradient_fused_cast(Layer& layer, const LinearExecution& exec, int64_t N, int64_t C,
                                std::unique_ptr<Fp8Tensor>* slot);
  // The FusedCast of n values as `operand` of the layer in `format` into t, as producer_cast and
  // gradient_fused_cast take it: the scale from begin_cast, t's codes and scale_inv, the layer's results.
  FusedCast fused_cast_into(Layer& layer, int operand, Dtype format, const CudaFp8Tensor& t, int64_t n);
  // D [M, N] (=|+=) A [M, K] x B [N, K]^T on FP8 codes with dequantizing scales (device pointers), plus
  // a BF16 bias [N] when not null (never with accumulate).
  // With d_bf16 (FP8 tensor cores only; d null, no accumulate) the result is written as bf16 there instead.
  void fp8_gemm(float* d, const uint8_t* a, Dtype a_format, const float* a_scale_inv, const uint8_t* b,
                Dtype b_format, const float* b_scale_inv, int64_t M, int64_t N, int64_t K, bool accumulate,
                bool fast_accumulation, const __nv_bfloat16* bias = nullptr, __nv_bfloat16* d_bf16 = nullptr,
                const float* addend = nullptr);
  // The bias [OC] of a forward GEMM in `mode` as its epilogue adds it (GemmProblem::bias): rounded to BF16
  // (FP8 and BF16 GEMMs) or FP16, or float32 for float32 GEMMs; in 16-byte aligned scratch where it is
  // converted or misaligned. Null for a null bias. A GEMM writing bf16 takes a bf16 bias in every mode
  // (bf16_output).
  // With the layer's weight copy, made there (CudaWeightCopy::bias), and taken from there where AdamW
  // wrote it.
  const void* epilogue_bias(const float* bias, int64_t OC, GemmMode mode, bool bf16_output = false,
                            CudaWeightCopy* copy = nullptr);
  const void* wide_copy(const float* x, int64_t n, GemmMode mode, int slot);
  // linear_forward's GEMM, writing float32 to out or, with out_bf16 instead (BF16 GEMMs, and FP8 ones on FP8
  // tensor cores), bf16 there. An FP8 GEMM reads its input's cast `codes` (forward_input); with `recompute`:
  // linear_recompute's, on the kept codes, uncounted.
  // With an addend (float32 out only, not with emulated FP8): out = addend + the product, in the epilogue.
  void forward_gemm(float* out, __nv_bfloat16* out_bf16, const ConstTensorView& inp, const float* weight,
                    const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                    LinearExecution& exec, const CudaFp8Tensor* codes, bool recompute = false,
                    const float* addend = nullptr);
  // forward_gemm with its output stored as `out_type`: a bf16 output from the GEMM's epilogue where the GEMM
  // can write bf16 (16-byte aligned, BF16 or FP8 on FP8 tensor cores), else the float32 result rounded to
  // bf16 after.
  void forward_gemm_as(void* out, Dtype out_type, const ConstTensorView& x, const float* weight,
                       const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                       LinearExecution& exec, const CudaFp8Tensor* codes, bool recompute);
  // A BF16, FP16 or FP32 GEMM.
  void wide_gemm(const GemmProblem& p) {
    const OpScope scope(*this, OpKind::gemm_wide);
    gemm_->run(p, stream_);
  }
  // dinp [N, C] = dout [N, OC] x W [OC, C] with dout and the weight copy already in `mode`'s type (BF16 or
  // FP16); dinp is the GEMM's float32 result, or, with dinp_bf16 instead (BF16 mode), that rounded to bf16.
  void wide_input_gradient(float* dinp, const void* dout_wide, const void* weight_wide, int64_t N, int64_t C,
                           int64_t OC, GemmMode mode, LinearExecution& exec,
                           __nv_bfloat16* dinp_bf16 = nullptr);
  // dweight [OC, C] += dout^T [OC, N] x inp [N, C] (= where exec.accumulate_weight_gradient is false), both
  // operands of `type`; accumulated in float32. With dweight_bf16 instead (BF16 operands), the sum is
  // rounded to bf16 there.
  void weight_gradient_gemm(float* dweight, GemmType type, const void* dout, const void* inp, int64_t N,
                            int64_t C, int64_t OC, LinearExecution& exec,
                            __nv_bfloat16* dweight_bf16 = nullptr);
  // The BF16/FP16 copy of a weight, where one of the layer's GEMMs on it runs in that type.
  void make_wide_weight(CudaWeightCopy& w, const float* weight, int64_t OC, int64_t C,
                        const LinearExecution& exec);
  // The FP8 cast of a weight that the AdamW pass writes (where fuses_weight_cast): begin_weight_cast before
  // the kernel, end_weight_cast after it.
  FusedCast begin_weight_cast(std::unique_ptr<WeightCopy>& copy, int64_t OC, int64_t C,
                              LinearExecution& exec);
  void end_weight_cast(WeightCopy& copy, const float* params, int64_t OC, int64_t C, LinearExecution& exec);
  // optimizer_update's passes that do not join a launch across segments: a weight by itself (its copy made
  // in the AdamW pass where it can be, else by prepare_weight after it), and the plain AdamW of one segment.
  // optimizer_update's passes over segments of one learning rate (`step`'s), grouped by what they write.
  void update_segments(const AdamWStep& step, const OptimizerTensors& tensors,
                       std::span<const UpdateSegment> segments);
  void update_weight_alone(const AdamWStep& step, const OptimizerTensors& tensors,
                           const UpdateSegment& weight);
  void update_segment_alone(const AdamWStep& step, const OptimizerTensors& tensors,
                            const UpdateSegment& segment);
  // optimizer_update's one launch over the segments without a weight copy (plain tensors and biases, whose
  // rounded copies it writes where the layer's forward keeps one).
  void update_tensors(const AdamWStep& step, const OptimizerTensors& tensors,
                      std::span<const UpdateSegment* const> segments);
  // A weight copy's BF16 half of n values, for the AdamW kernel that writes it (where writes_bf16_copy).
  __nv_bfloat16* bf16_weight_copy(std::unique_ptr<WeightCopy>& copy, int64_t n);
  // Where a weight cast writes the codes of W^T (n of them): the copy's own buffer, or null (not written;
  // the buffer freed) with exec.transpose_weight_per_use.
  uint8_t* weight_codes_transposed(CudaWeightCopy& w, size_t n, const LinearExecution& exec);
  // The codes of W^T [C, OC] for the input-gradient GEMM: the copy's own, or W's transposed into
  // weight_transposed_ now (exec.transpose_weight_per_use).
  const uint8_t* weight_transposed_for_gemm(CudaWeightCopy& w, int64_t OC, int64_t C,
                                            const LinearExecution& exec);

  struct TimedOp {
    OpKind kind;
    cudaEvent_t start;
    cudaEvent_t stop;
  };
  void begin_op(OpKind kind);
  void end_op() { OCTET_CUDA_CHECK(cudaEventRecord(timed_[timed_used_++].stop, stream_)); }

  bool timing_ = false;
  int timing_depth_ = 0;
  std::vector<TimedOp> timed_;  // events reused from take to take
  size_t timed_used_ = 0;

  // The second stage of the fused bias gradients (cuda::PartialSums): a small launch that adds the tile sums,
  // run on a second stream beside the backward GEMMs that follow the cast, instead of between them on the
  // training stream. The training stream waits for it (join) before every op but a GEMM, before anything
  // that reads device memory from the host, and before column_partials_ is written again (each such op
  // opens an OpScope of another kind first).
  class PartialSumsAside {
   public:
    PartialSumsAside() = default;
    PartialSumsAside(const PartialSumsAside&) = delete;
    PartialSumsAside& operator=(const PartialSumsAside&) = delete;
    ~PartialSumsAside() {
      if (written_ != nullptr) (void)cudaEventDestroy(written_);
      if (done_ != nullptr) (void)cudaEventDestroy(done_);
    }
    // For one fused kernel's second stage; the caller's stream must join before dbias is read.
    cuda::PartialSums next() {
      if (stream_ == nullptr) {
        stream_ = std::make_unique<cuda::Stream>();
        OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&written_, cudaEventDisableTiming));
        OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      }
      pending_ = true;
      return {stream_->get(), written_, done_, &workspace_};
    }
    // `stream` waits for the last second stage queued, if any since the last join.
    void join(cudaStream_t stream) {
      if (!pending_) return;
      OCTET_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
      pending_ = false;
    }
    void synchronize() {
      if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_->get());
    }

   private:
    std::unique_ptr<cuda::Stream> stream_;
    cudaEvent_t written_ = nullptr;
    cudaEvent_t done_ = nullptr;
    Workspace workspace_;
    bool pending_ = false;
  };

  CudaBackendOptions options_;
  CudaDeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmEngine> gemm_;
  Workspace workspace_;
  PartialSumsAside sums_aside_;
  AttentionOptions attention_options_;
  AttentionWorkspace attention_workspace_;
  // cuDNN's fused attention where it was loaded (CudaBackendOptions::attention), the reason where not, the
  // shapes it refused (each warned about once), and the bf16 staging of out, dout and dqkv.
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  std::string cudnn_why_not_;
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> cudnn_refused_;
  DeviceScratch attention_bf16_[3];
  // Where octet's kernels run attention whose output and gradients are stored in bf16: float32 staging of
  // out, dout and dqkv.
  DeviceScratch attention_f32_[3];

  // Whether this attention call runs on cuDNN: loaded, bf16 q, k, v at 16-byte aligned addresses, and an
  // engine for the shape (a refused shape runs octet's kernels, with one warning per shape on stderr).
  bool use_cudnn(const void* qkv, Dtype qkv_type, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t KVH);
  bool emulate_fp8_ = false;
  std::vector<ScalingUpdate> pending_updates_;
  std::vector<Layer*> pending_layers_;
  std::unordered_map<const Fp8LinearState*, Layer*> layers_;
  // Pinned host records for fetch_scaling and publish_scaling, and the addresses of the device records they
  // stand for (pinned too, the device's copy in state_addresses_).
  DeviceLayerState* pinned_layer_states(size_t count);
  // The device records of those of `states` that the device holds (`found`: each one's index in `states` and
  // its record), read into pinned host records with one wait; null when it holds none. The records are
  // packed on the device first (state_staging_) and travel in one copy, not one copy each: data-parallel
  // training moves every FP8 layer's records several times a step, between the backward and the update.
  DeviceLayerState* read_layer_states(std::span<const Fp8LinearState* const> states,
                                      std::vector<std::pair<size_t, DeviceLayerState*>>& found);
  // Writes the pinned host records back to the device records `found` names (as read_layer_states read
  // them last), in one copy, and waits.
  void write_layer_states(const std::vector<std::pair<size_t, DeviceLayerState*>>& found);
  DeviceLayerState* pinned_states_ = nullptr;
  DeviceLayerState** pinned_state_addresses_ = nullptr;
  size_t pinned_states_capacity_ = 0;
  DeviceScratch state_staging_, state_addresses_;
  std::unordered_map<const Fp8LinearTelemetry*, Layer*> telemetry_layers_;
  DeviceScratch wide_[2], emulation_[3], producer_output_, column_partials_;
  // A bf16 weight gradient widened for an AdamW update that reads float32 (update_weight_alone).
  DeviceScratch widened_gradient_;
  DeviceScratch bias_;  // a forward GEMM's bias as its epilogue reads it
  // The chunks of the segmented AdamW update and of the segmented zeroing.
  DeviceTable<Chunk> adamw_chunks_;
  DeviceTable<Chunk> zero_chunks_;
  // The weights of the multi-weight AdamW cast and BF16 copy (optimizer_update).
  cuda::AdamWCastTable adamw_casts_;
  cuda::AdamWConvertTable adamw_converts_;
  // bf16 operands of a linear layer widened to float32 where a GEMM or cast cannot read them as they are
  // (as_f32): slot 0 for dout (or the forward's input), 1 for the backward's input; slot 2 stages a float32
  // input gradient that is stored in bf16.
  DeviceScratch widened_[3];
  // The row-major codes of the last input cast (cast_input, producer_cast), x [N, C], for its forward GEMM,
  // and whose they are: one buffer for every layer, as each forward GEMM follows its input's cast (or a
  // grouped op's casts, each group's codes at its rows, and then the groups' GEMMs) and only the transposed
  // codes are kept for the backward.
  DeviceScratch input_codes_;
  std::vector<const CudaFp8Tensor*> input_codes_for_;  // whose codes of x input_codes_ holds
  StagedUploads uploads_;  // copy_from_host's small copies
  // The codes of W^T of the layer whose input-gradient GEMM runs next, transposed from W's just before it,
  // for every layer with transpose_weight_per_use.
  DeviceScratch weight_transposed_;
  // weight_part_amaxes: each part's amax and counts, before they go to the caller's amaxes.
  DeviceScratch part_results_;
};

template <typename Write>
void CudaBackend::producer_cast(int64_t N, int64_t C, LinearExecution& exec, std::unique_ptr<Fp8Tensor>* slot,
                                Write write) {
  Layer& layer = mapped_layer(exec);
  const Dtype format = exec.formats.activation;
  write(fused_cast_into(layer, kActivation, format, input_tensor(slot, exec, N, C), N * C));
  end_cast(layer, kActivation, format, N * C, exec.update_scaling, exec.telemetry != nullptr);
}

template <typename Fused, typename Plain>
void CudaBackend::produce_input(float* out, int64_t N, int64_t C, const Fp8CastTarget& target, Fused fused,
                                Plain plain) {
  LinearExecution& consumer = *target.layer;
  OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
  OCTET_CHECK(out != nullptr || input_cast_suffices(consumer),
              "the output kept for a consumer that reads it");
  if (producer_casts(consumer)) {
    producer_cast(N, C, consumer, target.tensor, fused);
    return;
  }
  float* y = out != nullptr ? out : producer_output_.as<float>(static_cast<size_t>(N * C), stream_);
  plain(y);
  cast_input(y, N, C, consumer, target.tensor);
}

}  // namespace octet::cuda::backend_internal
