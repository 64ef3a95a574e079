// The CUDA backend: the Backend interface on one NVIDIA GPU. Every op is enqueued on the backend's stream and
// nothing waits for the host inside a step: FP8 casts read their scale from device memory and a one-thread
// kernel after each cast applies the recipe's update there, exactly as the CPU reference does on the host
// (src/numerics/*_scaling.cpp), so the two backends walk the same scaling states. The host copy of a state
// is brought up to date only when asked (fetch_scaling: checkpoints, telemetry, tests).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "attention.h"
#include "cudnn_attention.h"
#include "device_table.h"
#include "fused.h"
#include "octet/backend/cuda_backend.h"
#include "octet/check.h"
#include "octet/cuda/cast.h"
#include "octet/cuda/device.h"
#include "octet/cuda/gemm.h"
#include "octet/numerics/format.h"
#include "ops.h"

namespace octet {
namespace cuda {
namespace {

constexpr int kMaxHistory = 1024;  // fp8.amax_history's upper bound (src/config/run_config.cpp)
constexpr int kActivation = 0, kWeight = 1, kGradient = 2;

// ScalingState of one operand, in device memory. The history is a fixed array: [0] is the most recent.
struct DeviceTensorScaling {
  float scale;
  float scale_inv;
  float last_amax;
  int32_t history_length;  // 0 for recipes without a history
  unsigned long long updates;
  unsigned long long degenerate;
  float history[kMaxHistory];
};

struct DeviceCastTelemetry {
  unsigned long long casts;
  unsigned long long elements;
  unsigned long long nonzero;
  unsigned long long saturated;
  unsigned long long underflowed;
  double signal_energy;
  double noise_energy;
};

// Everything the device keeps for one FP8 linear layer.
struct DeviceLayerState {
  DeviceTensorScaling tensor[3];  // activation, weight, gradient
  // Scales a GEMM reads sit 16 bytes apart: cuBLASLt refuses scale pointers with less alignment.
  alignas(16) float weight_copy_scale;   // the scale the weight copy was cast with (weight_copy_scale)
  alignas(16) float weight_scale_inv;    // its inverse, as the cast wrote it: the weight's dequantizing scale
  alignas(16) float gradient_scale_inv;  // the last gradient cast's
  alignas(16) float cast_scale[3];       // the scale of the cast in flight, per operand
  CastResults results[3];                // what the last cast of each operand saw
  DeviceCastTelemetry telemetry[3];
};

// A scaling recipe as plain numbers for the device.
struct RecipeParameters {
  RecipeKind kind;
  int margin;
  bool most_recent;
  float static_scale;
};

RecipeParameters recipe_parameters(const ScalingRecipe& recipe) {
  RecipeParameters p{recipe.kind(), 0, false, 1.0f};
  switch (recipe.kind()) {
    case RecipeKind::current:
      p.margin = static_cast<const CurrentScaling&>(recipe).margin();
      break;
    case RecipeKind::delayed: {
      const auto& d = static_cast<const DelayedScaling&>(recipe);
      OCTET_REQUIRE(d.history_length() <= kMaxHistory,
                    "the CUDA backend keeps amax histories of at most {} steps, the recipe asks for {}",
                    kMaxHistory, d.history_length());
      p.margin = d.margin();
      p.most_recent = d.algorithm() == AmaxAlgorithm::most_recent;
      break;
    }
    case RecipeKind::static_scale:
      p.static_scale = static_cast<const StaticScaling&>(recipe).scale();
      break;
    case RecipeKind::block:
    case RecipeKind::mxfp8:
      OCTET_REQUIRE(false,
                    "fp8.recipe = \"{}\" is not supported on the CUDA backend yet (its GEMMs need per-block "
                    "scales in the tensor cores' main loop); use \"delayed\", \"current\" or \"static\" on "
                    "the GPU, or train.device = \"cpu\"",
                    recipe_name(recipe.kind()));
      break;
  }
  return p;
}

// scale_from_amax of src/numerics/scaling.cpp, in the same double arithmetic.
__device__ float device_scale_from_amax(float amax, float fp8_max, int margin, float previous,
                                        bool* degenerate) {
  if (!(amax > 0.0f) || !isfinite(amax)) {
    *degenerate = true;
    return previous;
  }
  *degenerate = false;
  const double scale = static_cast<double>(fp8_max) / static_cast<double>(amax) / ldexp(1.0, margin);
  return scale > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(scale);
}

// ScalingRecipe::cast_scale: the scale this cast uses. `pre` holds the tensor's amax for current scaling.
__global__ void prepare_scale_kernel(DeviceLayerState* s, int operand, RecipeParameters r, float fp8_max,
                                     const CastResults* pre, float* out) {
  const DeviceTensorScaling& t = s->tensor[operand];
  bool unused = false;
  switch (r.kind) {
    case RecipeKind::current:
      *out = device_scale_from_amax(pre->amax, fp8_max, r.margin, t.scale, &unused);
      break;
    case RecipeKind::static_scale:
      *out = r.static_scale;
      break;
    default:
      *out = t.scale;
      break;
  }
}

// ScalingRecipe::update after a cast, and the cast's telemetry.
__device__ void apply_scaling_update(DeviceLayerState* s, int operand, RecipeParameters r, float fp8_max,
                                     unsigned long long elements, bool update, bool count) {
  DeviceTensorScaling& t = s->tensor[operand];
  const CastResults& c = s->results[operand];
  if (count) {
    DeviceCastTelemetry& tel = s->telemetry[operand];
    tel.casts += 1;
    tel.elements += elements;
    tel.nonzero += c.nonzero;
    tel.saturated += c.saturated;
    tel.underflowed += c.underflowed;
  }
  if (!update) return;
  const float amax = c.amax;
  bool degenerate = false;
  switch (r.kind) {
    case RecipeKind::current:
      t.scale = device_scale_from_amax(amax, fp8_max, r.margin, t.scale, &degenerate);
      t.scale_inv = __fdiv_rn(1.0f, t.scale);
      t.last_amax = amax;
      t.updates += 1;
      if (degenerate) t.degenerate += 1;
      break;
    case RecipeKind::delayed: {
      t.last_amax = amax;
      t.updates += 1;
      if (!isfinite(amax)) {
        t.degenerate += 1;
        break;
      }
      for (int i = t.history_length - 1; i > 0; --i) t.history[i] = t.history[i - 1];
      t.history[0] = amax;
      float window = t.history[0];
      if (!r.most_recent) {
        for (int i = 1; i < t.history_length; ++i) window = t.history[i] > window ? t.history[i] : window;
      }
      t.scale = device_scale_from_amax(window, fp8_max, r.margin, t.scale, &degenerate);
      t.scale_inv = __fdiv_rn(1.0f, t.scale);
      if (degenerate) t.degenerate += 1;
      break;
    }
    case RecipeKind::static_scale:
      t.scale = r.static_scale;
      t.scale_inv = __fdiv_rn(1.0f, r.static_scale);
      t.last_amax = amax;
      t.updates += 1;
      if (!(amax > 0.0f) || !isfinite(amax)) t.degenerate += 1;
      break;
    default:
      break;
  }
}

// One cast whose scaling update and telemetry are still to be applied.
struct ScalingUpdate {
  DeviceLayerState* state;
  RecipeParameters recipe;
  float fp8_max;
  int operand;
  unsigned long long elements;
  bool update;
  bool count;
  bool record_copy_scale;  // a delayed-scaling weight cast read the state's scale: keep it as the copy's
};
// As many as fit a kernel's parameters (32 KB on Hopper): one launch covers a 1.5B model's every operand.
constexpr int kMaxScalingUpdates = 640;
struct ScalingUpdates {
  int count;
  ScalingUpdate entry[kMaxScalingUpdates];
};

// Every pending scaling update at once, one thread each: each entry is a different operand (an operand is
// never cast twice before its update is applied), so the threads touch disjoint state.
__global__ void update_scaling_kernel(const ScalingUpdates updates) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= updates.count) return;
  const ScalingUpdate& u = updates.entry[i];
  if (u.record_copy_scale) u.state->weight_copy_scale = u.state->tensor[u.operand].scale;
  apply_scaling_update(u.state, u.operand, u.recipe, u.fp8_max, u.elements, u.update, u.count);
  u.state->results[u.operand] = CastResults{};  // read: ready for the operand's next cast
}

// The cast's signal and quantization-noise energies over its finite inputs (noise = x - code * scale_inv, the
// dequantized value in float32 as octet::dequantize computes it), added to the operand's telemetry. Only
// when telemetry asks for the SQNR: it is one more read of the tensor.
__global__ void sqnr_kernel(const float* x, const uint8_t* codes, int64_t n, Dtype format,
                            const float* scale_inv, DeviceCastTelemetry* telemetry) {
  const MinifloatSpec spec = minifloat_spec(format);
  const float inverse = *scale_inv;
  double signal = 0.0, noise = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    if (!isfinite(v)) continue;
    const double e = static_cast<double>(v) - static_cast<double>(__fmul_rn(decode(spec, codes[i]), inverse));
    signal += static_cast<double>(v) * static_cast<double>(v);
    noise += e * e;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    signal += __shfl_xor_sync(0xFFFFFFFFu, signal, offset);
    noise += __shfl_xor_sync(0xFFFFFFFFu, noise, offset);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&telemetry->signal_energy, signal);
    atomicAdd(&telemetry->noise_energy, noise);
  }
}

// D [M, N] = D_tmp * sa * sb (+ bias [N]) (or D += ...): the FP8 GEMM's dequantization and epilogue where
// the GEMM ran in BF16 on the codes' values (GPUs without FP8 tensor cores).
__global__ void dequantize_product_kernel(float* d, const float* tmp, int64_t M, int64_t N, const float* sa,
                                          const float* sb, const __nv_bfloat16* bias, bool accumulate) {
  const float s = __fmul_rn(*sa, *sb);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = __fmul_rn(tmp[i], s);
    if (bias != nullptr) v = __fadd_rn(v, __bfloat162float(bias[i % N]));
    d[i] = accumulate ? d[i] + v : v;
  }
}

