// FP8 tensors: the E4M3 or E5M2 codes of a matrix x [rows, cols] as a backend keeps them for FP8 GEMMs, the
// codes of its transpose x^T [cols, rows] where a GEMM reads them K-major, and the scales they were cast with
// (scale_inv turns a code back into its value: one float for the per-tensor recipes, one per tile or block
// for the block recipes). Each cast into one reads and updates the scaling state of one operand (activation,
// weight or gradient) of one FP8 linear layer, and the amax that cast saw goes there.
//
// The caller owns the tensor and hands it from op to op: a linear layer's input cast goes from the op that
// casts it (the producer, or the layer's forward) to the layer's forward GEMM and on to its backward; the
// output-gradient cast from its producer (or the layer's backward) to the layer's two backward GEMMs. The
// backend makes it where the caller's slot is empty and resizes its memory on each cast into it.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "octet/check.h"
#include "octet/numerics/scaling.h"
#include "octet/tensor/tensor.h"

namespace octet {

// What an FP8 tensor holds after its last cast. The pointers are into the backend's memory (the device's on
// a GPU) and stay valid until the next cast into the tensor; null where that part is not kept.
struct Fp8TensorView {
  const void* codes = nullptr;             // [rows, cols]
  const void* codes_transposed = nullptr;  // [cols, rows]
  const float* scale_inv = nullptr;        // one per tensor, tile or block, by granularity
  Dtype format = Dtype::e4m3;
  Shape shape;  // [rows, cols]; empty before the first cast
  TensorRole role = TensorRole::activation;
  ScaleGranularity granularity = ScaleGranularity::per_tensor;
  // The host copy of the scaling state the cast read and updated (a GPU backend's device copy reaches it
  // through Backend::fetch_scaling).
  const ScalingState* state = nullptr;

  bool empty() const { return codes == nullptr && codes_transposed == nullptr; }
};

// An FP8 tensor in a backend's memory; each backend implements it over its own storage.
class Fp8Tensor {
 public:
  virtual ~Fp8Tensor() = default;
  virtual Fp8TensorView view() const = 0;
};

// A backend's own tensor type T in a caller's slot for `what`'s FP8 tensor: the one there, or a new one where
// the slot is empty (or holds another backend's).
template <typename T>
T& fp8_tensor_in(std::unique_ptr<Fp8Tensor>* slot, std::string_view what) {
  OCTET_CHECK(slot != nullptr, "a slot for {}'s FP8 tensor", what);
  auto* t = dynamic_cast<T*>(slot->get());
  if (t == nullptr) {
    *slot = std::make_unique<T>();
    t = static_cast<T*>(slot->get());
  }
  return *t;
}

}  // namespace octet
