// The octet side of the golden tests (GPT-2 and Llama): a small model with odd sizes on the CPU backend in
// fp32 mode, trained for a few AdamW steps on one fixed batch, keeping what the test compares with PyTorch
// (logits, loss and gradients before the first update, the loss of every step) and the parameters it started
// from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "golden_io.h"
#include "octet/model/config.h"
#include "octet/model/decoder.h"
#include "octet/train/optimizer.h"

namespace octet::testing {

struct GoldenCase {
  std::string name;
  ModelConfig config;
  int64_t B = 0;
  int64_t T = 0;
  uint64_t seed = 0;  // weights, then tokens and targets
  // Multiplies every matrix after init_weights. The initialisation keeps pre-activations near zero, where
  // GELU and SiLU are almost linear and attention almost uniform; larger matrices take them into their
  // curved regions, where a wrong activation, a wrong softmax or a wrong rotation shows.
  float matrix_scale = 1.0f;
  int64_t steps = 0;
  float learning_rate = 0.0f;
  AdamWSettings optimizer;
};

// GPT-2: V=61, Vp=64, maxT=16, L=2, NH=4, C=32 (head size 8), B=3, T=11: odd on purpose, with padded
// vocabulary columns and a sequence shorter than the position table. "init": the weights as init_weights
// makes them; "wide": the matrices scaled up (see matrix_scale).
std::vector<GoldenCase> gpt2_golden_cases();

// Llama, both with the matrices scaled up (see matrix_scale) and ten AdamW steps at lr 1e-3.
// "grouped": V=61, Vp=64, L=2, NH=4, KV=2, C=64 (head size 16), F=96, rope_theta 10000, untied head,
// B=2, T=16 (the whole rotary table). "multi_query_tied": one key and value head shared by NH=3 heads,
// C=48 (head size 16), F=80, a head tied to the embedding, B=3, T=11 of maxT=16.
std::vector<GoldenCase> llama_golden_cases();

struct OctetRun {
  std::vector<ParameterInfo> parameters;
  std::vector<int32_t> tokens;        // [B*T]
  std::vector<int32_t> targets;       // [B*T]
  std::vector<float> initial_params;  // what training started from
  std::vector<float> logits;          // [B*T, Vp] before the first update
  float loss = 0.0f;                  // before the first update
  std::vector<float> grads;           // before the first update
  std::vector<float> step_losses;     // one per step, taken before its update
  std::vector<float> final_params;
};

// Builds the model from the case's seed and trains it: for each step zero_grad, forward, backward with
// 1/(B*T), AdamW step with grad_scale 1, refresh_weight_copies. After init_weights the matrices are scaled
// by matrix_scale, and the biases and norm gains get random values (init leaves them at 0 and 1, where a
// forgotten bias or gain would go unnoticed).
OctetRun run_octet(const GoldenCase& golden_case);

// The PyTorch script's input for this run: the case's config and hyperparameters, the run's tokens and
// targets, its initial parameters in Decoder::parameters() order.
GoldenInput golden_input(const GoldenCase& golden_case, const OctetRun& run);

}  // namespace octet::testing
