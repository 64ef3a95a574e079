// GPT-2, written once against the backend interface: forward and backward by hand (no autograd), parameters
// and gradients in one contiguous buffer each, activations in one planned buffer sized for the largest
// micro-batch. The LM head is tied to the token embedding.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/model/config.h"
#include "octet/model/precision_policy.h"

namespace octet {

struct ParameterInfo {
  std::string name;            // "wte", "wpe", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", ..., "ln_f.bias"
  std::vector<int64_t> shape;  // linear weights are [out_features, in_features]
  int64_t offset = 0;          // into the parameter (and gradient) buffer, in floats
  int64_t count = 0;
  bool weight_decay = false;  // matrices (every 2-D parameter, embeddings included) decay; vectors do not
};

// Counters of what the GEMMs did since the last reset.
struct GemmCounters {
  int64_t fp8_gemms = 0;
  int64_t other_gemms = 0;
  int64_t saturated = 0;
  int64_t underflowed = 0;
};

class Gpt2 {
 public:
  // max_batch and max_seq_len size the activation plan; forward accepts any B <= max_batch, T <= max_seq_len.
  Gpt2(const Gpt2Config& config, Backend& backend, PrecisionPolicy policy, int64_t max_batch,
       int64_t max_seq_len);
  ~Gpt2();
  Gpt2(const Gpt2&) = delete;
  Gpt2& operator=(const Gpt2&) = delete;

  const Gpt2Config& config() const { return config_; }
  const PrecisionPolicy& policy() const { return policy_; }
  Backend& backend() { return backend_; }

  // GPT-2 initialisation: weights normal(0, 0.02), residual projections normal(0, 0.02 / sqrt(2 L)), biases
  // zero, LayerNorm weight one; deterministic from the seed. Padded vocabulary rows are zero.
  void init_weights(uint64_t seed);

  const std::vector<ParameterInfo>& parameters() const { return parameters_; }
  const ParameterInfo& parameter(std::string_view name) const;
  int64_t parameter_count() const { return parameter_count_; }
  float* params() { return params_->floats(); }
  float* grads() { return grads_->floats(); }

  // Remakes the GEMMs' weight copies (BF16/FP16 rounding, FP8 casts); call after every change of params().
  void refresh_weight_copies();

  // Forward over tokens and targets [B, T] (host memory); returns the mean loss over the B*T positions.
  float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
  // Logits-only forward (no targets); logits() then holds [B*T, Vp].
  void forward_logits(const int32_t* tokens, int64_t B, int64_t T);
  // Backward of the last forward, accumulating into grads(): the gradient of dloss_scale * sum(losses).
  // Use dloss_scale = loss_scale / (B * T * accumulation_steps) for the mean over an accumulated step.
  void backward(float dloss_scale);
  void zero_grad();

  // Backend memory: [B*T, Vp] logits of the last forward (gradients after backward), [B*T] losses.
  const float* logits() const;
  const float* losses() const;

  GemmCounters& counters() { return counters_; }
  // Whether forwards update the FP8 scaling state (amax histories); off while evaluating.
  void set_scaling_updates(bool on);
  // FP8 scaling state of a linear layer (null when the layer is not in FP8).
  Fp8LinearState* fp8_state(std::string_view layer);
  // FP8 cast telemetry of a linear layer: running totals of its training casts since construction or the
  // last reset_telemetry (null when the layer is not in FP8), brought up to date from the backend (a copy
  // from the device on a GPU: call it on telemetry steps only). reset_telemetry zeroes the host copies.
  Fp8LinearTelemetry* telemetry(std::string_view layer);
  void reset_telemetry();
  // Whether training casts add to the telemetry (on by default), and whether they also add the signal and
  // noise energies behind the SQNR (off by default: a dequantizing pass per cast).
  void set_telemetry(bool collect, bool measure_sqnr);
  // Runs all three GEMMs of `layer` in BF16 from the next forward on, remakes its weight copy to match, and
  // records `reason` in the precision policy (and so in its map).
  void move_layer_to_bf16(std::string_view layer, std::string reason);

 private:
  struct Activations;
  struct Linear;
  void build_parameters();
  void plan_activations();
  void run_forward(const int32_t* tokens, int64_t B, int64_t T);
  Linear& linear(std::string_view name);

  Gpt2Config config_;
  Backend& backend_;
  PrecisionPolicy policy_;
  int64_t max_batch_;
  int64_t max_seq_len_;
  std::vector<ParameterInfo> parameters_;
  int64_t parameter_count_ = 0;
  std::unique_ptr<Buffer> params_;
  std::unique_ptr<Buffer> grads_;
  std::unique_ptr<Buffer> activations_;
  std::unique_ptr<Buffer> activation_grads_;
  std::unique_ptr<Buffer> tokens_;
  std::unique_ptr<Activations> acts_;
  std::vector<std::unique_ptr<Linear>> linears_;
  GemmCounters counters_;
  bool collect_telemetry_ = true;
  int64_t last_B_ = 0;
  int64_t last_T_ = 0;
  bool have_targets_ = false;
};

}  // namespace octet
