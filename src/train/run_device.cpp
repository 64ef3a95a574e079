// Where a training run trains (see run_device.h).
#include "run_device.h"

#include <fmt/format.h>

namespace octet {

namespace {

AttentionKernelChoice attention_kernels(const RunConfig& config) {
  return config.attention == "cudnn"   ? AttentionKernelChoice::cudnn
         : config.attention == "octet" ? AttentionKernelChoice::octet
                                       : AttentionKernelChoice::automatic;
}

}  // namespace

DeviceChoice choose_device(const RunConfig& config, int gpu) {
  DeviceChoice d;
  d.gpu = gpu;
  const bool fp8 = config.precision.mode == MixedPrecision::fp8;
  // Null in a build without CUDA (or a program that did not register it).
  const BackendFactory* cuda = find_backend("cuda");
  const int gpus = cuda != nullptr ? cuda->device_count() : 0;
  if (config.device == "cuda") {
    OCTET_REQUIRE(
        cuda != nullptr,
        "train.device = \"cuda\": this octet was built without CUDA; rebuild where nvcc is found, or "
        "use \"cpu\" or \"auto\"");
    OCTET_REQUIRE(gpus > 0,
                  "train.device = \"cuda\": no CUDA GPU is visible (no driver, or no device); use "
                  "\"cpu\" or \"auto\"");
  }
  d.cuda = config.device == "cuda" || (config.device == "auto" && gpus > 0);
  // fp8.auto_filter measures; on the CPU there is nothing to measure, and a modelled filter would decide from
  // numbers that are not this machine's.
  OCTET_REQUIRE(
      !fp8 || !config.precision.auto_filter || d.cuda,
      "fp8.auto_filter = true times each FP8 layer's GEMMs on the GPU, and this run trains on the CPU "
      "backend; leave fp8.auto_filter out here (`octet localize` models the gain without a GPU)");
  OCTET_REQUIRE(
      config.attention != "cudnn" || d.cuda,
      "train.attention = \"cudnn\" runs on the GPU only, and this run trains on the CPU backend; use "
      "\"auto\" or \"octet\"");
  OCTET_REQUIRE(
      config.attention != "cudnn" || config.precision.mode != MixedPrecision::fp32,
      "train.attention = \"cudnn\" runs attention on BF16 tensor cores, and train.mixed_precision = "
      "\"fp32\" keeps it in float32; use \"auto\" or \"octet\", or another mixed_precision");
  if (!d.cuda) {
    d.backend = find_backend("cpu");
    OCTET_CHECK(d.backend != nullptr, "the CPU backend is registered");
    d.line = config.device == "auto"
                 ? fmt::format("train.device = \"auto\": training on the CPU backend ({}){}",
                               cuda != nullptr ? "no CUDA GPU visible" : "built without CUDA",
                               fp8 ? ", FP8 emulated bit for bit" : "")
                 : std::string(fp8 ? "training on the CPU backend, FP8 emulated bit for bit"
                                   : "training on the CPU backend");
    if (config.time_gemm_algorithms) d.line += " (train.gemm_algorithms = \"timed\" applies to the GPU only)";
    return d;
  }
  d.backend = cuda;
  OCTET_REQUIRE(gpu < gpus, "this rank is rank {} on its machine, which shows {} GPU(s): start at most one rank "
                "per GPU", gpu, gpus);
  const BackendDevice info = cuda->device(gpu);
  if (fp8) {
    const RecipeKind kind = config.precision.recipe;
    OCTET_REQUIRE(cuda->supports_recipe(kind),
                  "fp8.recipe = \"{}\" is not supported on the CUDA backend yet; use \"delayed\", "
                  "\"current\" or \"static\" on the GPU, or train.device = \"cpu\"",
                  recipe_name(kind));
    if (!info.fp8_tensor_cores) {
      OCTET_REQUIRE(!config.fp8_strict,
                    "fp8.strict = true: {} (compute capability {}.{}) has no FP8 tensor cores (8.9 or above "
                    "needed); set fp8.strict = false to run FP8 GEMMs as BF16 GEMMs on the FP8 values",
                    info.name, info.major, info.minor);
      d.emulate_fp8 = true;
    }
  }
  d.line = fmt::format("training on {}{}", cuda->describe_device(gpu),
                       !fp8            ? ""
                       : d.emulate_fp8 ? "; WARNING: no FP8 tensor cores, FP8 GEMMs run as BF16 GEMMs on "
                                         "the FP8 values (FP8 numerics, no FP8 speed)"
                                       : "; FP8 GEMMs on FP8 tensor cores (cuBLASLt)");
  if (config.time_gemm_algorithms) d.line += "; GEMM algorithms timed (train.gemm_algorithms)";
  // Every mode but fp32 asks for attention on BF16 tensor cores (make_backend); say where it really runs.
  if (config.precision.mode != MixedPrecision::fp32) {
    const int64_t C = config.model.channels, NH = config.model.heads;
    d.line += cuda->attention_on_tensor_cores(C, NH)
                  ? fmt::format("; attention on BF16 tensor cores: {}",
                                cuda->attention_kernels(config.train.batch_size, config.train.seq_len, C, NH,
                                                        attention_kernels(config)))
                  : fmt::format(
                        "; WARNING: attention in float32, not on BF16 tensor cores (head size {} is not "
                        "a multiple of 16 up to 128, or the GPU predates compute capability 8.0): "
                        "correct but much slower",
                        NH > 0 ? C / NH : 0);
  }
  return d;
}

std::unique_ptr<Backend> make_backend(const DeviceChoice& device, const RunConfig& config) {
  BackendOptions options;  // the CPU backend takes none of them
  options.emulate_fp8 = device.emulate_fp8;
  options.bf16_attention = config.precision.mode != MixedPrecision::fp32;
  options.attention = attention_kernels(config);
  options.time_gemm_algorithms = config.time_gemm_algorithms;
  options.device = device.gpu;
  return device.backend->make(options);
}

}  // namespace octet