// FP8 codes to their BF16 values (exact: every E4M3 and E5M2 value is a BF16 value).
__global__ void decode_fp8_kernel(__nv_bfloat16* out, const uint8_t* codes, int64_t n, Dtype format) {
  const MinifloatSpec spec = minifloat_spec(format);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(decode(spec, codes[i]));
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

class CudaBuffer final : public Buffer {
 public:
  explicit CudaBuffer(size_t bytes) : bytes_(bytes) {
    OCTET_CUDA_CHECK(cudaMalloc(&data_, bytes == 0 ? 1 : bytes));
    OCTET_CUDA_CHECK(cudaMemset(data_, 0, bytes == 0 ? 1 : bytes));
  }
  ~CudaBuffer() override { cudaFree(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

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
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Elements offset .. offset + count - 1, split into chunks of at most kChunkElements.
void append_chunks(std::vector<Chunk>& chunks, int64_t offset, int64_t count, bool flag) {
  OCTET_CHECK(offset >= 0 && count >= 0, "a segment at {} of {} elements", offset, count);
  for (int64_t at = 0; at < count; at += kChunkElements) {
    chunks.push_back({offset + at, static_cast<int32_t>(std::min(kChunkElements, count - at)), flag ? 1 : 0});
  }
}

// The device side of one FP8 linear layer: its scaling states, scales in flight and telemetry.
struct DeviceLayer {
  DeviceLayerState* device = nullptr;
  RecipeParameters recipe{};
  unsigned pending = 0;  // bit per operand: a cast whose scaling update is not applied yet
  // Bit per operand: its CastResults hold zeros (zeroed with the state, or cleared by the update that read
  // them), so that its next cast need not zero them on the stream first.
  unsigned results_zeroed = 0;
  // Whether the operand's results hold zeros; either way the cast about to write them takes them.
  bool take_zeroed_results(int operand) {
    const bool zeroed = ((results_zeroed >> operand) & 1u) != 0;
    results_zeroed &= ~(1u << operand);
    return zeroed;
  }
  DeviceLayer() { OCTET_CUDA_CHECK(cudaMalloc(&device, sizeof(DeviceLayerState))); }
  ~DeviceLayer() { cudaFree(device); }
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;
};

class CudaBackend;
void forget_layer(CudaBackend* backend, const DeviceLayer* layer);

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
  // over the bias that wrote them (adamw_update_segments) until the weight is updated or prepared again, so
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

// The forward's FP8 input, kept for the weight-gradient GEMM: the codes of x^T [C, N] and their scale_inv.
// The codes of x [N, C], which only the forward GEMM reads, live in the backend's input_codes_ until then,
// unless the layer's backward recomputes its forward (LinearExecution::keep_input_codes): then here.
struct CudaSavedInput final : public WeightCopy {
  DeviceScratch codes;             // x [N, C] where kept
  DeviceScratch codes_transposed;  // x^T [C, N]
  uint8_t* row_codes = nullptr;    // where the last cast wrote x [N, C]: codes or the backend's input_codes_
  DeviceScratch scale_inv;         // one float
  Dtype format = Dtype::e4m3;
};

GemmType wide_type(GemmMode m) {
  return m == GemmMode::f16 ? GemmType::f16 : GemmType::bf16;
}
GemmType fp8_type(Dtype d) {
  return d == Dtype::e5m2 ? GemmType::e5m2 : GemmType::e4m3;
}

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
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {
    int count = 0;
    OCTET_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess && count > options.device && options.device >= 0,
                  "CUDA device {} does not exist ({} usable device(s) found)", options.device, count);
    OCTET_CUDA_CHECK(cudaSetDevice(options.device));
    info_ = cuda_device_info(options.device);
    OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    gemm_ = std::make_unique<GemmEngine>(options.time_gemm_algorithms ? cuda::GemmAlgorithmChoice::timed
                                                                      : cuda::GemmAlgorithmChoice::heuristic);
    emulate_fp8_ = !info_.fp8_tensor_cores || options.emulate_fp8;
    attention_options_.bf16 = options.bf16_attention;
    using Kernels = CudaBackendOptions::AttentionKernels;
    if (options.bf16_attention && options.attention != Kernels::octet) {
      cudnn_ = cuda::CudnnAttention::load(&cudnn_why_not_);
      OCTET_REQUIRE(cudnn_ != nullptr || options.attention != Kernels::cudnn,
                    "train.attention = \"cudnn\": {}; or use \"auto\" or \"octet\"", cudnn_why_not_);
    }
  }
  ~CudaBackend() override {
    sums_aside_.synchronize();
    cudaStreamSynchronize(stream_);
    for (const TimedOp& op : timed_) {
      cudaEventDestroy(op.start);
      cudaEventDestroy(op.stop);
    }
    layers_.clear();
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "cuda"; }

  void set_op_timing(bool on) override {
    timing_ = on;
    if (!on) timed_used_ = 0;
  }
  OpTimes take_op_times() override {
    OpTimes times{};
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < timed_used_; ++i) {
      float ms = 0.0f;
      OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, timed_[i].start, timed_[i].stop));
      times[static_cast<size_t>(timed_[i].kind)] += ms;
    }
    timed_used_ = 0;
    return times;
  }
  void synchronize() override {
    sums_aside_.join(stream_);
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  std::unique_ptr<Buffer> allocate(size_t bytes) override { return std::make_unique<CudaBuffer>(bytes); }
  void copy_to_host(void* host, const void* source, size_t bytes) override {
    sums_aside_.join(stream_);
    OCTET_CUDA_CHECK(cudaMemcpyAsync(host, source, bytes, cudaMemcpyDeviceToHost, stream_));
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_from_host(void* destination, const void* host, size_t bytes) override {
    sums_aside_.join(stream_);
    OCTET_CUDA_CHECK(cudaMemcpyAsync(destination, host, bytes, cudaMemcpyHostToDevice, stream_));
    // The host memory may be reused as soon as this returns.
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void fill_zero_ranges(float* x, std::span<const Range> ranges) override;
  void fill_zero(float* x, int64_t n) override {
    const OpScope scope(*this, OpKind::other);
    cuda::fill_zero(x, n, stream_);
  }

  // The tensor entries of the Backend interface: each checks its tensors and dispatches on their dtypes to
  // the ops on raw pointers below, which the rest of this file calls directly.
  void normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                             const ConstTensorView& inp, const float* weight, const float* bias,
                             LinearExecution* cast_for) override;
  void normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                              const ConstTensorView& dout, const float* inp, const float* weight,
                              const float* mean, const float* rstd) override;
  void linear_forward(const TensorView& out, const ConstTensorView& inp, const ConstTensorView& weight,
                      const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec) override;
  void linear_recompute(const TensorView& out, const ConstTensorView& weight, const WeightCopy* copy,
                        const Epilogue& epilogue, LinearExecution& exec) override;
  void linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                       const ConstTensorView& dout, const ConstTensorView& inp, const ConstTensorView& weight,
                       const WeightCopy* copy, LinearExecution& exec) override;
  Dtype storage_type(const StorageQuery& query) const override;
  void attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                         int64_t heads) override;
  void attention_backward(const TensorView& dqkv, const ConstTensorView& dout, const ConstTensorView& qkv,
                          const ConstTensorView& out, const float* lse, int64_t heads) override;
  void activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                          LinearExecution* cast_for) override;
  void activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                           const ConstTensorView& dout, float* dbias, LinearExecution* cast_for) override;
  double sum_of_squares(const ConstTensorView& x) override {
    return sum_of_squares_as(x.data, x.dtype, x.numel());
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C) override {
    const OpScope scope(*this, OpKind::other);
    cuda::encoder_forward(out, tokens, wte, wpe, B, T, C, stream_);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) override {
    const OpScope scope(*this, OpKind::other);
    cuda::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, workspace_, stream_);
  }
  void layernorm_forward_as(void* out, Dtype out_type, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t N, int64_t C) {
    check_stored(out_type, "LayerNorm's output");
    const OpScope scope(*this, OpKind::norm_activation);
    if (out_type == Dtype::bf16) {
      cuda::layernorm_forward(static_cast<uint16_t*>(out), mean, rstd, inp, weight, bias, N, C, stream_);
    } else {
      cuda::layernorm_forward(static_cast<float*>(out), mean, rstd, inp, weight, bias, N, C, stream_);
    }
  }
  void layernorm_backward_as(float* dinp, float* dweight, float* dbias, const void* dout, Dtype dout_type,
                             const float* inp, const float* weight, const float* mean, const float* rstd,
                             int64_t N, int64_t C) {
    check_stored(dout_type, "LayerNorm's output gradient");
    const OpScope scope(*this, OpKind::norm_activation);
    if (dout_type == Dtype::bf16) {
      cuda::layernorm_backward(dinp, dweight, dbias, static_cast<const uint16_t*>(dout), inp, weight, mean,
                               rstd, N, C, workspace_, stream_);
    } else {
      cuda::layernorm_backward(dinp, dweight, dbias, static_cast<const float*>(dout), inp, weight, mean, rstd,
                               N, C, workspace_, stream_);
    }
  }

  void prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC, int64_t C,
                      LinearExecution& exec) override;
  void linear_recompute(float* out, const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                        int64_t C, int64_t OC, LinearExecution& exec);
  Dtype bf16_storage_type() const { return options_.hidden_in_bf16 ? Dtype::bf16 : Dtype::f32; }
  void linear_recompute_as(void* out, Dtype out_type, const float* weight, const WeightCopy* copy,
                           const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec);
  void linear_recompute_residual(float* out, const float* residual, const float* weight,
                                 const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                                 LinearExecution& exec);

  Dtype attention_input_type(int64_t C, int64_t NH) const {
    return cuda::attention_uses_tensor_cores(C, NH, attention_options_) ? Dtype::bf16 : Dtype::f32;
  }
  Dtype attention_output_type(int64_t C, int64_t NH) const {
    const bool cudnn = cudnn_ != nullptr && options_.attention_outputs_in_bf16;
    return cudnn && attention_input_type(C, NH) == Dtype::bf16 ? Dtype::bf16 : Dtype::f32;
  }
  void linear_forward_as(void* out, Dtype out_type, const void* inp, Dtype inp_type, const float* weight,
                         const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                         LinearExecution& exec);
  void linear_forward_residual_as(float* out, const float* residual, const void* inp, Dtype inp_type,
                                  const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                                  int64_t C, int64_t OC, LinearExecution& exec);
  void linear_backward_as(void* dinp, Dtype dinp_type, void* dweight, Dtype dweight_type, float* dbias,
                          const void* dout, Dtype dout_type, const void* inp, Dtype inp_type,
                          const float* weight, const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                          LinearExecution& exec);
  // The weight-gradient GEMMs write (and add to) a bf16 gradient themselves: BF16 ones, and FP8 ones on FP8
  // tensor cores (the emulation's dequantizing epilogue writes float32).
  Dtype weight_gradient_type(const LinearExecution& exec) const {
    const bool bf16 =
        exec.weight_gradient == GemmMode::bf16 || (exec.weight_gradient == GemmMode::fp8 && !emulate_fp8_);
    return bf16 && options_.weight_gradients_in_bf16 ? Dtype::bf16 : Dtype::f32;
  }
  void attention_forward_as(void* out, Dtype out_type, float* lse, const void* qkv, Dtype qkv_type, int64_t B,
                            int64_t T, int64_t C, int64_t NH);
  void attention_backward_as(void* dqkv, const void* dout, const void* qkv, Dtype qkv_type, const void* out,
                             Dtype out_type, const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH);

  void gelu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t n);
  void layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                              const float* bias, int64_t N, int64_t C, LinearExecution& consumer);
  void gelu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                            LinearExecution& consumer);
  void gelu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                        int64_t n);
  void gelu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N, int64_t C,
                             float* dbias, LinearExecution& consumer);
  void residual_forward(float* out, const float* a, const float* b, int64_t n) override {
    const OpScope scope(*this, OpKind::other);
    cuda::residual_forward(out, a, b, n, stream_);
  }
  void accumulate(float* a, const float* b, int64_t n) override {
    const OpScope scope(*this, OpKind::other);
    cuda::accumulate(a, b, n, stream_);
  }
  void round_in_place(float* x, int64_t n, Dtype dtype) override {
    const OpScope scope(*this, OpKind::casts);
    cuda::round_in_place(x, n, dtype, stream_);
  }
  void softmax_cross_entropy(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                             int64_t Vp, float dloss) override {
    const OpScope scope(*this, OpKind::loss);
    cuda::softmax_cross_entropy(losses, logits, targets, N, V, Vp, dloss, stream_);
  }
  void lm_head_chunk(float* losses, float* logits, const int32_t* targets, float* dinp, float* dweight,
                     const float* inp, const float* weight, const WeightCopy* copy, int64_t n, int64_t C,
                     int64_t V, int64_t Vp, float dloss, LinearExecution& exec) override;

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
  bool all_finite(const float* x, int64_t n) override {
    const OpScope scope(*this, OpKind::optimizer);
    return cuda::all_finite(x, n, workspace_, stream_);
  }
  void scale(float* x, int64_t n, float factor) override {
    const OpScope scope(*this, OpKind::optimizer);
    cuda::scale(x, n, factor, stream_);
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, int64_t n, float learning_rate,
                    float beta1, float beta2, float eps, float weight_decay, int64_t step,
                    float grad_scale) override {
    const OpScope scope(*this, OpKind::optimizer);
    cuda::adamw_update(params, m, v, grads, n, learning_rate, beta1, beta2, eps, weight_decay, step,
                       grad_scale, stream_);
  }

  void adamw_update_weight(float* params, float* m, float* v, const float* grads, int64_t OC, int64_t C,
                           float learning_rate, float beta1, float beta2, float eps, float weight_decay,
                           int64_t step, float grad_scale, std::unique_ptr<WeightCopy>& copy,
                           LinearExecution& exec) override;
  void adamw_update_weights(float* params, float* m, float* v, const float* grads,
                            std::span<const WeightUpdate> weights, float learning_rate, float beta1,
                            float beta2, float eps, int64_t step, float grad_scale) override;
  void adamw_update_segments(float* params, float* m, float* v, const float* grads,
                             std::span<const AdamWSegment> segments, float learning_rate, float beta1,
                             float beta2, float eps, int64_t step, float grad_scale) override;

  void fetch_scaling(Fp8LinearState& state) override;
  void publish_scaling(const Fp8LinearState& state) override;
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
  // The device state of an FP8 layer whose weight copy exists (prepare_weight made it).
  Layer& mapped_layer(LinearExecution& exec);
  // The forward's saved input of an FP8 layer, sized for x [N, C].
  CudaSavedInput& saved_input(LinearExecution& exec, int64_t N, int64_t C);
  // Casts the forward's input x [N, C] into exec.saved_input.
  void cast_input(const float* x, int64_t N, int64_t C, LinearExecution& exec);
  // The same for a bf16 input (its bits): in one pass that reads the bf16 values where producer_casts(exec),
  // else cast_input of their float32 values.
  void cast_input_bf16(const uint16_t* x, int64_t N, int64_t C, LinearExecution& exec);
  // A tensor stored as float32 or as bf16 (attention's output and the gradients on either side of it, the
  // MLP's hidden activation and its gradient).
  struct Stored {
    const void* data;
    Dtype type;
  };
  // Refuses a storage type other than f32 and bf16 for `what`.
  static void check_stored(Dtype type, std::string_view what) {
    OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "{} stored in f32 or bf16, got {}", what,
                dtype_name(type));
  }
  // x [n] as float32: itself, or its bf16 values widened into widened_[slot].
  const float* as_f32(Stored x, int64_t n, int slot);
  // x [n] as a GEMM in `mode` (BF16 or FP16) reads it: a 16-byte aligned bf16 x itself in BF16 mode, else
  // its wide_copy (in wide_[slot]).
  const void* as_wide(Stored x, int64_t n, GemmMode mode, int slot);
  // Whether a producer may write the layer's input cast in its own pass: the recipe knows the scale before
  // the cast (delayed, static; current scaling needs the amax first) and no SQNR pass needs the float values.
  bool producer_casts(const LinearExecution& exec) const;
  // The input cast written by a producer kernel: prepares the scale, lets `write` run the producer with the
  // FusedCast it is given, then updates the scaling state and telemetry as cast_operand does.
  template <typename Write>
  void producer_cast(int64_t N, int64_t C, LinearExecution& exec, Write write);
  // Casts the backward's output gradient dout [N, OC] as the layer's gradient operand into dy_codes_ and
  // dy_codes_transposed_ (linear_backward's cast; gelu_backward_cast's where it cannot fuse), and adds the
  // column sums of dout to dbias when given: in the cast's own pass where producer_casts(exec), else by
  // bias_backward before the cast.
  void cast_gradient(Layer& layer, const float* dout, int64_t N, int64_t OC, const LinearExecution& exec,
                     float* dbias = nullptr);
  // The same for a bf16 dout (its bits): in one pass that reads the bf16 values where producer_casts(exec),
  // else cast_gradient of their float32 values.
  void cast_gradient_bf16(Layer& layer, const uint16_t* dout, int64_t N, int64_t OC,
                          const LinearExecution& exec, float* dbias);
  // The FusedCast of a gradient dout [N, C] as the layer's gradient operand in `format`, for a kernel that
  // writes the cast in its own pass (bias_backward_cast, gelu_backward_cast): the scale from begin_cast, the
  // codes into dy_codes_ and dy_codes_transposed_, scale_inv and results in the layer's state. The caller
  // runs the kernel and then end_cast.
  FusedCast gradient_fused_cast(Layer& layer, Dtype format, int64_t N, int64_t C);
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
  // tensor cores), bf16 there. With `recompute` (FP8 only): linear_recompute's, on the kept codes, uncounted.
  // With an addend (float32 out only, not with emulated FP8): out = addend + the product, in the epilogue.
  void forward_gemm(float* out, __nv_bfloat16* out_bf16, Stored inp, const float* weight,
                    const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                    LinearExecution& exec, bool recompute = false, const float* addend = nullptr);
  // forward_gemm with its output stored as `out_type`: a bf16 output from the GEMM's epilogue where the GEMM
  // can write bf16 (16-byte aligned, BF16 or FP8 on FP8 tensor cores), else the float32 result rounded to
  // bf16 after.
  void forward_gemm_as(void* out, Dtype out_type, Stored x, const float* weight, const WeightCopy* copy,
                       const float* bias, int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                       bool recompute);
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
  void begin_op(OpKind kind) {
    if (timed_used_ == timed_.size()) {
      TimedOp op{kind, nullptr, nullptr};
      OCTET_CUDA_CHECK(cudaEventCreate(&op.start));
      OCTET_CUDA_CHECK(cudaEventCreate(&op.stop));
      timed_.push_back(op);
    }
    timed_[timed_used_].kind = kind;
    OCTET_CUDA_CHECK(cudaEventRecord(timed_[timed_used_].start, stream_));
  }
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
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> cudnn_refused_;
  DeviceScratch attention_bf16_[3];
  // Where octet's kernels run attention whose output and gradients are stored in bf16: float32 staging of
  // out, dout and dqkv.
  DeviceScratch attention_f32_[3];

  // Whether this attention call runs on cuDNN: loaded, bf16 q, k, v at 16-byte aligned addresses, and an
  // engine for the shape (a refused shape runs octet's kernels, with one warning per shape on stderr).
  bool use_cudnn(const void* qkv, Dtype qkv_type, int64_t B, int64_t T, int64_t C, int64_t NH) {
    if (cudnn_ == nullptr || qkv_type != Dtype::bf16 || reinterpret_cast<uintptr_t>(qkv) % 16 != 0) {
      return false;
    }
    const auto key = std::make_tuple(B, T, C, NH);
    if (cudnn_refused_.count(key) > 0) return false;
    std::string why_not;
    if (cudnn_->supports(B, T, C, NH, &why_not)) return true;
    cudnn_refused_.insert(key);
    std::fprintf(
        stderr,
        "WARNING: cuDNN attention refused B=%lld T=%lld C=%lld NH=%lld (%s); octet's attention kernels "
        "run it\n",
        static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(C),
        static_cast<long long>(NH), why_not.c_str());
    return false;
  }
  bool emulate_fp8_ = false;
  std::vector<ScalingUpdate> pending_updates_;
  std::vector<Layer*> pending_layers_;
  std::unordered_map<const Fp8LinearState*, Layer*> layers_;
  std::unordered_map<const Fp8LinearTelemetry*, Layer*> telemetry_layers_;
  DeviceScratch dy_codes_, dy_codes_transposed_, wide_[2], emulation_[3], producer_output_, column_partials_;
  // A bf16 weight gradient widened for an AdamW update that reads float32 (adamw_update_weights).
  DeviceScratch widened_gradient_;
  DeviceScratch bias_;  // a forward GEMM's bias as its epilogue reads it
  // The chunks of the segmented AdamW update and of the segmented zeroing.
  DeviceTable<Chunk> adamw_chunks_;
  DeviceTable<Chunk> zero_chunks_;
  // The weights of the multi-weight AdamW cast (adamw_update_weights).
  cuda::AdamWCastTable adamw_casts_;
  cuda::AdamWConvertTable adamw_converts_;
  // bf16 operands of a linear layer widened to float32 where a GEMM or cast cannot read them as they are
  // (as_f32): slot 0 for dout (or the forward's input), 1 for the backward's input; slot 2 stages a float32
  // input gradient that is stored in bf16.
  DeviceScratch widened_[3];
  // The row-major codes of the last input cast (cast_input, producer_cast), x [N, C], for its forward GEMM,
  // and whose they are: one buffer for every layer, as each forward GEMM follows its input's cast and only
  // the transposed codes are kept for the backward.
  DeviceScratch input_codes_;
  const LinearExecution* input_codes_for_ = nullptr;
  // The codes of W^T of the layer whose input-gradient GEMM runs next, transposed from W's just before it,
  // for every layer with transpose_weight_per_use.
  DeviceScratch weight_transposed_;
  // The gradient cast that dy_codes_ holds when gelu_backward_cast made it: for whose linear_backward, of
  // what shape. The consumer is null once a linear_backward has cast into dy_codes_ itself.
  struct ReadyGradient {
    const LinearExecution* consumer = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
  };
  ReadyGradient ready_gradient_;
};

