// The device side of the FP8 scaling states: what the GPU keeps for each FP8 linear layer (the scaling state
// of each operand, the scales of the casts in flight, the casts' results and telemetry), the recipe as plain
// numbers, and one cast's pending update. device_scaling.cu updates these on the device after each cast,
// exactly as the CPU reference does on the host (src/numerics/*_scaling.cpp).
// Internal to the CUDA backend: include only from its .cu files.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "octet/cuda/cast.h"
#include "octet/cuda/device.h"
#include "octet/numerics/scaling.h"

namespace octet::cuda::backend_internal {

inline constexpr int kMaxHistory = 1024;  // fp8.amax_history's upper bound (src/config/run_config.cpp)
inline constexpr int kActivation = 0, kWeight = 1, kGradient = 2;

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
};

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

}  // namespace octet::cuda::backend_internal
