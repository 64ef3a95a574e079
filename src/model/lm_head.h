// A language model's LM head in training, one chunk of rows at a time, built from the backend's ops: the
// head's forward GEMM into a chunk of logits, the softmax cross-entropy over them, and the head's backward
// from the gradient the loss leaves in their place. A model runs its [N, C] head input in chunks so that a
// step never holds all [N, Vp] logits. Internal to the models (src/model).
#pragma once

#include <cstdint>

#include "octet/backend/backend.h"

namespace octet {

struct LmHeadChunk {
  float* losses = nullptr;           // [n]
  void* logits = nullptr;            // scratch of [n, Vp] floats: the logits, then their gradient
  const int32_t* targets = nullptr;  // [n], on the backend
  TensorView dinp;                   // [n, C], overwritten; used only when dloss != 0
  TensorView dweight;                // [Vp, C], accumulated as linear_backward does
  ConstTensorView inp;               // [n, C]
  ConstTensorView weight;            // [Vp, C]
  const WeightCopy* copy = nullptr;
  // An FP8 head's input cast (its producer's, or made by the forward into the slot), and the slot for its
  // output gradient's cast (linear_forward's and linear_backward's Fp8Operand).
  Fp8Operand input;
  Fp8Operand gradient;
  int64_t V = 0;       // the vocabulary: the first V of the Vp columns
  float dloss = 0.0f;  // 0: the losses only
};

// The type a chunk's logits are kept in: the backend's storage_type (StorageRole::logits) where the head
// rounds them to BF16 (logits_in_bf16), float32 otherwise.
Dtype lm_head_logits_type(const Backend& backend, const LinearExecution& exec);

// One chunk: logits = inp x weight^T (no bias), rounded to BF16 where logits_in_bf16(exec), so that a
// backend may keep them in BF16 from its GEMM on (lm_head_logits_type) and still compute the same values;
// losses from softmax_cross_entropy; and, when dloss != 0, linear_backward from the logits' gradient. The
// head's GEMMs are counted as linear_forward and linear_backward count them.
void lm_head_chunk(Backend& backend, const LmHeadChunk& chunk, LinearExecution& exec);

}  // namespace octet