void forget_layer(CudaBackend* backend, const DeviceLayer* layer) {
  backend->forget(layer);
}

CudaBackend::Layer& CudaBackend::layer_of(LinearExecution& exec, CudaWeightCopy& copy) {
  OCTET_CHECK(exec.recipe != nullptr && exec.state != nullptr, "an FP8 layer with a recipe and a state");
  if (copy.layer == nullptr) {
    const RecipeParameters recipe = recipe_parameters(*exec.recipe);  // refuses recipes the GPU lacks
    copy.layer = std::make_unique<Layer>();
    copy.layer->recipe = recipe;
    copy.owner = this;
    OCTET_CUDA_CHECK(cudaMemsetAsync(copy.layer->device, 0, sizeof(DeviceLayerState), stream_));
    copy.layer->results_zeroed = (1u << kActivation) | (1u << kWeight) | (1u << kGradient);
    layers_[exec.state] = copy.layer.get();
    publish_scaling(*exec.state);
  }
  layers_[exec.state] = copy.layer.get();
  if (exec.telemetry != nullptr) telemetry_layers_[exec.telemetry] = copy.layer.get();
  return *copy.layer;
}

CudaBackend::Layer& CudaBackend::prepared_layer(LinearExecution& exec, const CudaWeightCopy* copy) {
  OCTET_CHECK(copy != nullptr && copy->layer != nullptr, "an FP8 weight copy with its device state");
  layers_[exec.state] = copy->layer.get();
  if (exec.telemetry != nullptr) telemetry_layers_[exec.telemetry] = copy->layer.get();
  return *copy->layer;
}

CudaBackend::Layer& CudaBackend::mapped_layer(LinearExecution& exec) {
  const auto it = layers_.find(exec.state);
  OCTET_CHECK(it != layers_.end(), "an FP8 layer whose weight copy was prepared");
  if (exec.telemetry != nullptr) telemetry_layers_[exec.telemetry] = it->second;
  return *it->second;
}

CudaSavedInput& CudaBackend::saved_input(LinearExecution& exec, int64_t N, int64_t C) {
  auto* saved = dynamic_cast<CudaSavedInput*>(exec.saved_input.get());
  if (saved == nullptr) {
    exec.saved_input = std::make_unique<CudaSavedInput>();
    saved = static_cast<CudaSavedInput*>(exec.saved_input.get());
  }
  const size_t n = static_cast<size_t>(N * C);
  saved->format = exec.formats.activation;
  saved->codes_transposed.as<uint8_t>(n, stream_);
  saved->scale_inv.as<float>(1, stream_);
  saved->row_codes =
      exec.keep_input_codes ? saved->codes.as<uint8_t>(n, stream_) : input_codes_.as<uint8_t>(n, stream_);
  input_codes_for_ = &exec;
  return *saved;
}

void CudaBackend::cast_input(const float* x, int64_t N, int64_t C, LinearExecution& exec) {
  Layer& layer = mapped_layer(exec);
  CudaSavedInput& saved = saved_input(exec, N, C);
  cast_operand(layer, kActivation, exec.formats.activation, x, N, C, saved.row_codes,
               static_cast<uint8_t*>(saved.codes_transposed.get(0, stream_)),
               &layer.device->cast_scale[kActivation], static_cast<float*>(saved.scale_inv.get(0, stream_)),
               exec.update_scaling, exec);
}

bool CudaBackend::producer_casts(const LinearExecution& exec) const {
  const RecipeKind kind = exec.recipe->kind();
  const bool sqnr = exec.telemetry != nullptr && exec.measure_sqnr;
  return (kind == RecipeKind::delayed || kind == RecipeKind::static_scale) && !sqnr;
}

template <typename Write>
void CudaBackend::producer_cast(int64_t N, int64_t C, LinearExecution& exec, Write write) {
  Layer& layer = mapped_layer(exec);
  CudaSavedInput& saved = saved_input(exec, N, C);
  DeviceLayerState* s = layer.device;
  const Dtype format = exec.formats.activation;
  FusedCast cast;
  cast.format = format;
  cast.scale = begin_cast(layer, kActivation, format, nullptr, N * C, &s->cast_scale[kActivation]);
  cast.output = saved.row_codes;
  cast.output_transposed = static_cast<uint8_t*>(saved.codes_transposed.get(0, stream_));
  cast.scale_inv = static_cast<float*>(saved.scale_inv.get(0, stream_));
  cast.results = &s->results[kActivation];
  cast.results_zeroed = layer.take_zeroed_results(kActivation);
  write(cast);
  end_cast(layer, kActivation, format, N * C, exec.update_scaling, exec.telemetry != nullptr);
  exec.input_cast_ready = true;
}

void CudaBackend::layernorm_forward_cast(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t N, int64_t C,
                                         LinearExecution& consumer) {
  const OpScope scope(*this, OpKind::norm_activation);
  OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
  OCTET_CHECK(out != nullptr || input_cast_suffices(consumer),
              "the output kept for a consumer that reads it");
  if (producer_casts(consumer)) {
    producer_cast(N, C, consumer, [&](const FusedCast& cast) {
      cuda::layernorm_forward_cast(out, mean, rstd, inp, weight, bias, N, C, cast, stream_);
    });
    return;
  }
  float* y = out != nullptr ? out : producer_output_.as<float>(static_cast<size_t>(N * C), stream_);
  cuda::layernorm_forward(y, mean, rstd, inp, weight, bias, N, C, stream_);
  cast_input(y, N, C, consumer);
  consumer.input_cast_ready = true;
}

void CudaBackend::gelu_forward_as(void* out, Dtype out_type, const void* inp, Dtype type, int64_t n) {
  check_stored(out_type, "GELU's output");
  check_stored(type, "GELU's input");
  const OpScope scope(*this, OpKind::norm_activation);
  auto run = [&](auto* o) {
    if (type == Dtype::bf16) {
      cuda::gelu_forward(o, static_cast<const uint16_t*>(inp), n, stream_);
    } else {
      cuda::gelu_forward(o, static_cast<const float*>(inp), n, stream_);
    }
  };
  if (out_type == Dtype::bf16) {
    run(static_cast<uint16_t*>(out));
  } else {
    run(static_cast<float*>(out));
  }
}

void CudaBackend::gelu_forward_cast_as(float* out, const void* inp, Dtype type, int64_t N, int64_t C,
                                       LinearExecution& consumer) {
  check_stored(type, "GELU's input");
  const OpScope scope(*this, OpKind::norm_activation);
  OCTET_CHECK(consumer.forward == GemmMode::fp8, "a consumer whose forward GEMM is FP8");
  OCTET_CHECK(out != nullptr || input_cast_suffices(consumer),
              "the output kept for a consumer that reads it");
  if (producer_casts(consumer)) {
    producer_cast(N, C, consumer, [&](const FusedCast& cast) {
      if (type == Dtype::bf16) {
        cuda::gelu_forward_cast(out, static_cast<const uint16_t*>(inp), N, C, cast, stream_);
      } else {
        cuda::gelu_forward_cast(out, static_cast<const float*>(inp), N, C, cast, stream_);
      }
    });
    return;
  }
  float* y = out != nullptr ? out : producer_output_.as<float>(static_cast<size_t>(N * C), stream_);
  gelu_forward_as(y, Dtype::f32, inp, type, N * C);
  cast_input(y, N, C, consumer);
  consumer.input_cast_ready = true;
}

FusedCast CudaBackend::gradient_fused_cast(Layer& layer, Dtype format, int64_t N, int64_t C) {
  const size_t n = static_cast<size_t>(N * C);
  DeviceLayerState* s = layer.device;
  FusedCast cast;
  cast.format = format;
  cast.scale = begin_cast(layer, kGradient, format, nullptr, N * C, &s->cast_scale[kGradient]);
  cast.output = dy_codes_.as<uint8_t>(n, stream_);
  cast.output_transposed = dy_codes_transposed_.as<uint8_t>(n, stream_);
  cast.scale_inv = &s->gradient_scale_inv;
  cast.results = &s->results[kGradient];
  cast.results_zeroed = layer.take_zeroed_results(kGradient);
  return cast;
}

void CudaBackend::cast_gradient(Layer& layer, const float* dout, int64_t N, int64_t OC,
                                const LinearExecution& exec, float* dbias) {
  const size_t n = static_cast<size_t>(N * OC);
  // The backward never runs with frozen scaling: the gradient's state moves on with every cast, as on the
  // CPU.
  if (dbias != nullptr && producer_casts(exec)) {
    // cast_operand's cast (the same codes, scale, scaling update, counts and telemetry), with the bias
    // gradient summed in the same pass over dout: per-tile column sums, then those added up, so its float32
    // additions come in another order than bias_backward's. The whole pass counts as a cast.
    const OpScope scope(*this, OpKind::casts);
    const Dtype format = exec.formats.gradient;
    const FusedCast cast = gradient_fused_cast(layer, format, N, OC);
    float* partials =
        column_partials_.as<float>(static_cast<size_t>(bias_backward_cast_partial_rows(N) * OC), stream_);
    cuda::bias_backward_cast(dbias, dout, N, OC, cast, partials, workspace_, stream_, sums_aside_.next());
    end_cast(layer, kGradient, format, N * OC, true, exec.telemetry != nullptr);
  } else {
    if (dbias != nullptr) {
      const OpScope scope(*this, OpKind::other);
      bias_backward(dbias, dout, N, OC, workspace_, stream_);
    }
    cast_operand(layer, kGradient, exec.formats.gradient, dout, N, OC, dy_codes_.as<uint8_t>(n, stream_),
                 dy_codes_transposed_.as<uint8_t>(n, stream_), &layer.device->cast_scale[kGradient],
                 &layer.device->gradient_scale_inv, true, exec);
  }
  ready_gradient_ = {};
}

