// The CUDA backend: the Backend interface on one NVIDIA GPU. Every op is enqueued on the backend's stream and
// nothing waits for the host inside a step: FP8 casts read their scale from device memory and a one-thread
// kernel after each cast applies the recipe's update there, exactly as the CPU reference does on the host
// (src/numerics/*_scaling.cpp), so the two backends walk the same scaling states. The host copy of a state
// is brought up to date only when asked (fetch_scaling: checkpoints, telemetry, tests).
// This file holds its construction, memory, op timing and the tensor entries of the Backend interface, and
// the functions of octet/backend/cuda_backend.h; cuda_backend_impl.h lists the files of the rest.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "cuda_backend_impl.h"

namespace octet {
namespace cuda::backend_internal {
namespace {

class CudaBuffer final : public Buffer {
 public:
  explicit CudaBuffer(size_t bytes) : bytes_(bytes) {
    OCTET_CUDA_CHECK(cudaMalloc(&data_, bytes == 0 ? 1 : bytes));
    OCTET_CUDA_CHECK(cudaMemset(data_, 0, bytes == 0 ? 1 : bytes));
    // The zeroing runs on the default stream, which the backend's and NCCL's non-blocking streams do not
    // wait for: without this wait a large buffer could still be being zeroed while a collective or a copy
    // on those streams fills it (an FP8 weight gather's 2 GB staging buffer lost the ranks' parts so).
    OCTET_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  ~CudaBuffer() override { cudaFree(data_); }
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

}  // namespace

StagedUploads::~StagedUploads() {
  for (Slot& slot : slots_) {
    if (slot.done != nullptr) {
      (void)cudaEventSynchronize(slot.done);
      (void)cudaEventDestroy(slot.done);
    }
    if (slot.pinned != nullptr) (void)cudaFreeHost(slot.pinned);
  }
}

bool StagedUploads::upload(void* destination, const void* host, size_t bytes, cudaStream_t stream) {
  if (bytes > kSlotBytes) return false;
  Slot& slot = slots_[static_cast<size_t>(next_)];
  next_ = (next_ + 1) % kSlots;
  if (slot.pinned == nullptr) {
    OCTET_CUDA_CHECK(cudaMallocHost(&slot.pinned, kSlotBytes));
    OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  } else {
    OCTET_CUDA_CHECK(cudaEventSynchronize(slot.done));  // the slot's last copy has been read
  }
  if (bytes > 0) std::memcpy(slot.pinned, host, bytes);
  OCTET_CUDA_CHECK(cudaMemcpyAsync(destination, slot.pinned, bytes, cudaMemcpyHostToDevice, stream));
  OCTET_CUDA_CHECK(cudaEventRecord(slot.done, stream));
  return true;
}

CudaBackend::CudaBackend(const CudaBackendOptions& options) : options_(options) {
  int count = 0;
  OCTET_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess && count > options.device && options.device >= 0,
                "CUDA device {} does not exist ({} usable device(s) found)", options.device, count);
  OCTET_CUDA_CHECK(cudaSetDevice(options.device));
  info_ = cuda_device_info(options.device);
  OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // The device's memory pool (DeviceScratch::get_in_order: the weight copies that fully sharded weights
  // make and give back every step) keeps what is given back for the next taking, instead of returning it to
  // the driver at each synchronization: the pool holds what the copies held at most at once.
  cudaMemPool_t pool = nullptr;
  OCTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, options.device));
  uint64_t keep = UINT64_MAX;
  OCTET_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
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

CudaBackend::~CudaBackend() {
  sums_aside_.synchronize();
  cudaStreamSynchronize(stream_);
  for (const TimedOp& op : timed_) {
    cudaEventDestroy(op.start);
    cudaEventDestroy(op.stop);
  }
  layers_.clear();
  gemm_.reset();
  if (pinned_states_ != nullptr) cudaFreeHost(pinned_states_);
  if (pinned_state_addresses_ != nullptr) cudaFreeHost(pinned_state_addresses_);
  cudaStreamDestroy(stream_);
}

OpTimes CudaBackend::take_op_times() {
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

void CudaBackend::begin_op(OpKind kind) {
  if (timed_used_ == timed_.size()) {
    TimedOp op{kind, nullptr, nullptr};
    OCTET_CUDA_CHECK(cudaEventCreate(&op.start));
    OCTET_CUDA_CHECK(cudaEventCreate(&op.stop));
    timed_.push_back(op);
  }
  timed_[timed_used_].kind = kind;
  OCTET_CUDA_CHECK(cudaEventRecord(timed_[timed_used_].start, stream_));
}

std::unique_ptr<Buffer> CudaBackend::allocate(size_t bytes) {
  return std::make_unique<CudaBuffer>(bytes);
}

std::unique_ptr<Buffer> CudaBackend::allocate_releasable(size_t bytes) {
  std::unique_ptr<Buffer> pages = make_device_pages_buffer(bytes);
  return pages != nullptr ? std::move(pages) : allocate(bytes);
}

// ---------------------------------------------------------------------------------------------------------
// The tensor entries: shapes and dtypes checked, then the ops on raw pointers.

void CudaBackend::normalization_forward(Normalization kind, const TensorView& out, float* mean, float* rstd,
                                        const ConstTensorView& inp, const float* weight, const float* bias,
                                        const Fp8CastTarget& cast_for) {
  check_normalization_arguments("normalization_forward", kind, mean, bias);
  const int64_t N = inp.rows(), C = inp.cols();
  check_matrix("normalization_forward", "out", out.shape, N, C);
  if (kind == Normalization::rmsnorm) {
    if (cast_for.given()) {
      rmsnorm_forward_cast(out.f32(), rstd, inp.f32(), weight, N, C, cast_for);
    } else {
      rmsnorm_forward_as(out.data, out.dtype, rstd, inp.f32(), weight, N, C);
    }
  } else if (cast_for.given()) {
    layernorm_forward_cast(out.f32(), mean, rstd, inp.f32(), weight, bias, N, C, cast_for);
  } else {
    layernorm_forward_as(out.data, out.dtype, mean, rstd, inp.f32(), weight, bias, N, C);
  }
}

void CudaBackend::normalization_backward(Normalization kind, float* dinp, float* dweight, float* dbias,
                                         const ConstTensorView& dout, const float* inp, const float* weight,
                                         const float* mean, const float* rstd) {
  check_normalization_arguments("normalization_backward", kind, mean, dbias);
  if (kind == Normalization::rmsnorm) {
    rmsnorm_backward_as(dinp, dweight, dout.data, dout.dtype, inp, weight, rstd, dout.rows(), dout.cols());
  } else {
    layernorm_backward_as(dinp, dweight, dbias, dout.data, dout.dtype, inp, weight, mean, rstd, dout.rows(),
                          dout.cols());
  }
}

void CudaBackend::linear_forward(const TensorView& out, const ConstTensorView& inp,
                                 const ConstTensorView& weight, const WeightCopy* copy,
                                 const Epilogue& epilogue, LinearExecution& exec, const Fp8Operand& input) {
  const auto [N, C, OC] = linear_sizes("linear_forward", inp.shape, weight.shape, out.shape, "out");
  if (epilogue.residual != nullptr) {
    linear_forward_residual_as(out.f32(), epilogue.residual, inp.data, inp.dtype, weight.f32(), copy,
                               epilogue.bias, N, C, OC, exec, input);
  } else {
    linear_forward_as(out.data, out.dtype, inp.data, inp.dtype, weight.f32(), copy, epilogue.bias, N, C, OC,
                      exec, input);
  }
}

void CudaBackend::linear_recompute(const TensorView& out, const ConstTensorView& weight,
                                   const WeightCopy* copy, const Epilogue& epilogue, LinearExecution& exec,
                                   const Fp8Tensor& input) {
  const int64_t N = out.rows(), C = weight.cols(), OC = weight.rows();
  check_matrix("linear_recompute", "out", out.shape, N, OC);
  if (epilogue.residual != nullptr) {
    linear_recompute_residual(out.f32(), epilogue.residual, weight.f32(), copy, epilogue.bias, N, C, OC, exec,
                              input);
  } else {
    linear_recompute_as(out.data, out.dtype, weight.f32(), copy, epilogue.bias, N, C, OC, exec, input);
  }
}

void CudaBackend::linear_backward(const TensorView& dinp, const TensorView& dweight, float* dbias,
                                  const ConstTensorView& dout, const ConstTensorView& inp,
                                  const ConstTensorView& weight, const WeightCopy* copy,
                                  LinearExecution& exec, const Fp8Tensor* input, const Fp8Operand& gradient) {
  const auto [N, C, OC] = linear_sizes("linear_backward", inp.shape, weight.shape, dout.shape, "dout");
  check_matrix("linear_backward", "dweight", dweight.shape, OC, C);
  check_matrix("linear_backward", "dinp", dinp.shape, N, C);
  linear_backward_as(dinp.data, dinp.dtype, dweight.data, dweight.dtype, dbias, dout.data, dout.dtype,
                     inp.data, inp.dtype, weight.f32(), copy, N, C, OC, exec, input, gradient);
}

void CudaBackend::embedding_forward(const TensorView& out, const int32_t* tokens,
                                    const ConstTensorView& table, const ConstTensorView& positions) {
  const auto [B, T, C, V] = embedding_sizes("embedding_forward", out.shape, "out", table.shape,
                                            positions.shape, positions.has_data());
  const OpScope scope(*this, OpKind::other);
  cuda::embedding_forward(out.f32(), tokens, table.f32(), positions.has_data() ? positions.f32() : nullptr, B,
                          T, C, stream_);
}

void CudaBackend::embedding_backward(const TensorView& dtable, const TensorView& dpositions,
                                     const ConstTensorView& dout, const int32_t* tokens) {
  const auto [B, T, C, V] = embedding_sizes("embedding_backward", dout.shape, "dout", dtable.shape,
                                            dpositions.shape, dpositions.has_data());
  const OpScope scope(*this, OpKind::other);
  cuda::embedding_backward(dtable.f32(), dpositions.has_data() ? dpositions.f32() : nullptr, dout.f32(),
                           tokens, B, T, C, workspace_, stream_);
}

void CudaBackend::add(const TensorView& out, const ConstTensorView& a, const ConstTensorView& b) {
  check_shape("add", "b", b.shape, a.shape);
  check_shape("add", "out", out.shape, a.shape);
  add(out.f32(), a.f32(), b.f32(), a.numel());
}

void CudaBackend::softmax_cross_entropy(float* losses, const TensorView& logits, const int32_t* targets,
                                        int64_t V, float dloss) {
  check_dtype("softmax_cross_entropy", "logits", logits.dtype, {Dtype::f32, Dtype::bf16});
  const auto [N, Vp] = loss_sizes("softmax_cross_entropy", logits.shape, V);
  const OpScope scope(*this, OpKind::loss);
  if (logits.dtype == Dtype::bf16) {
    cuda::softmax_cross_entropy(losses, static_cast<__nv_bfloat16*>(logits.data), targets, N, V, Vp, dloss,
                                stream_);
  } else {
    cuda::softmax_cross_entropy(losses, logits.f32(), targets, N, V, Vp, dloss, stream_);
  }
}

Dtype CudaBackend::storage_type(const StorageQuery& query) const {
  switch (query.role) {
    case StorageRole::rounded_activation:
      return bf16_storage_type();
    case StorageRole::attention_input:
      return attention_input_type(query.channels, query.heads,
                                  query.kv_heads == 0 ? query.heads : query.kv_heads);
    case StorageRole::attention_output:
      return attention_output_type(query.channels, query.heads,
                                   query.kv_heads == 0 ? query.heads : query.kv_heads);
    case StorageRole::weight_gradient:
      OCTET_CHECK(query.layer != nullptr, "the layer whose weight gradient is stored");
      return weight_gradient_type(*query.layer);
    case StorageRole::logits:
      // A BF16 head's GEMM writes the logits in BF16 from its epilogue, the loss has BF16 kernels, and the
      // backward's BF16 GEMMs read the BF16 gradient as it is (linear.cu).
      OCTET_CHECK(query.layer != nullptr, "the LM head whose logits are stored");
      return logits_in_bf16(*query.layer) ? Dtype::bf16 : Dtype::f32;
  }
  return Dtype::f32;
}

void CudaBackend::attention_forward(const TensorView& out, float* lse, const ConstTensorView& qkv,
                                    AttentionHeads heads) {
  const AttentionSizes s = attention_sizes("attention_forward", qkv.shape, out.shape, heads);
  attention_forward_as(out.data, out.dtype, lse, qkv.data, qkv.dtype, s.B, s.T, s.C, heads.heads,
                       heads.kv_heads);
}

void CudaBackend::attention_backward(const TensorView& dqkv, const ConstTensorView& dout,
                                     const ConstTensorView& qkv, const ConstTensorView& out, const float* lse,
                                     AttentionHeads heads) {
  const auto [B, T, C, hs, kv_C, qkv_C] = attention_sizes("attention_backward", qkv.shape, out.shape, heads);
  check_shape("attention_backward", "dqkv", dqkv.shape, qkv.shape);
  check_shape("attention_backward", "dout", dout.shape, out.shape);
  OCTET_CHECK(dqkv.dtype == out.dtype && dout.dtype == out.dtype,
              "attention_backward: dqkv ({}) and dout ({}) are stored as out is ({})", dtype_name(dqkv.dtype),
              dtype_name(dout.dtype), dtype_name(out.dtype));
  attention_backward_as(dqkv.data, dout.data, qkv.data, qkv.dtype, out.data, out.dtype, lse, B, T, C,
                        heads.heads, heads.kv_heads);
}

void CudaBackend::activation_forward(Activation kind, const TensorView& out, const ConstTensorView& inp,
                                     const Fp8CastTarget& cast_for) {
  if (kind == Activation::swiglu) {
    const int64_t N = inp.rows(), C = activation_width("activation_forward", kind, inp.shape);
    check_matrix("activation_forward", "out", out.shape, N, C);
    OCTET_CHECK(out.data == nullptr || out.data != inp.data,
                "activation_forward: SwiGLU's out is not its inp");
    if (cast_for.given()) {
      swiglu_forward_cast_as(out.f32(), inp.data, inp.dtype, N, C, cast_for);
    } else {
      swiglu_forward_as(out.data, out.dtype, inp.data, inp.dtype, N, C);
    }
    return;
  }
  check_matrix("activation_forward", "out", out.shape, inp.rows(), inp.cols());
  if (cast_for.given()) {
    gelu_forward_cast_as(out.f32(), inp.data, inp.dtype, inp.rows(), inp.cols(), cast_for);
  } else {
    gelu_forward_as(out.data, out.dtype, inp.data, inp.dtype, inp.numel());
  }
}

void CudaBackend::activation_backward(Activation kind, const TensorView& dinp, const ConstTensorView& inp,
                                      const ConstTensorView& dout, float* dbias,
                                      const Fp8CastTarget& cast_for) {
  const int64_t N = inp.rows(), C = activation_width("activation_backward", kind, inp.shape);
  check_matrix("activation_backward", "dout", dout.shape, N, C);
  check_matrix("activation_backward", "dinp", dinp.shape, N, inp.cols());
  OCTET_CHECK(dout.dtype == inp.dtype, "activation_backward: dout ({}) is stored as inp is ({})",
              dtype_name(dout.dtype), dtype_name(inp.dtype));
  OCTET_CHECK(cast_for.given() || dbias == nullptr,
              "activation_backward sums a bias gradient only with the consumer's cast");
  if (kind == Activation::swiglu) {
    if (cast_for.given()) {
      swiglu_backward_cast_as(dinp.f32(), inp.data, dout.data, inp.dtype, N, C, dbias, cast_for);
    } else {
      swiglu_backward_as(dinp.data, dinp.dtype, inp.data, dout.data, inp.dtype, N, C);
    }
  } else if (cast_for.given()) {
    gelu_backward_cast_as(dinp.f32(), inp.data, dout.data, inp.dtype, N, C, dbias, cast_for);
  } else {
    gelu_backward_as(dinp.data, dinp.dtype, inp.data, dout.data, inp.dtype, inp.numel());
  }
}

void CudaBackend::rotary_embedding(const TensorView& x, const ConstTensorView& table, int64_t heads,
                                   bool inverse) {
  const auto [B, T, hs] = rotary_sizes("rotary_embedding", x.shape, table.shape, heads);
  check_dtype("rotary_embedding", "x", x.dtype, {Dtype::f32, Dtype::bf16});
  check_dtype("rotary_embedding", "table", table.dtype, {Dtype::f32});
  const OpScope scope(*this, OpKind::other);
  if (x.dtype == Dtype::bf16) {
    cuda::rotary_embedding(static_cast<uint16_t*>(x.data), table.f32(), B, T, x.shape[2], heads, hs, inverse,
                           stream_);
  } else {
    cuda::rotary_embedding(x.f32(), table.f32(), B, T, x.shape[2], heads, hs, inverse, stream_);
  }
}

}  // namespace cuda::backend_internal

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
  return std::make_unique<cuda::backend_internal::CudaBackend>(options);
}

}  // namespace octet
