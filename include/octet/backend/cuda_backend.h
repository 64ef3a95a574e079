// The CUDA backend: the Backend interface on an NVIDIA GPU, held to the CPU reference op by op. FP8 GEMMs run
// on FP8 tensor cores through cuBLASLt where the GPU has them (compute capability 8.9 and up); the scaling
// state of every FP8 operand lives on the device, so that no step waits for the host. Defined in the
// octet_cuda library, which only a CUDA build has; the engine and the `octet` tool reach it through the
// backend registry (registry.h, cuda_registration.h), and tests of the CUDA backend call it directly.
#pragma once

#include <memory>
#include <string>

#include "octet/backend/backend.h"

namespace octet {

// What a CUDA device is and can do.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;
  int minor = 0;
  bool fp8_tensor_cores = false;  // compute capability 8.9 or above
  size_t memory_bytes = 0;
};

// Usable CUDA devices: 0 without a driver or a GPU.
int cuda_device_count();
// True: the CUDA backend is linked in (a build without CUDA has no octet_cuda, and the registry no "cuda").
bool cuda_backend_built();

struct CudaBackendOptions {
  int device = 0;
  // Without FP8 tensor cores (compute capability below 8.9) FP8 GEMMs run as BF16 GEMMs on the very same
  // FP8 codes, then apply the two scales: the numerics stay those of FP8. This forces that path on any GPU
  // (tests use it to check it on Hopper).
  bool emulate_fp8 = false;
  // Attention's products on BF16 tensor cores (float32 accumulation and softmax), as production flash
  // attention does; false: float32 throughout, as the CPU reference.
  bool bf16_attention = false;
  // Which kernels run BF16 attention (bf16_attention): cuDNN's fused flash attention (loaded at run time,
  // libcudnn.so.9), octet's own, or cuDNN where it loads and has an engine for the shape and octet's
  // otherwise (with a warning on stderr for a shape cuDNN refuses). cudnn throws octet::Error (invalid_input)
  // at construction where cuDNN cannot be loaded.
  enum class AttentionKernels { automatic, cudnn, octet };
  AttentionKernels attention = AttentionKernels::automatic;
  // Where attention runs on cuDNN, which reads and writes bf16: attention's output and the gradients on
  // either side of it (dout, dqkv) stored in bf16 (Backend::storage_type, role attention_output), which changes no result
  // and saves converting them around every cuDNN call; false keeps them in float32 and converts (tests
  // compare the two).
  bool attention_outputs_in_bf16 = true;
  // Tensors whose values the model rounds to bf16 (the MLP's hidden activation and its gradient in bf16 and
  // fp8 modes) stored in bf16 (Backend::storage_type, role rounded_activation), read and written so by the GEMMs and GELU
  // kernels; false stores their float32 values, rounded in place (tests compare the two).
  bool hidden_in_bf16 = true;
  // Weight gradients that the model keeps rounded to bf16 (train.weight_gradients = "bf16") stored in bf16
  // (Backend::storage_type, role weight_gradient), written and added to so by the weight-gradient GEMMs and read so by the
  // gradient norm and AdamW; false stores their float32 values, rounded in place (tests compare the two).
  bool weight_gradients_in_bf16 = true;
  // Each GEMM shape's cuBLASLt algorithm: the heuristic's first answer (false: reproducible bits), or the
  // fastest of its first candidates, timed on the shape's first product (true; octet/cuda/gemm.h,
  // GemmAlgorithmChoice::timed).
  bool time_gemm_algorithms = false;
};

// Throws octet::Error (invalid_input) when the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});
// The device behind a backend made by make_cuda_backend.
CudaDeviceInfo cuda_device_info(int device);
// Whether a backend made with bf16_attention runs attention over C channels in NH heads on BF16 tensor cores
// on the current device: head sizes that are multiples of 16 up to 128, compute capability 8.0 or above.
// Otherwise that attention runs in float32 (correct, much slower), and whoever asked for BF16 says so.
bool cuda_attention_on_tensor_cores(int64_t C, int64_t NH);
// Which kernels a backend made with bf16_attention and `kernels` runs attention with, for B x T tokens over C
// channels in NH heads: "cuDNN 9.19.0 fused flash attention" or "octet's flash-attention kernels
// (...why...)". Throws octet::Error (invalid_input) where kernels is cudnn and cuDNN cannot run it.
std::string cuda_attention_kernels(int64_t B, int64_t T, int64_t C, int64_t NH,
                                   CudaBackendOptions::AttentionKernels kernels);

}  // namespace octet