void CudaBackend::gelu_backward_as(void* dinp, Dtype dinp_type, const void* inp, const void* dout, Dtype type,
                                   int64_t n) {
  check_stored(dinp_type, "GELU's input gradient");
  check_stored(type, "GELU's input and output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  auto run = [&](auto* d) {
    if (type == Dtype::bf16) {
      cuda::gelu_backward(d, static_cast<const uint16_t*>(inp), static_cast<const uint16_t*>(dout), n,
                          stream_);
    } else {
      cuda::gelu_backward(d, static_cast<const float*>(inp), static_cast<const float*>(dout), n, stream_);
    }
  };
  if (dinp_type == Dtype::bf16) {
    run(static_cast<uint16_t*>(dinp));
  } else {
    run(static_cast<float*>(dinp));
  }
}

void CudaBackend::gelu_backward_cast_as(float* dinp, const void* inp, const void* dout, Dtype type, int64_t N,
                                        int64_t C, float* dbias, LinearExecution& consumer) {
  check_stored(type, "GELU's input and output gradient");
  const OpScope scope(*this, OpKind::norm_activation);
  OCTET_CHECK(casts_gradient(consumer), "a consumer with an FP8 backward GEMM");
  OCTET_CHECK(dinp != nullptr || gradient_cast_suffices(consumer),
              "the gradient kept for a consumer that reads it");
  Layer& layer = mapped_layer(consumer);
  const size_t n = static_cast<size_t>(N * C);
  if (producer_casts(consumer)) {
    // linear_backward's cast_operand, with the codes written by the GELU backward kernel.
    const Dtype format = consumer.formats.gradient;
    const FusedCast cast = gradient_fused_cast(layer, format, N, C);
    float* partials = dbias == nullptr
                          ? nullptr
                          : column_partials_.as<float>(
                                static_cast<size_t>(gelu_backward_cast_partial_rows(N) * C), stream_);
    const cuda::PartialSums sums = dbias != nullptr ? sums_aside_.next() : cuda::PartialSums{};
    if (type == Dtype::bf16) {
      cuda::gelu_backward_cast(dinp, static_cast<const uint16_t*>(inp), static_cast<const uint16_t*>(dout), N,
                               C, cast, dbias, partials, workspace_, stream_, sums);
    } else {
      cuda::gelu_backward_cast(dinp, static_cast<const float*>(inp), static_cast<const float*>(dout), N, C,
                               cast, dbias, partials, workspace_, stream_, sums);
    }
    end_cast(layer, kGradient, format, N * C, true, consumer.telemetry != nullptr);
  } else {
    // The unfused ops, in linear_backward's order: the bias gradient, then the cast.
    float* d = dinp != nullptr ? dinp : producer_output_.as<float>(n, stream_);
    gelu_backward_as(d, Dtype::f32, inp, dout, type, N * C);
    if (dbias != nullptr) bias_backward(dbias, d, N, C, workspace_, stream_);
    cast_gradient(layer, d, N, C, consumer);
  }
  ready_gradient_ = {&consumer, N, C};
  consumer.gradient_cast_ready = true;
}

void CudaBackend::publish_scaling(const Fp8LinearState& state) {
  apply_scaling_updates();
  auto it = layers_.find(&state);
  if (it == layers_.end()) return;  // made with the layer's weight copy, from the host state as it is then
  DeviceLayerState host{};
  OCTET_CUDA_CHECK(
      cudaMemcpyAsync(&host, it->second->device, sizeof(DeviceLayerState), cudaMemcpyDeviceToHost, stream_));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const ScalingState* operands[3] = {&state.activation, &state.weight, &state.gradient};
  for (int i = 0; i < 3; ++i) {
    const ScalingState& s = *operands[i];
    DeviceTensorScaling& d = host.tensor[i];
    OCTET_REQUIRE(s.amax_history.size() <= static_cast<size_t>(kMaxHistory),
                  "an amax history of {} steps; the CUDA backend keeps at most {}", s.amax_history.size(),
                  kMaxHistory);
    d.scale = s.scale;
    d.scale_inv = s.scale_inv;
    d.last_amax = s.last_amax;
    d.history_length = static_cast<int32_t>(s.amax_history.size());
    d.updates = static_cast<unsigned long long>(s.updates);
    d.degenerate = static_cast<unsigned long long>(s.degenerate_amax);
    std::fill(std::begin(d.history), std::end(d.history), 0.0f);
    std::copy(s.amax_history.begin(), s.amax_history.end(), d.history);
  }
  host.weight_copy_scale = state.weight_copy_scale;
  OCTET_CUDA_CHECK(
      cudaMemcpyAsync(it->second->device, &host, sizeof(DeviceLayerState), cudaMemcpyHostToDevice, stream_));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fetch_scaling(Fp8LinearState& state) {
  apply_scaling_updates();
  auto it = layers_.find(&state);
  if (it == layers_.end()) return;  // never used on the device: the host copy is the state
  DeviceLayerState host{};
  OCTET_CUDA_CHECK(
      cudaMemcpyAsync(&host, it->second->device, sizeof(DeviceLayerState), cudaMemcpyDeviceToHost, stream_));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ScalingState* operands[3] = {&state.activation, &state.weight, &state.gradient};
  for (int i = 0; i < 3; ++i) {
    ScalingState& s = *operands[i];
    const DeviceTensorScaling& d = host.tensor[i];
    s.scale = d.scale;
    s.scale_inv = d.scale_inv;
    s.last_amax = d.last_amax;
    s.amax_history.assign(d.history, d.history + d.history_length);
    s.updates = static_cast<int64_t>(d.updates);
    s.degenerate_amax = static_cast<int64_t>(d.degenerate);
  }
  state.weight_copy_scale = host.weight_copy_scale;
}

void CudaBackend::fetch_telemetry(Fp8LinearTelemetry& telemetry) {
  apply_scaling_updates();
  auto it = telemetry_layers_.find(&telemetry);
  if (it == telemetry_layers_.end()) return;
  DeviceCastTelemetry device[3];
  DeviceLayerState* d = it->second->device;
  OCTET_CUDA_CHECK(cudaMemcpyAsync(device, d->telemetry, sizeof(device), cudaMemcpyDeviceToHost, stream_));
  OCTET_CUDA_CHECK(cudaMemsetAsync(d->telemetry, 0, sizeof(device), stream_));
  OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  CastTelemetry* host[3] = {&telemetry.activation, &telemetry.weight, &telemetry.gradient};
  for (int i = 0; i < 3; ++i) {
    host[i]->casts += static_cast<int64_t>(device[i].casts);
    host[i]->elements += static_cast<int64_t>(device[i].elements);
    host[i]->nonzero += static_cast<int64_t>(device[i].nonzero);
    host[i]->saturated += static_cast<int64_t>(device[i].saturated);
    host[i]->underflowed += static_cast<int64_t>(device[i].underflowed);
    host[i]->signal_energy += device[i].signal_energy;
    host[i]->noise_energy += device[i].noise_energy;
  }
}

const float* CudaBackend::begin_cast(Layer& layer, int operand, Dtype format, const float* x, int64_t n,
                                     float* slot) {
  if ((layer.pending & (1u << operand)) != 0) apply_scaling_updates();
  DeviceLayerState* s = layer.device;
  if (layer.recipe.kind == RecipeKind::delayed) return &s->tensor[operand].scale;
  if (layer.recipe.kind == RecipeKind::current) {
    amax_only(x, n, &s->results[operand], stream_);
    layer.results_zeroed &= ~(1u << operand);
  }
  prepare_scale_kernel<<<1, 1, 0, stream_>>>(s, operand, layer.recipe, dtype_info(format).max_finite,
                                             &s->results[operand], slot);
  OCTET_CUDA_CHECK_LAUNCH("prepare_scale_kernel");
  return slot;
}

void CudaBackend::end_cast(Layer& layer, int operand, Dtype format, int64_t n, bool update, bool count) {
  if (!update && !count) return;
  ScalingUpdate u{};
  u.state = layer.device;
  u.recipe = layer.recipe;
  u.fp8_max = dtype_info(format).max_finite;
  u.operand = operand;
  u.elements = static_cast<unsigned long long>(n);
  u.update = update;
  u.count = count;
  u.record_copy_scale = operand == kWeight && layer.recipe.kind == RecipeKind::delayed;
  pending_updates_.push_back(u);
  if (layer.pending == 0) pending_layers_.push_back(&layer);
  layer.pending |= 1u << operand;
}

void CudaBackend::apply_scaling_updates() {
  for (size_t first = 0; first < pending_updates_.size(); first += kMaxScalingUpdates) {
    ScalingUpdates batch;
    batch.count = static_cast<int>(std::min<size_t>(kMaxScalingUpdates, pending_updates_.size() - first));
    std::copy_n(pending_updates_.begin() + static_cast<ptrdiff_t>(first), batch.count, batch.entry);
    update_scaling_kernel<<<(batch.count + 127) / 128, 128, 0, stream_>>>(batch);
    OCTET_CUDA_CHECK_LAUNCH("update_scaling_kernel");
  }
  pending_updates_.clear();
  for (Layer* layer : pending_layers_) {
    layer->results_zeroed |= layer->pending;  // update_scaling_kernel cleared what it read
    layer->pending = 0;
  }
  pending_layers_.clear();
}

void CudaBackend::cast_operand(Layer& layer, int operand, Dtype format, const float* x, int64_t rows,
                               int64_t cols, uint8_t* codes, uint8_t* codes_transposed, float* scale_out,
                               float* scale_inv_out, bool update, const LinearExecution& exec) {
  const OpScope scope(*this, OpKind::casts);
  DeviceLayerState* s = layer.device;
  CastAmaxArguments a;
  a.input = x;
  a.rows = rows;
  a.cols = cols;
  a.format = format;
  a.scale = begin_cast(layer, operand, format, x, rows * cols, scale_out);
  a.output = codes;
  a.output_transposed = codes_transposed;
  a.scale_inv = scale_inv_out;
  a.results = &s->results[operand];
  a.results_zeroed = layer.take_zeroed_results(operand);
  cast_amax(a, stream_);
  // Telemetry counts a cast only where the layer collects it (not while evaluating, not when off).
  const bool count = exec.telemetry != nullptr;
  end_cast(layer, operand, format, rows * cols, update, count);
  if (count && exec.measure_sqnr && rows * cols > 0) {
    sqnr_kernel<<<blocks_for(rows * cols), 256, 0, stream_>>>(x, codes, rows * cols, format, scale_inv_out,
                                                              &s->telemetry[operand]);
    OCTET_CUDA_CHECK_LAUNCH("sqnr_kernel");
  }
}

void CudaBackend::fp8_gemm(float* d, const uint8_t* a, Dtype a_format, const float* a_scale_inv,
                           const uint8_t* b, Dtype b_format, const float* b_scale_inv, int64_t M, int64_t N,
                           int64_t K, bool accumulate, bool fast_accumulation, const __nv_bfloat16* bias,
                           __nv_bfloat16* d_bf16, const float* addend) {
  const OpScope scope(*this, OpKind::gemm_fp8);
  OCTET_CHECK(d_bf16 == nullptr || (!emulate_fp8_ && d == nullptr && (bias == nullptr || !accumulate)),
              "a bf16 FP8 GEMM output needs FP8 tensor cores, no float32 output, and no bias where it "
              "accumulates");
  OCTET_CHECK(addend == nullptr || !emulate_fp8_,
              "an addend in the FP8 GEMM's epilogue needs FP8 tensor cores");
  if (!emulate_fp8_) {
    GemmProblem p;
    p.M = M;
    p.N = N;
    p.K = K;
    p.a_type = fp8_type(a_format);
    p.b_type = fp8_type(b_format);
    p.a = a;
    p.b = b;
    p.d = d;
    p.d_bf16 = d_bf16;
    p.accumulate = accumulate;
    p.a_scale_inv = a_scale_inv;
    p.b_scale_inv = b_scale_inv;
    p.fast_accumulation = fast_accumulation;
    p.bias = bias;
    p.bias_type = GemmType::bf16;
    p.addend = addend;
    gemm_->run(p, stream_);
    return;
  }
  // No FP8 tensor cores: the same codes, as BF16 values, through a BF16 GEMM; then the two scales.
  auto* a16 = emulation_[0].as<__nv_bfloat16>(static_cast<size_t>(M * K), stream_);
  auto* b16 = emulation_[1].as<__nv_bfloat16>(static_cast<size_t>(N * K), stream_);
  auto* tmp = emulation_[2].as<float>(static_cast<size_t>(M * N), stream_);
  decode_fp8_kernel<<<blocks_for(M * K), 256, 0, stream_>>>(a16, a, M * K, a_format);
  OCTET_CUDA_CHECK_LAUNCH("decode_fp8_kernel");
  decode_fp8_kernel<<<blocks_for(N * K), 256, 0, stream_>>>(b16, b, N * K, b_format);
  OCTET_CUDA_CHECK_LAUNCH("decode_fp8_kernel");
  GemmProblem p;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a_type = GemmType::bf16;
  p.b_type = GemmType::bf16;
  p.a = a16;
  p.b = b16;
  p.d = tmp;
  p.accumulate = false;
  gemm_->run(p, stream_);
  dequantize_product_kernel<<<blocks_for(M * N), 256, 0, stream_>>>(d, tmp, M, N, a_scale_inv, b_scale_inv,
                                                                    bias, accumulate);
  OCTET_CUDA_CHECK_LAUNCH("dequantize_product_kernel");
}

const void* CudaBackend::wide_copy(const float* x, int64_t n, GemmMode mode, int slot) {
  const OpScope scope(*this, OpKind::casts);
  if (mode == GemmMode::f16) {
    auto* out = wide_[slot].as<__half>(static_cast<size_t>(n), stream_);
    convert_to_f16(out, x, n, stream_);
    return out;
  }
  auto* out = wide_[slot].as<__nv_bfloat16>(static_cast<size_t>(n), stream_);
  convert_to_bf16(out, x, n, stream_);
  return out;
}

const void* CudaBackend::epilogue_bias(const float* bias, int64_t OC, GemmMode mode, bool bf16_output,
                                       CudaWeightCopy* copy) {
  const bool aligned = reinterpret_cast<uintptr_t>(bias) % 16 == 0;
  if (bias == nullptr || (mode == GemmMode::f32 && aligned && !bf16_output)) return bias;
  const BiasCopy form = bf16_output || mode == GemmMode::fp8 ? BiasCopy::bf16_bits
                        : mode == GemmMode::bf16             ? BiasCopy::bf16_values
                                                             : BiasCopy::none;
  if (copy != nullptr && form != BiasCopy::none) {
    if (copy->bias_current && copy->bias_source == bias && copy->bias_count == OC && copy->bias_form == form)
      return copy->bias.get(0, stream_);
    copy->bias_source = bias;  // made below, into the copy; AdamW keeps it current from its next pass
    copy->bias_count = OC;
    copy->bias_form = form;
    copy->bias_current = false;
  }
  const bool into_copy = copy != nullptr && form != BiasCopy::none;
  const OpScope scope(*this, OpKind::other);
  switch (bf16_output ? GemmMode::fp8 : mode) {
    case GemmMode::f32: {
      auto* out = bias_.as<float>(static_cast<size_t>(OC), stream_);
      const size_t bytes = static_cast<size_t>(OC) * sizeof(float);
      OCTET_CUDA_CHECK(cudaMemcpyAsync(out, bias, bytes, cudaMemcpyDeviceToDevice, stream_));
      return out;
    }
    case GemmMode::bf16:
    case GemmMode::f16: {
      // Rounded to the operands' type, handed over as float32 (what cuBLASLt takes with a float32 output).
      auto* out = (into_copy ? copy->bias : bias_).as<float>(static_cast<size_t>(OC), stream_);
      cuda::round_copy(out, bias, OC, mode == GemmMode::f16 ? Dtype::f16 : Dtype::bf16, stream_);
      return out;
    }
    case GemmMode::fp8:
      break;
  }
  auto* out = (into_copy ? copy->bias : bias_).as<__nv_bfloat16>(static_cast<size_t>(OC), stream_);
  convert_to_bf16(out, bias, OC, stream_);
  return out;
}

void CudaBackend::adamw_update_segments(float* params, float* m, float* v, const float* grads,
                                        std::span<const AdamWSegment> segments, float learning_rate,
                                        float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  // The biases change: their rounded copies are current again only where the chunks below write them.
  for (const AdamWSegment& s : segments) {
    if (auto* copy = dynamic_cast<CudaWeightCopy*>(s.bias_of)) copy->bias_current = false;
  }
  // The chunk kernel takes one weight decay besides none (the optimizer's case); others go one by one.
  float decay = 0.0f;
  for (const AdamWSegment& s : segments) {
    if (s.weight_decay == 0.0f) continue;
    if (decay != 0.0f && s.weight_decay != decay) {
      Backend::adamw_update_segments(params, m, v, grads, segments, learning_rate, beta1, beta2, eps, step,
                                     grad_scale);
      return;
    }
    decay = s.weight_decay;
  }
  std::vector<Chunk> chunks;
  for (const AdamWSegment& s : segments) {
    const size_t first = chunks.size();
    append_chunks(chunks, s.offset, s.count, s.weight_decay != 0.0f);
    for (size_t i = first; i < chunks.size(); ++i)
      chunks[i].grad_offset = chunks[i].offset - s.offset + s.grad_at();
    // A bias whose rounded copy the forward reads: written in the same pass, current until the weight's
    // next update.
    auto* copy = dynamic_cast<CudaWeightCopy*>(s.bias_of);
    if (copy == nullptr || copy->bias_form == BiasCopy::none || copy->bias_source != params + s.offset ||
        copy->bias_count != s.count) {
      continue;
    }
    const bool bits = copy->bias_form == BiasCopy::bf16_bits;
    auto* rounded =
        static_cast<char*>(copy->bias.get(static_cast<size_t>(s.count) * (bits ? 2 : 4), stream_));
    for (size_t i = first; i < chunks.size(); ++i) {
      chunks[i].rounded = rounded + (chunks[i].offset - s.offset) * (bits ? 2 : 4);
      chunks[i].rounded_bits = bits ? 1 : 0;
    }
    copy->bias_current = true;
  }
  if (chunks.empty()) return;
  const Chunk* table = adamw_chunks_.upload(std::move(chunks), stream_);
  const OpScope scope(*this, OpKind::optimizer);
  cuda::adamw_update_chunks(params, m, v, grads, table, adamw_chunks_.size(), learning_rate, beta1, beta2,
                            eps, decay, step, grad_scale, stream_);
}

void CudaBackend::fill_zero_ranges(float* x, std::span<const Range> ranges) {
  std::vector<Chunk> chunks;
  for (const Range& r : ranges) append_chunks(chunks, r.offset, r.count, false);
  if (chunks.empty()) return;
  const Chunk* table = zero_chunks_.upload(std::move(chunks), stream_);
  const OpScope scope(*this, OpKind::other);
  cuda::fill_zero_chunks(x, table, zero_chunks_.size(), stream_);
}

// Whether the AdamW pass over this layer's weight writes its FP8 copy: delayed or static scaling (the scale
// is known before the update), and no SQNR measurement (which needs the unfused cast).
bool fuses_weight_cast(const LinearExecution& exec) {
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  const bool sqnr = exec.telemetry != nullptr && exec.measure_sqnr;
  return any_fp8 && !sqnr && exec.recipe != nullptr &&
         (exec.recipe->kind() == RecipeKind::delayed || exec.recipe->kind() == RecipeKind::static_scale);
}

// Whether the AdamW pass over this layer's weight writes its BF16 copy (a layer with no FP8 GEMM on the
// weight and a BF16 one).
bool writes_bf16_copy(const LinearExecution& exec) {
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  const GemmMode wide = exec.forward != GemmMode::fp8 ? exec.forward : exec.input_gradient;
  return !any_fp8 && wide == GemmMode::bf16;
}

CudaWeightCopy& cuda_weight_copy(std::unique_ptr<WeightCopy>& copy) {
  auto* w = dynamic_cast<CudaWeightCopy*>(copy.get());
  if (w == nullptr) {
    copy = std::make_unique<CudaWeightCopy>();
    w = static_cast<CudaWeightCopy*>(copy.get());
  }
  return *w;
}

// An optimizer step has begun on the layer: its bias is current again only where AdamW's pass over it writes
// the rounded copy (adamw_update_segments).
void forget_bias_copy(std::unique_ptr<WeightCopy>& copy) {
  if (auto* w = dynamic_cast<CudaWeightCopy*>(copy.get())) w->bias_current = false;
}

void CudaBackend::adamw_update_weight(float* params, float* m, float* v, const float* grads, int64_t OC,
                                      int64_t C, float learning_rate, float beta1, float beta2, float eps,
                                      float weight_decay, int64_t step, float grad_scale,
                                      std::unique_ptr<WeightCopy>& copy, LinearExecution& exec) {
  const OpScope scope(*this, OpKind::optimizer);
  forget_bias_copy(copy);
  if (writes_bf16_copy(exec)) {
    // prepare_weight's BF16 copy, written by the AdamW kernel from the updated weights.
    cuda::adamw_update_convert(params, m, v, grads, bf16_weight_copy(copy, OC * C), OC * C, learning_rate,
                               beta1, beta2, eps, weight_decay, step, grad_scale, stream_);
    return;
  }
  if (!fuses_weight_cast(exec)) {
    Backend::adamw_update_weight(params, m, v, grads, OC, C, learning_rate, beta1, beta2, eps, weight_decay,
                                 step, grad_scale, copy, exec);
    return;
  }
  const FusedCast cast = begin_weight_cast(copy, OC, C, exec);
  cuda::adamw_update_cast(params, m, v, grads, OC, C, learning_rate, beta1, beta2, eps, weight_decay, step,
                          grad_scale, cast, stream_);
  end_weight_cast(*copy, params, OC, C, exec);
}

// Where a batched AdamW weight reads its gradient: float32 in grads, or bf16 (WeightUpdate::grads_bf16).
template <typename Weight>
void set_gradient(Weight& w, const float* grads, const Backend::WeightUpdate& u) {
  if (u.grads_bf16 != nullptr) {
    w.grads_bf16 = static_cast<const uint16_t*>(u.grads_bf16);
  } else {
    w.grads = grads + u.grad_at();
  }
}

void CudaBackend::adamw_update_weights(float* params, float* m, float* v, const float* grads,
                                       std::span<const WeightUpdate> weights, float learning_rate,
                                       float beta1, float beta2, float eps, int64_t step, float grad_scale) {
  // The weights whose AdamW pass writes their FP8 copies in one launch, those that write BF16 copies in
  // another, with one weight decay besides none; the rest one by one.
  float decay = 0.0f;
  std::vector<const WeightUpdate*> casts, converts;
  for (const WeightUpdate& u : weights) {
    forget_bias_copy(*u.copy);
    const bool cast = fuses_weight_cast(*u.exec), convert = writes_bf16_copy(*u.exec);
    const bool other_decay = u.weight_decay != 0.0f && decay != 0.0f && u.weight_decay != decay;
    if ((!cast && !convert) || other_decay) {
      if (u.grads_bf16 != nullptr && !cast && !convert) {
        // A weight whose copy is made apart (the current recipe's cast, say): AdamW over the bf16 gradient as
        // it lies, then the copy, as adamw_update_weight's default runs them.
        {
          const OpScope scope(*this, OpKind::optimizer);
          cuda::adamw_update(params + u.offset, m + u.offset, v + u.offset,
                             static_cast<const uint16_t*>(u.grads_bf16), u.rows * u.cols, learning_rate,
                             beta1, beta2, eps, u.weight_decay, step, grad_scale, stream_);
        }
        prepare_weight(*u.copy, params + u.offset, u.rows, u.cols, *u.exec);
        continue;
      }
      // A bf16 gradient of a weight with another weight decay than the batch's: widened to float32 first,
      // for the one-weight passes that read float32.
      const float* g = grads + u.grad_at();
      if (u.grads_bf16 != nullptr) {
        const OpScope scope(*this, OpKind::optimizer);
        auto* widened = widened_gradient_.as<float>(static_cast<size_t>(u.rows * u.cols), stream_);
        convert_from_bf16(widened, static_cast<const uint16_t*>(u.grads_bf16), u.rows * u.cols, stream_);
        g = widened;
      }
      adamw_update_weight(params + u.offset, m + u.offset, v + u.offset, g, u.rows, u.cols, learning_rate,
                          beta1, beta2, eps, u.weight_decay, step, grad_scale, *u.copy, *u.exec);
      continue;
    }
    if (u.weight_decay != 0.0f) decay = u.weight_decay;
    (cast ? casts : converts).push_back(&u);
  }
  const OpScope scope(*this, OpKind::optimizer);
  if (!converts.empty()) {
    std::vector<cuda::AdamWConvertWeight> batch;
    for (const WeightUpdate* u : converts) {
      const int64_t n = u->rows * u->cols;
      cuda::AdamWConvertWeight w{
          params + u->offset,     m + u->offset, v + u->offset, nullptr, bf16_weight_copy(*u->copy, n), n,
          u->weight_decay != 0.0f};
      set_gradient(w, grads, *u);
      batch.push_back(w);
    }
    cuda::adamw_update_converts(batch, learning_rate, beta1, beta2, eps, decay, step, grad_scale,
                                adamw_converts_, stream_);
  }
  if (casts.empty()) return;
  std::vector<cuda::AdamWCastWeight> batch;
  for (const WeightUpdate* u : casts) {
    cuda::AdamWCastWeight w{params + u->offset,
                            m + u->offset,
                            v + u->offset,
                            nullptr,
                            u->rows,
                            u->cols,
                            u->weight_decay != 0.0f,
                            begin_weight_cast(*u->copy, u->rows, u->cols, *u->exec)};
    set_gradient(w, grads, *u);
    batch.push_back(w);
  }
  cuda::adamw_update_casts(batch, learning_rate, beta1, beta2, eps, decay, step, grad_scale, adamw_casts_,
                           stream_);
  for (const WeightUpdate* u : casts)
    end_weight_cast(**u->copy, params + u->offset, u->rows, u->cols, *u->exec);
}

// prepare_weight's BF16 copy of n values, for the AdamW kernel that writes it from the updated weights.
__nv_bfloat16* CudaBackend::bf16_weight_copy(std::unique_ptr<WeightCopy>& copy, int64_t n) {
  CudaWeightCopy& w = cuda_weight_copy(copy);
  w.has_fp8 = false;
  w.has_wide = true;
  return w.wide.as<__nv_bfloat16>(static_cast<size_t>(n), stream_);
}

// prepare_weight's FP8 half, for the AdamW kernel that writes the cast from the updated weights: the copy's
// buffers and the layer's scale, before the kernel; its scaling update and BF16 half after it.
FusedCast CudaBackend::begin_weight_cast(std::unique_ptr<WeightCopy>& copy, int64_t OC, int64_t C,
                                         LinearExecution& exec) {
  CudaWeightCopy* w = &cuda_weight_copy(copy);
  OCTET_REQUIRE(fp8_shape_supported(OC, C, C) && fp8_shape_supported(C, OC, OC),
                "an FP8 layer of {} x {} weights: FP8 GEMMs need both dimensions multiples of 16 (the "
                "precision policy keeps such layers in BF16)",
                OC, C);
  const size_t n = static_cast<size_t>(OC * C);
  Layer& layer = layer_of(exec, *w);
  DeviceLayerState* s = layer.device;
  FusedCast cast;
  cast.format = exec.formats.weight;
  cast.scale = begin_cast(layer, kWeight, exec.formats.weight, nullptr, OC * C, &s->weight_copy_scale);
  cast.output = w->fp8.as<uint8_t>(n, stream_);
  cast.output_transposed = weight_codes_transposed(*w, n, exec);
  cast.scale_inv = &s->weight_scale_inv;
  cast.results = &s->results[kWeight];
  cast.results_zeroed = layer.take_zeroed_results(kWeight);
  return cast;
}

uint8_t* CudaBackend::weight_codes_transposed(CudaWeightCopy& w, size_t n, const LinearExecution& exec) {
  if (!exec.transpose_weight_per_use) return w.fp8_transposed.as<uint8_t>(n, stream_);
  OCTET_CHECK(
      exec.recipe != nullptr && exec.recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor,
      "weight transposes per use need a per-tensor weight scale");
  w.fp8_transposed.release(stream_);
  return nullptr;
}

const uint8_t* CudaBackend::weight_transposed_for_gemm(CudaWeightCopy& w, int64_t OC, int64_t C,
                                                       const LinearExecution& exec) {
  if (!exec.transpose_weight_per_use) return static_cast<const uint8_t*>(w.fp8_transposed.get(0, stream_));
  const OpScope scope(*this, OpKind::casts);
  auto* transposed = weight_transposed_.as<uint8_t>(static_cast<size_t>(OC * C), stream_);
  cuda::transpose_codes(static_cast<const uint8_t*>(w.fp8.get(0, stream_)), transposed, OC, C, stream_);
  return transposed;
}

void CudaBackend::end_weight_cast(WeightCopy& copy, const float* params, int64_t OC, int64_t C,
                                  LinearExecution& exec) {
  auto& w = static_cast<CudaWeightCopy&>(copy);
  end_cast(*w.layer, kWeight, exec.formats.weight, OC * C, true, exec.telemetry != nullptr);
  w.has_fp8 = true;
  make_wide_weight(w, params, OC, C, exec);
}

void CudaBackend::make_wide_weight(CudaWeightCopy& w, const float* weight, int64_t OC, int64_t C,
                                   const LinearExecution& exec) {
  const size_t n = static_cast<size_t>(OC * C);
  const GemmMode wide = exec.forward != GemmMode::fp8 ? exec.forward : exec.input_gradient;
  w.has_wide = wide == GemmMode::bf16 || wide == GemmMode::f16;
  if (w.has_wide) {
    if (wide == GemmMode::f16) {
      convert_to_f16(w.wide.as<__half>(n, stream_), weight, OC * C, stream_);
    } else {
      convert_to_bf16(w.wide.as<__nv_bfloat16>(n, stream_), weight, OC * C, stream_);
    }
  }
}

void CudaBackend::prepare_weight(std::unique_ptr<WeightCopy>& copy, const float* weight, int64_t OC,
                                 int64_t C, LinearExecution& exec) {
  const OpScope scope(*this, OpKind::casts);
  CudaWeightCopy* w = &cuda_weight_copy(copy);
  w->bias_current = false;  // the parameters may have changed in any way: the next forward rounds the bias
  const size_t n = static_cast<size_t>(OC * C);
  const bool any_fp8 = exec.forward == GemmMode::fp8 || exec.input_gradient == GemmMode::fp8;
  w->has_fp8 = any_fp8;
  if (any_fp8) {
    OCTET_REQUIRE(fp8_shape_supported(OC, C, C) && fp8_shape_supported(C, OC, OC),
                  "an FP8 layer of {} x {} weights: FP8 GEMMs need both dimensions multiples of 16 (the "
                  "precision policy keeps such layers in BF16)",
                  OC, C);
    Layer& layer = layer_of(exec, *w);
    DeviceLayerState* s = layer.device;
    // The weight's state moves on with every cast, as on the CPU (prepare_weight there updates it always).
    cast_operand(layer, kWeight, exec.formats.weight, weight, OC, C, w->fp8.as<uint8_t>(n, stream_),
                 weight_codes_transposed(*w, n, exec), &s->weight_copy_scale, &s->weight_scale_inv, true,
                 exec);
  }
  make_wide_weight(*w, weight, OC, C, exec);
}

// cuDNN reads and writes out, dout and dqkv in bf16, octet's kernels in float32: each is used where it is
// stored so and converted (into attention_bf16_ or attention_f32_) where not. On cuDNN with bf16 storage
// (attention_output_type), nothing is converted.
void CudaBackend::attention_forward_as(void* out, Dtype out_type, float* lse, const void* qkv, Dtype qkv_type,
                                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  OCTET_CHECK(out_type == Dtype::f32 || out_type == Dtype::bf16, "attention's output in f32 or bf16, got {}",
              dtype_name(out_type));
  const OpScope scope(*this, OpKind::attention);
  const auto n = static_cast<size_t>(B * T * C);
  const bool bf16_out = out_type == Dtype::bf16 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (use_cudnn(qkv, qkv_type, B, T, C, NH)) {
    auto* o = bf16_out ? static_cast<uint16_t*>(out) : attention_bf16_[0].as<uint16_t>(n, stream_);
    cudnn_->forward(o, lse, static_cast<const uint16_t*>(qkv), B, T, C, NH, stream_);
    if (out_type == Dtype::f32) {
      cuda::convert_from_bf16(static_cast<float*>(out), o, static_cast<int64_t>(n), stream_);
    } else if (!bf16_out) {
      OCTET_CUDA_CHECK(cudaMemcpyAsync(out, o, n * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    return;
  }
  float* o = out_type == Dtype::f32 ? static_cast<float*>(out) : attention_f32_[0].as<float>(n, stream_);
  cuda::attention_forward(o, lse, qkv, qkv_type, B, T, C, NH, attention_workspace_, attention_options_,
                          stream_);
  if (out_type == Dtype::bf16) {
    convert_to_bf16(static_cast<__nv_bfloat16*>(out), o, static_cast<int64_t>(n), stream_);
  }
}

void CudaBackend::attention_backward_as(void* dqkv, const void* dout, const void* qkv, Dtype qkv_type,
                                        const void* out, Dtype out_type, const float* lse, int64_t B,
                                        int64_t T, int64_t C, int64_t NH) {
  OCTET_CHECK(out_type == Dtype::f32 || out_type == Dtype::bf16,
              "attention's output and gradients in f32 or bf16, got {}", dtype_name(out_type));
  const OpScope scope(*this, OpKind::attention);
  const auto n = static_cast<size_t>(B * T * C);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (use_cudnn(qkv, qkv_type, B, T, C, NH)) {
    if (out_type == Dtype::bf16 && aligned(dqkv) && aligned(dout) && aligned(out)) {
      cudnn_->backward(static_cast<uint16_t*>(dqkv), static_cast<const uint16_t*>(dout),
                       static_cast<const uint16_t*>(qkv), static_cast<const uint16_t*>(out), lse, B, T, C, NH,
                       stream_);
      return;
    }
    // Staged in bf16. A float32 out holds bf16 values (the forward's, widened), so its bf16 copy is exact; a
    // float32 dout is rounded to bf16, as octet's kernels round it for their products.
    auto* out_bf16 = attention_bf16_[0].as<uint16_t>(n, stream_);
    auto* dout_bf16 = attention_bf16_[1].as<uint16_t>(n, stream_);
    auto* dqkv_bf16 = attention_bf16_[2].as<uint16_t>(3 * n, stream_);
    if (out_type == Dtype::f32) {
      cuda::convert_to_bf16(reinterpret_cast<__nv_bfloat16*>(out_bf16), static_cast<const float*>(out),
                            static_cast<int64_t>(n), stream_);
      cuda::convert_to_bf16(reinterpret_cast<__nv_bfloat16*>(dout_bf16), static_cast<const float*>(dout),
                            static_cast<int64_t>(n), stream_);
    } else {
      OCTET_CUDA_CHECK(cudaMemcpyAsync(out_bf16, out, n * 2, cudaMemcpyDeviceToDevice, stream_));
      OCTET_CUDA_CHECK(cudaMemcpyAsync(dout_bf16, dout, n * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    cudnn_->backward(dqkv_bf16, dout_bf16, static_cast<const uint16_t*>(qkv), out_bf16, lse, B, T, C, NH,
                     stream_);
    if (out_type == Dtype::f32) {
      cuda::convert_from_bf16(static_cast<float*>(dqkv), dqkv_bf16, static_cast<int64_t>(3 * n), stream_);
    } else {
      OCTET_CUDA_CHECK(cudaMemcpyAsync(dqkv, dqkv_bf16, 3 * n * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    return;
  }
  if (out_type == Dtype::f32) {
    cuda::attention_backward(static_cast<float*>(dqkv), static_cast<const float*>(dout), qkv, qkv_type,
                             static_cast<const float*>(out), lse, B, T, C, NH, attention_workspace_,
                             attention_options_, stream_);
    return;
  }
  // bf16 storage on octet's kernels (a shape cuDNN refused): float32 staging around them.
  auto* out_f32 = attention_f32_[0].as<float>(n, stream_);
  auto* dout_f32 = attention_f32_[1].as<float>(n, stream_);
  auto* dqkv_f32 = attention_f32_[2].as<float>(3 * n, stream_);
  cuda::convert_from_bf16(out_f32, static_cast<const uint16_t*>(out), static_cast<int64_t>(n), stream_);
  cuda::convert_from_bf16(dout_f32, static_cast<const uint16_t*>(dout), static_cast<int64_t>(n), stream_);
  cuda::attention_backward(dqkv_f32, dout_f32, qkv, qkv_type, out_f32, lse, B, T, C, NH, attention_workspace_,
                           attention_options_, stream_);
  convert_to_bf16(static_cast<__nv_bfloat16*>(dqkv), dqkv_f32, static_cast<int64_t>(3 * n), stream_);
}

void CudaBackend::linear_recompute(float* out, const float* weight, const WeightCopy* copy, const float* bias,
                                   int64_t N, int64_t C, int64_t OC, LinearExecution& exec) {
  OCTET_CHECK(exec.forward == GemmMode::fp8 && exec.keep_input_codes,
              "an FP8 forward whose input codes were kept (keep_input_codes)");
  forward_gemm(out, nullptr, {nullptr, Dtype::f32}, weight, copy, bias, N, C, OC, exec, true);
}

void CudaBackend::linear_recompute_as(void* out, Dtype out_type, const float* weight, const WeightCopy* copy,
                                      const float* bias, int64_t N, int64_t C, int64_t OC,
                                      LinearExecution& exec) {
  OCTET_CHECK(exec.forward == GemmMode::fp8 && exec.keep_input_codes,
              "an FP8 forward whose input codes were kept (keep_input_codes)");
  forward_gemm_as(out, out_type, {nullptr, Dtype::f32}, weight, copy, bias, N, C, OC, exec, true);
}

void CudaBackend::linear_recompute_residual(float* out, const float* residual, const float* weight,
                                            const WeightCopy* copy, const float* bias, int64_t N, int64_t C,
                                            int64_t OC, LinearExecution& exec) {
  OCTET_CHECK(exec.forward == GemmMode::fp8 && exec.keep_input_codes,
              "an FP8 forward whose input codes were kept (keep_input_codes)");
  if (emulate_fp8_) {  // as linear_forward_residual_as: the layer's output, then the residual add
    linear_recompute(out, weight, copy, bias, N, C, OC, exec);
    residual_forward(out, residual, out, N * OC);
    return;
  }
  // The forward's GEMM with the residual as its addend, as linear_forward_residual_as ran it.
  forward_gemm(out, nullptr, {nullptr, Dtype::f32}, weight, copy, bias, N, C, OC, exec, true, residual);
}

void CudaBackend::linear_forward_as(void* out, Dtype out_type, const void* inp, Dtype inp_type,
                                    const float* weight, const WeightCopy* copy, const float* bias, int64_t N,
                                    int64_t C, int64_t OC, LinearExecution& exec) {
  check_stored(inp_type, "a linear layer's input");
  forward_gemm_as(out, out_type, {inp, inp_type}, weight, copy, bias, N, C, OC, exec, false);
}

void CudaBackend::linear_forward_residual_as(float* out, const float* residual, const void* inp,
                                             Dtype inp_type, const float* weight, const WeightCopy* copy,
                                             const float* bias, int64_t N, int64_t C, int64_t OC,
                                             LinearExecution& exec) {
  check_stored(inp_type, "a linear layer's input");
  if (exec.forward == GemmMode::fp8 && emulate_fp8_) {
    // The emulated FP8 product is not cuBLASLt's: the layer's output, then the residual add.
    linear_forward_as(out, Dtype::f32, inp, inp_type, weight, copy, bias, N, C, OC, exec);
    residual_forward(out, residual, out, N * OC);
    return;
  }
  // The residual as the GEMM's addend: the stream is read and written once, in the GEMM's epilogue.
  forward_gemm(out, nullptr, {inp, inp_type}, weight, copy, bias, N, C, OC, exec, false, residual);
}

void CudaBackend::forward_gemm_as(void* out, Dtype out_type, Stored x, const float* weight,
                                  const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                                  LinearExecution& exec, bool recompute) {
  check_stored(out_type, "a linear layer's output");
  if (out_type == Dtype::f32) {
    forward_gemm(static_cast<float*>(out), nullptr, x, weight, copy, bias, N, C, OC, exec, recompute);
    return;
  }
  auto* out_bf16 = static_cast<__nv_bfloat16*>(out);
  const bool direct = reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                      (exec.forward == GemmMode::bf16 || (exec.forward == GemmMode::fp8 && !emulate_fp8_));
  if (direct) {
    forward_gemm(nullptr, out_bf16, x, weight, copy, bias, N, C, OC, exec, recompute);
    return;
  }
  // Modes whose GEMMs cannot write bf16 (float32, FP16, FP8 without FP8 tensor cores): the float32 result,
  // then rounded to bf16 (to nearest even), as the epilogue's bf16 output rounds it.
  auto* y = producer_output_.as<float>(static_cast<size_t>(N * OC), stream_);
  forward_gemm(y, nullptr, x, weight, copy, bias, N, C, OC, exec, recompute);
  const OpScope scope(*this, OpKind::casts);
  convert_to_bf16(out_bf16, y, N * OC, stream_);
}

const float* CudaBackend::as_f32(Stored x, int64_t n, int slot) {
  if (x.type == Dtype::f32 || x.data == nullptr) return static_cast<const float*>(x.data);
  const OpScope scope(*this, OpKind::casts);
  auto* out = widened_[slot].as<float>(static_cast<size_t>(n), stream_);
  cuda::convert_from_bf16(out, static_cast<const uint16_t*>(x.data), n, stream_);
  return out;
}

const void* CudaBackend::as_wide(Stored x, int64_t n, GemmMode mode, int slot) {
  if (x.type == Dtype::bf16 && mode == GemmMode::bf16 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0) {
    return x.data;
  }
  return wide_copy(as_f32(x, n, slot), n, mode, slot);
}

void CudaBackend::cast_input_bf16(const uint16_t* x, int64_t N, int64_t C, LinearExecution& exec) {
  if (!producer_casts(exec)) {
    cast_input(as_f32({x, Dtype::bf16}, N * C, 0), N, C, exec);
    return;
  }
  const OpScope scope(*this, OpKind::casts);
  producer_cast(N, C, exec, [&](const FusedCast& cast) { cuda::cast_bf16(x, N, C, cast, stream_); });
}

void CudaBackend::cast_gradient_bf16(Layer& layer, const uint16_t* dout, int64_t N, int64_t OC,
                                     const LinearExecution& exec, float* dbias) {
  if (!producer_casts(exec)) {
    cast_gradient(layer, as_f32({dout, Dtype::bf16}, N * OC, 0), N, OC, exec, dbias);
    return;
  }
  // cast_gradient's fused cast (and bias gradient), reading the bf16 values.
  const OpScope scope(*this, OpKind::casts);
  const Dtype format = exec.formats.gradient;
  const FusedCast cast = gradient_fused_cast(layer, format, N, OC);
  if (dbias != nullptr) {
    float* partials =
        column_partials_.as<float>(static_cast<size_t>(bias_backward_cast_partial_rows(N) * OC), stream_);
    cuda::bias_backward_cast(dbias, dout, N, OC, cast, partials, workspace_, stream_, sums_aside_.next());
  } else {
    cuda::cast_bf16(dout, N, OC, cast, stream_);
  }
  end_cast(layer, kGradient, format, N * OC, true, exec.telemetry != nullptr);
  ready_gradient_ = {};
}

void CudaBackend::forward_gemm(float* out, __nv_bfloat16* out_bf16, Stored inp, const float* weight,
                               const WeightCopy* copy, const float* bias, int64_t N, int64_t C, int64_t OC,
                               LinearExecution& exec, bool recompute, const float* addend) {
  const auto* w = dynamic_cast<const CudaWeightCopy*>(copy);
  const bool bf16_output = out_bf16 != nullptr;
  // The bias goes into the GEMM's epilogue: the output is written once, in the GEMM.
  const void* gemm_bias = epilogue_bias(bias, OC, exec.forward, bf16_output, const_cast<CudaWeightCopy*>(w));
  GemmProblem p;
  p.M = N;
  p.N = OC;
  p.K = C;
  p.d = out;
  p.d_bf16 = out_bf16;
  p.bias = gemm_bias;
  p.addend = addend;
  switch (exec.forward) {
    case GemmMode::f32:
      p.bias_type = GemmType::f32;
      p.a_type = p.b_type = GemmType::f32;
      p.a = as_f32(inp, N * C, 0);
      p.b = weight;
      wide_gemm(p);
      if (exec.other_gemms) *exec.other_gemms += 1;
      break;
    case GemmMode::bf16:
    case GemmMode::f16:
      OCTET_CHECK(w != nullptr && w->has_wide, "a rounded weight copy (prepare_weight)");
      p.a_type = p.b_type = wide_type(exec.forward);
      p.bias_type = bf16_output ? GemmType::bf16 : GemmType::f32;
      p.a = as_wide(inp, N * C, exec.forward, 0);
      p.b = const_cast<CudaWeightCopy*>(w)->wide.get(0, stream_);
      wide_gemm(p);
      if (exec.other_gemms) *exec.other_gemms += 1;
      break;
    case GemmMode::fp8: {
      OCTET_CHECK(w != nullptr && w->has_fp8, "an FP8 weight copy (prepare_weight)");
      Layer& layer = prepared_layer(exec, w);
      if (!recompute) {
        if (!exec.input_cast_ready) {
          if (inp.type == Dtype::bf16) {
            cast_input_bf16(static_cast<const uint16_t*>(inp.data), N, C, exec);
          } else {
            cast_input(static_cast<const float*>(inp.data), N, C, exec);
          }
        }
        exec.input_cast_ready = false;
      }
      auto* saved = dynamic_cast<CudaSavedInput*>(exec.saved_input.get());
      OCTET_CHECK(saved != nullptr && saved->row_codes != nullptr, "the forward's FP8 input cast");
      // Shared codes are the last cast's: this layer's own, right before its forward GEMM.
      OCTET_CHECK(exec.keep_input_codes || (!recompute && input_codes_for_ == &exec),
                  "input codes that this layer's own cast wrote");
      const auto* scale_inv = static_cast<const float*>(saved->scale_inv.get(0, stream_));
      fp8_gemm(out, saved->row_codes, saved->format, scale_inv,
               static_cast<const uint8_t*>(const_cast<CudaWeightCopy*>(w)->fp8.get(0, stream_)),
               exec.formats.weight, &layer.device->weight_scale_inv, N, OC, C, false,
               exec.fast_accumulation_forward, static_cast<const __nv_bfloat16*>(gemm_bias), out_bf16,
               addend);
      if (exec.fp8_gemms && !recompute) *exec.fp8_gemms += 1;
      break;
    }
  }
}

void CudaBackend::linear_backward_as(void* dinp, Dtype dinp_type, void* dweight, Dtype dweight_type,
                                     float* dbias, const void* dout_data, Dtype dout_type,
                                     const void* inp_data, Dtype inp_type, const float* weight,
                                     const WeightCopy* copy, int64_t N, int64_t C, int64_t OC,
                                     LinearExecution& exec) {
  check_stored(dinp_type, "a linear layer's input gradient");
  OCTET_CHECK(dweight_type == Dtype::f32 || dweight_type == weight_gradient_type(exec),
              "a linear layer's weight gradient is stored as {} only where its GEMM writes it so",
              dtype_name(dweight_type));
  check_stored(dout_type, "a linear layer's output gradient");
  check_stored(inp_type, "a linear layer's input");
  auto* w = const_cast<CudaWeightCopy*>(dynamic_cast<const CudaWeightCopy*>(copy));
  const Stored dout{dout_data, dout_type};
  const Stored inp{inp_data, inp_type};
  const auto* dout_bf16 = dout_type == Dtype::bf16 ? static_cast<const uint16_t*>(dout_data) : nullptr;
  const auto* dout_f32 = dout_type == Dtype::f32 ? static_cast<const float*>(dout_data) : nullptr;
  const bool fp8 = casts_gradient(exec);
  const bool ready = take_gradient_cast(exec, dout_data, dbias);
  const void* dout_wide = nullptr;  // dout rounded to BF16/FP16 (slot 0), once for both GEMMs
  // An FP8 backward sums the bias gradient with its gradient cast (cast_gradient), in one pass over dout
  // where it can; a BF16 one with the conversion of a float32 dout for its input-gradient GEMM.
  if (dbias != nullptr && !fp8) {
    if (dout_f32 != nullptr && exec.input_gradient == GemmMode::bf16) {
      const OpScope scope(*this, OpKind::casts);
      auto* converted = wide_[0].as<__nv_bfloat16>(static_cast<size_t>(N * OC), stream_);
      bias_backward_convert(dbias, converted, dout_f32, N, OC, workspace_, stream_);
      dout_wide = converted;
    } else {
      const OpScope scope(*this, OpKind::other);
      if (dout_bf16 != nullptr) {
        bias_backward(dbias, dout_bf16, N, OC, workspace_, stream_);
      } else {
        bias_backward(dbias, dout_f32, N, OC, workspace_, stream_);
      }
    }
  }
  const size_t ny = static_cast<size_t>(N * OC);
  uint8_t* dy = nullptr;
  uint8_t* dy_t = nullptr;
  Layer* layer = nullptr;
  if (fp8) {
    layer = &prepared_layer(exec, w);
    if (ready) {
      OCTET_CHECK(
          ready_gradient_.consumer == &exec && ready_gradient_.rows == N && ready_gradient_.cols == OC,
          "the gradient cast its producer made for this layer, [{}, {}]", N, OC);
      ready_gradient_ = {};
    } else if (dout_bf16 != nullptr) {
      cast_gradient_bf16(*layer, dout_bf16, N, OC, exec, dbias);
    } else {
      cast_gradient(*layer, dout_f32, N, OC, exec, dbias);
    }
    dy = static_cast<uint8_t*>(dy_codes_.get(ny, stream_));
    dy_t = static_cast<uint8_t*>(dy_codes_transposed_.get(ny, stream_));
  }

  // dinp: float32, or bf16, which BF16 GEMMs and FP8 ones on FP8 tensor cores write themselves (rounding
  // their float32 result once); the others write float32 to widened_[2], rounded to bf16 afterwards.
  auto* dinp_f32 = dinp_type == Dtype::f32 ? static_cast<float*>(dinp) : nullptr;
  auto* dinp_bf16 = dinp_type == Dtype::bf16 ? static_cast<__nv_bfloat16*>(dinp) : nullptr;
  const bool bf16_direct =
      dinp_bf16 != nullptr && reinterpret_cast<uintptr_t>(dinp) % 16 == 0 &&
      (exec.input_gradient == GemmMode::bf16 || (exec.input_gradient == GemmMode::fp8 && !emulate_fp8_));
  if (dinp_bf16 != nullptr && !bf16_direct) {
    dinp_f32 = widened_[2].as<float>(static_cast<size_t>(N * C), stream_);
  }
  __nv_bfloat16* gemm_bf16 = bf16_direct ? dinp_bf16 : nullptr;

  // Input gradient: dinp [N, C] = dout [N, OC] x W [OC, C], i.e. A = dout (K = OC), B = W^T.
  switch (exec.input_gradient) {
    case GemmMode::f32: {
      GemmProblem p;
      p.M = N;
      p.N = C;
      p.K = OC;
      p.a_type = p.b_type = GemmType::f32;
      p.a = as_f32(dout, N * OC, 0);
      p.b = weight;
      p.b_transposed = true;
      p.d = dinp_f32;
      wide_gemm(p);
      if (exec.other_gemms) *exec.other_gemms += 1;
      break;
    }
    case GemmMode::bf16:
    case GemmMode::f16: {
      OCTET_CHECK(w != nullptr && w->has_wide, "a rounded weight copy (prepare_weight)");
      if (dout_wide == nullptr) dout_wide = as_wide(dout, N * OC, exec.input_gradient, 0);
      wide_input_gradient(gemm_bf16 != nullptr ? nullptr : dinp_f32, dout_wide, w->wide.get(0, stream_), N, C,
                          OC, exec.input_gradient, exec, gemm_bf16);
      break;
    }
    case GemmMode::fp8:
      OCTET_CHECK(w != nullptr && w->has_fp8, "an FP8 weight copy (prepare_weight)");
      fp8_gemm(gemm_bf16 != nullptr ? nullptr : dinp_f32, dy, exec.formats.gradient,
               &layer->device->gradient_scale_inv, weight_transposed_for_gemm(*w, OC, C, exec),
               exec.formats.weight, &layer->device->weight_scale_inv, N, C, OC, false,
               exec.fast_accumulation_backward, nullptr, gemm_bf16);
      if (exec.fp8_gemms) *exec.fp8_gemms += 1;
      break;
  }
  if (dinp_bf16 != nullptr && !bf16_direct) {
    const OpScope scope(*this, OpKind::casts);
    convert_to_bf16(dinp_bf16, dinp_f32, N * C, stream_);
  }

  // Weight gradient, accumulated in float32: dweight [OC, C] += dout^T [OC, N] x inp [N, C] (K = N); written
  // (=) where exec.accumulate_weight_gradient is false. A bf16 dweight is the GEMM's own bf16 output (the
  // float32 sum, old value included, rounded once).
  auto* dweight_f32 = dweight_type == Dtype::f32 ? static_cast<float*>(dweight) : nullptr;
  auto* dweight_bf16 = dweight_type == Dtype::bf16 ? static_cast<__nv_bfloat16*>(dweight) : nullptr;
  switch (exec.weight_gradient) {
    case GemmMode::f32:
    case GemmMode::bf16:
    case GemmMode::f16: {
      if (exec.weight_gradient == GemmMode::f32) {
        weight_gradient_gemm(dweight_f32, GemmType::f32, as_f32(dout, N * OC, 0), as_f32(inp, N * C, 1), N, C,
                             OC, exec);
      } else {
        // The input gradient's rounded copy of dout, when it made one of the same type.
        const void* a = exec.input_gradient == exec.weight_gradient
                            ? dout_wide
                            : as_wide(dout, N * OC, exec.weight_gradient, 0);
        weight_gradient_gemm(dweight_f32, wide_type(exec.weight_gradient), a,
                             as_wide(inp, N * C, exec.weight_gradient, 1), N, C, OC, exec, dweight_bf16);
      }
      break;
    }
    case GemmMode::fp8: {
      auto* saved = dynamic_cast<CudaSavedInput*>(exec.saved_input.get());
      OCTET_CHECK(saved != nullptr, "the forward's FP8 input, kept for the backward");
      // Evaluation and generation run any number of rows; only this GEMM has them as K.
      OCTET_REQUIRE(fp8_shape_supported(OC, C, N),
                    "an FP8 weight gradient over {} rows: FP8 GEMMs need a multiple of 16 (the precision "
                    "policy keeps such layers in BF16)",
                    N);
      fp8_gemm(dweight_f32, dy_t, exec.formats.gradient, &layer->device->gradient_scale_inv,
               static_cast<const uint8_t*>(saved->codes_transposed.get(0, stream_)), saved->format,
               static_cast<const float*>(saved->scale_inv.get(0, stream_)), OC, C, N,
               exec.accumulate_weight_gradient, exec.fast_accumulation_backward, nullptr, dweight_bf16);
      if (exec.fp8_gemms) *exec.fp8_gemms += 1;
      break;
    }
  }
}

// A BF16 head (the precision policy's default, in fp8 and bf16 modes alike) keeps its logits in BF16 from
// the GEMM on (Backend::lm_head_chunk: such a head's logits are rounded to BF16): the GEMM writes them in
// BF16 (the values the default's round_in_place makes of the float32 output), the cross-entropy reads them
// and writes the gradient back in BF16 over them (what linear_backward would make of the float32 gradient
// before its BF16 GEMMs), and the backward GEMMs read that directly. Against the default's ops this saves
// the rounding pass over the logits, half of the loss's traffic and the gradient's conversion pass. Any
// other head runs the default.
void CudaBackend::lm_head_chunk(float* losses, float* logits, const int32_t* targets, float* dinp,
                                float* dweight, const float* inp, const float* weight, const WeightCopy* copy,
                                int64_t n, int64_t C, int64_t V, int64_t Vp, float dloss,
                                LinearExecution& exec) {
  const auto* w = dynamic_cast<const CudaWeightCopy*>(copy);
  const bool bf16 = logits_in_bf16(exec) && w != nullptr && w->has_wide && inp != nullptr;
  if (!bf16) {
    Backend::lm_head_chunk(losses, logits, targets, dinp, dweight, inp, weight, copy, n, C, V, Vp, dloss,
                           exec);
    return;
  }
  // The float32 chunk has room for the BF16 logits twice over.
  auto* logits_bf16 = reinterpret_cast<__nv_bfloat16*>(logits);
  const void* wide_weight = const_cast<CudaWeightCopy*>(w)->wide.get(0, stream_);
  const void* inp_bf16 = wide_copy(inp, n * C, GemmMode::bf16, 1);
  GemmProblem p;
  p.M = n;
  p.N = Vp;
  p.K = C;
  p.a_type = p.b_type = GemmType::bf16;
  p.a = inp_bf16;
  p.b = wide_weight;
  p.d_bf16 = logits_bf16;
  wide_gemm(p);
  if (exec.other_gemms) *exec.other_gemms += 1;
  {
    const OpScope scope(*this, OpKind::loss);
    cuda::softmax_cross_entropy(losses, logits_bf16, targets, n, V, Vp, dloss, stream_);
  }
  if (dloss == 0.0f) return;

  // The backward as linear_backward runs it, from the BF16 gradient as it is.
  wide_input_gradient(dinp, logits_bf16, wide_weight, n, C, Vp, GemmMode::bf16, exec);
  weight_gradient_gemm(dweight, GemmType::bf16, logits_bf16, inp_bf16, n, C, Vp, exec);
}

void CudaBackend::wide_input_gradient(float* dinp, const void* dout_wide, const void* weight_wide, int64_t N,
                                      int64_t C, int64_t OC, GemmMode mode, LinearExecution& exec,
                                      __nv_bfloat16* dinp_bf16) {
  GemmProblem p;
  p.M = N;
  p.N = C;
  p.K = OC;
  p.a_type = p.b_type = wide_type(mode);
  p.a = dout_wide;
  p.b = weight_wide;
  p.b_transposed = true;
  p.d = dinp;
  p.d_bf16 = dinp_bf16;
  wide_gemm(p);
  if (exec.other_gemms) *exec.other_gemms += 1;
}

void CudaBackend::weight_gradient_gemm(float* dweight, GemmType type, const void* dout, const void* inp,
                                       int64_t N, int64_t C, int64_t OC, LinearExecution& exec,
                                       __nv_bfloat16* dweight_bf16) {
  GemmProblem p;
  p.M = OC;
  p.N = C;
  p.K = N;
  p.a_type = p.b_type = type;
  p.a = dout;
  p.a_transposed = true;
  p.b = inp;
  p.b_transposed = true;
  p.d = dweight;
  p.d_bf16 = dweight_bf16;
  p.accumulate = exec.accumulate_weight_gradient;
  wide_gemm(p);
  if (exec.other_gemms) *exec.other_gemms += 1;
}

// ---------------------------------------------------------------------------------------------------------
// The tensor entries: shapes and dtypes checked, then the ops on raw pointers.

void require_normalization(Normalization kind) {
  OCTET_CHECK(kind == Normalization::layernorm, "CUDA normalization: layernorm, asked for {}",
              normalization_name(kind));
}

void require_activation(Activation kind) {
  OCTET_CHECK(kind == Activation::gelu, "CUDA activation: gelu, asked for {}", activation_name(kind));
}

void CudaBackend::normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                                        const ConstTensorView& inp, const float* weight, const float* bias,
                                        LinearExecution* cast_for) {
  require_normalization(kind);
  const int64_t N = inp.rows(), C = inp.cols();
  check_matrix("normalization_forward", "out", out.shape, N, C);
  if (cast_for != nullptr) {
    layernorm_forward_cast(out.f32(), mean, rstd, inp.f32(), weight, bias, N, C, *cast_for);
  } else {
    layernorm_forward_as(out.data, out.dtype, mean, rstd, inp.f32(), weight, bias, N, C);
  }
}

void CudaBackend::normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                                         const ConstTensorView& dout, const float* inp, const float* weight,
                                         const float* mean, const float* rstd) {
  require_normalization(kind);
  layernorm_backward_as(dinp, dweight, dbias, dout.data, dout.dtype, inp, weight, mean, rstd, dout.rows(),
                        dout.cols());
}

void CudaBackend::linear_forward(const TensorView& out, const ConstTensorView& inp,
                                 const ConstTensorView& weight, const WeightCopy* copy,
                                 const Epilogue& epilogue, LinearExecution& exec) {
  const int64_t N = inp.rows(), C = inp.cols(), OC = weight.rows();
  check_matrix("linear_forward", "weight", weight.shape, OC, C);
  check_matrix("linear_forward", "out", out.shape, N, OC);
  if (epilogue.residual != nullptr) {
    linear_forward_residual_as(out.f32(), epilogue.residual, inp.data, inp.dtype, weight.f32(), copy,
                               epilogue.bias, N, C, OC, exec);
  } else {
    linear_forward_as(out.data, out.dtype, inp.data, inp.dtype, weight.f32(), copy, epilogue.bias, N, C, OC,
                      exec);
  }
}

void CudaBackend::linear_recompute(const TensorView& out, const ConstTensorView& weight,
                                   const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec) {
  const int64_t N = out.rows(), C = weight.cols(), OC = weight.rows();
  check_matrix("linear_recompute", "out", out.shape, N, OC);
  if (epilogue.residual != nullptr) {
    linear_recompute_residual(out.f32(), epilogue.residual, weight.f32(), copy, epilogue.bias, N, C, OC,
                              exec);
  } else {
    linear_recompute_as(out.data, out.dtype, weight.f32(), copy, epilogue.bias, N, C, OC, exec);
  }
}

void CudaBackend::linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                                  const ConstTensorView& dout, const ConstTensorView& inp,
                                  const ConstTensorView& weight, const WeightCopy* copy,
                                  LinearExecution& exec) {
  const int64_t N = inp.rows(), C = inp.cols(), OC = weight.rows();
  check_matrix("linear_backward", "weight", weight.shape, OC, C);
  check_matrix("linear_backward", "dweight", dweight.shape, OC, C);
  check_matrix("linear_backward", "dout", dout.shape, N, OC);
  check_matrix("linear_backward", "dinp", dinp.shape, N, C);
  linear_backward_as(dinp.data, dinp.dtype, dweight.data, dweight.dtype, dbias, dout.data, dout.dtype,
                     inp.data, inp.dtype, weight.f32(), copy, N, C, OC, exec);
}

Dtype CudaBackend::storage_type(const StorageQuery& query) const {
  switch (query.role) {
    case StorageRole::rounded_activation:
      return bf16_storage_type();
    case StorageRole::attention_input:
      return attention_input_type(query.channels, query.heads);
    case StorageRole::attention_output:
      return attention_output_type(query.channels, query.heads);
    case StorageRole::weight_gradient:
      OCTET_CHECK(query.layer != nullptr, "the layer whose weight gradient is stored");
      return weight_gradient_type(*query.layer);
  }
  return Dtype::f32;
}

void CudaBackend::attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                                    int64_t heads) {
  OCTET_CHECK(qkv.shape.rank() == 3, "attention_forward: qkv is [B, T, 3C], given {}", qkv.shape.to_string());
  const int64_t B = qkv.shape[0], T = qkv.shape[1], C = out.cols();
  check_shape("attention_forward", "qkv", qkv.shape, {B, T, 3 * C});
  check_shape("attention_forward", "out", out.shape, {B, T, C});
  attention_forward_as(out.data, out.dtype, lse, qkv.data, qkv.dtype, B, T, C, heads);
}

void CudaBackend::attention_backward(const TensorView& dqkv, const ConstTensorView& dout,
                                     const ConstTensorView& qkv, const ConstTensorView& out, const float* lse,
                                     int64_t heads) {
  OCTET_CHECK(qkv.shape.rank() == 3, "attention_backward: qkv is [B, T, 3C], given {}",
              qkv.shape.to_string());
  const int64_t B = qkv.shape[0], T = qkv.shape[1], C = out.cols();
  check_shape("attention_backward", "qkv", qkv.shape, {B, T, 3 * C});
  check_shape("attention_backward", "dqkv", dqkv.shape, {B, T, 3 * C});
  check_shape("attention_backward", "out", out.shape, {B, T, C});
  check_shape("attention_backward", "dout", dout.shape, {B, T, C});
  OCTET_CHECK(dqkv.dtype == out.dtype && dout.dtype == out.dtype,
              "attention_backward: dqkv ({}) and dout ({}) are stored as out is ({})", dtype_name(dqkv.dtype),
              dtype_name(dout.dtype), dtype_name(out.dtype));
  attention_backward_as(dqkv.data, dout.data, qkv.data, qkv.dtype, out.data, out.dtype, lse, B, T, C, heads);
}

void CudaBackend::activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                     LinearExecution* cast_for) {
  require_activation(kind);
  check_matrix("activation_forward", "out", out.shape, inp.rows(), inp.cols());
  if (cast_for != nullptr) {
    gelu_forward_cast_as(out.f32(), inp.data, inp.dtype, inp.rows(), inp.cols(), *cast_for);
  } else {
    gelu_forward_as(out.data, out.dtype, inp.data, inp.dtype, inp.numel());
  }
}

void CudaBackend::activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                      const ConstTensorView& dout, float* dbias, LinearExecution* cast_for) {
  require_activation(kind);
  check_matrix("activation_backward", "dout", dout.shape, inp.rows(), inp.cols());
  check_matrix("activation_backward", "dinp", dinp.shape, inp.rows(), inp.cols());
  OCTET_CHECK(dout.dtype == inp.dtype, "activation_backward: dout ({}) is stored as inp is ({})",
              dtype_name(dout.dtype), dtype_name(inp.dtype));
  if (cast_for != nullptr) {
    gelu_backward_cast_as(dinp.f32(), inp.data, dout.data, inp.dtype, inp.rows(), inp.cols(), dbias,
                          *cast_for);
  } else {
    OCTET_CHECK(dbias == nullptr, "activation_backward sums a bias gradient only with the consumer's cast");
    gelu_backward_as(dinp.data, dinp.dtype, inp.data, dout.data, inp.dtype, inp.numel());
  }
}

}  // namespace
}  // namespace cuda

bool cuda_backend_built() {
  return true;
}

int cuda_device_count() {
  return cuda::device_count();
}

CudaDeviceInfo cuda_device_info(int device) {
  const cuda::DeviceInfo d = cuda::device_info(device);
  CudaDeviceInfo info;
  info.index = d.index;
  info.name = d.name;
  info.major = d.compute_major;
  info.minor = d.compute_minor;
  info.fp8_tensor_cores = cuda::has_fp8_tensor_cores(d);
  info.memory_bytes = d.total_memory_bytes;
  return info;
}

bool cuda_attention_on_tensor_cores(int64_t C, int64_t NH) {
  cuda::AttentionOptions options;
  options.bf16 = true;
  return cuda::attention_uses_tensor_cores(C, NH, options);
}

std::string cuda_attention_kernels(int64_t B, int64_t T, int64_t C, int64_t NH,
                                   CudaBackendOptions::AttentionKernels kernels) {
  using Kernels = CudaBackendOptions::AttentionKernels;
  const std::string own = "octet's flash-attention kernels";
  if (!cuda_attention_on_tensor_cores(C, NH)) return own + " in float32";
  if (kernels == Kernels::octet) return own + " (train.attention = \"octet\")";
  std::string why_not;
  const std::unique_ptr<cuda::CudnnAttention> cudnn = cuda::CudnnAttention::load(&why_not);
  if (cudnn != nullptr && cudnn->supports(B, T, C, NH, &why_not)) {
    return fmt::format("cuDNN {} fused flash attention ({})", cudnn->version(), cudnn->engines(B, T, C, NH));
  }
  OCTET_REQUIRE(kernels != Kernels::cudnn, "train.attention = \"cudnn\": {}; or use \"auto\" or \"octet\"",
                why_not);
  return fmt::format("{} (cuDNN not used: {})", own, why_not);
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  OCTET_REQUIRE(cuda_device_count() > 0, "train.device = \"cuda\": no CUDA GPU is visible to this process");
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace octet
