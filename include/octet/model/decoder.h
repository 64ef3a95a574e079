// A decoder-only transformer, GPT-2 or Llama (model.arch), written once against the backend interface:
// forward and backward by hand (no autograd), parameters in one contiguous buffer, their gradients in one per
// storage type (float32, and bf16 for weight gradients kept so), activations in one planned buffer sized for
// the largest micro-batch, and a few gradient buffers that every layer's backward reuses. The block is the
// same pre-norm block in both; the architecture picks the kinds of its ops: LayerNorm or RMSNorm, learned
// positions or the rotary embedding, multi-head or grouped-query attention, GELU or SwiGLU, biases or none,
// a head tied to the token embedding or its own. Training and evaluation run the head and the loss in row
// chunks, never holding all logits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/model/config.h"
#include "octet/model/model.h"
#include "octet/model/precision_policy.h"

namespace octet {

// What a linear layer is in the block (decoder_internal.h).
enum class LinearRole : uint8_t;

class Decoder final : public Model {
 public:
  // max_batch and max_seq_len size the activation plan; forward accepts any B <= max_batch, T <= max_seq_len.
  Decoder(const ModelConfig& config, Backend& backend, PrecisionPolicy policy, int64_t max_batch,
          int64_t max_seq_len);
  ~Decoder() override;
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelConfig& config() const { return config_; }
  std::string_view architecture() const override { return architecture_name(config_.arch); }
  std::string describe() const override { return config_.describe(); }
  const PrecisionPolicy& policy() const override { return policy_; }
  Backend& backend() override { return backend_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t padded_vocab_size() const override { return config_.padded_vocab(); }
  int64_t max_seq_len() const override { return config_.max_seq_len; }

  // GPT-2 initialisation: weights normal(0, 0.02), residual projections normal(0, 0.02 / sqrt(2 L)), biases
  // zero, LayerNorm weight one. Llama's (Hugging Face's LlamaPreTrainedModel): every matrix normal(0, 0.02),
  // RMSNorm weight one. Deterministic from the seed; padded vocabulary rows are zero.
  void init_weights(uint64_t seed) override;

  const std::vector<ParameterInfo>& parameters() const override { return parameters_; }
  const ParameterInfo& parameter(std::string_view name) const override;
  int64_t parameter_count() const override { return parameter_count_; }
  // Every parameter but GPT-2's wpe, the learned position embedding, and an untied head's token embedding.
  int64_t flop_parameter_count() const override;
  float* params() override { return params_->floats(); }
  Buffer& parameter_memory() override { return *params_; }
  // The float32 gradients, each at its parameter's grad_offset. A linear layer's weight gradient that no
  // backward has written since zero_grad is zeroed here first (zero_grad leaves those to their layer's first
  // backward), in both gradient buffers.
  float* grads() override;
  // The bf16 gradients (parameters whose grad_type is bf16; null when there are none), zeroed as grads().
  void* grads_bf16() override;
  // A parameter's gradient, in the buffer of its grad_type (after grads()' zeroing).
  const void* gradient(const ParameterInfo& p) override;
  // The sum of the squares of every gradient, in float64, bf16 ones as their float32 values: in a fixed
  // order, and finite exactly when every gradient is.
  double gradient_sum_of_squares() override;
  // Whether every element of a parameter's gradient is finite.
  bool gradient_finite(const ParameterInfo& p) override;

  // Remakes the GEMMs' weight copies (BF16/FP16 rounding, FP8 casts); call after every change of params().
  void refresh_weight_copies() override;
  // The weights whose copies the GEMMs read, with what remakes them: an optimizer that updates one of these
  // parameters can remake its copy in the same pass (Backend::optimizer_update) instead of calling
  // refresh_weight_copies afterwards.
  std::vector<WeightCopySlot> weight_copy_slots() override;

  // Rows of logits the LM head computes at a time in forward and backward (kHeadChunkRows, or all B*T rows
  // when the head runs a GEMM in FP8, so that its casts and scaling see the whole micro-batch at once).
  static constexpr int64_t kHeadChunkRows = 4096;

  // Forward over tokens and targets [B, T] (host memory); returns the mean loss over the B*T positions. The
  // LM head and the loss run chunk by chunk. With dloss != 0 the head's backward runs here too, on each
  // chunk right after its loss: the gradient of dloss * sum(losses) is added to the head's weight gradient
  // (wte's in grads(): zero the gradients before this forward, not after it) and backward(dloss) goes on
  // from there. With dloss = 0 (evaluation) only the loss is computed.
  float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                float dloss = 0.0f) override;
  // Logits-only forward (no targets); logits() then holds [B*T, Vp] (a buffer made on the first call).
  void forward_logits(const int32_t* tokens, int64_t B, int64_t T) override;
  // Backward of the last forward with targets, accumulating into grads(): the gradient of
  // dloss_scale * sum(losses). Use dloss_scale = loss_scale / (B * T * accumulation_steps) for the mean over
  // an accumulated step. After forward(..., dloss) it takes the same dloss and starts below the LM head;
  // after a loss-only forward it runs the head's backward first (recomputing the logits when they took more
  // than one chunk).
  void backward(float dloss_scale) override;
  void set_gradient_ready(GradientReady ready) override { gradient_ready_ = std::move(ready); }
  std::vector<int64_t> forward_parameter_bounds() const override { return forward_bounds_; }
  void set_parameters_needed(ParametersNeeded needed) override { parameters_needed_ = std::move(needed); }
  void set_backward_parameters_needed(ParametersNeeded needed) override {
    backward_parameters_needed_ = std::move(needed);
  }
  int64_t weight_copies_made() const override { return weight_copies_made_; }
  std::optional<TokenRowGradient> token_row_gradient() const override;
  std::vector<Fp8LinearState*> fp8_states(std::span<const std::string> layers) override;
  std::optional<double> router_balance() const override;
  // Zeroes the gradients: the linear layers' weight gradients by their next backward, which writes them
  // instead of adding to them (LinearExecution::accumulate_weight_gradient), the others here.
  void zero_grad() override;

  // Backend memory: [B*T, Vp] logits of the last forward_logits (only that forward keeps them all), and the
  // [B*T] losses of the last forward with targets.
  const float* logits() const override;
  const float* losses() const override;

  GemmCounters& counters() override { return counters_; }
  // Whether forwards update the FP8 scaling state (amax histories); off while evaluating.
  void set_scaling_updates(bool on) override;
  // FP8 scaling state of a linear layer (null when the layer is not in FP8).
  Fp8LinearState* fp8_state(std::string_view layer) override;
  // FP8 cast telemetry of a linear layer: running totals of its training casts since construction or the
  // last reset_telemetry (null when the layer is not in FP8), brought up to date from the backend (a copy
  // from the device on a GPU: call it on telemetry steps only). reset_telemetry zeroes the host copies.
  Fp8LinearTelemetry* telemetry(std::string_view layer) override;
  void reset_telemetry() override;
  // Whether training casts add to the telemetry (on by default), and whether they also add the signal and
  // noise energies behind the SQNR (off by default: a dequantizing pass per cast).
  void set_telemetry(bool collect, bool measure_sqnr) override;
  // Runs all three GEMMs of `layer` in BF16 from the next forward on, remakes its weight copy to match, and
  // records `reason` in the precision policy (and so in its map).
  void move_layer_to_bf16(std::string_view layer, std::string reason) override;
  // A line for train.activation_checkpointing other than "none" (what each block keeps, the activation
  // buffer's size with and without it) and one for each of fp8.recompute_mlp, _qkv, _residual and
  // _weight_transposes that is on: what it does in this model (which layers recompute, the memory it saves),
  // lines joined by '\n'; empty when all are off.
  std::string memory_line() override;
  std::vector<FusionRecord> fusions() const override;
  // Bytes of the planned activation buffer (Activations), and what it would take under
  // train.activation_checkpointing = "none". Buffers made later (a layer moved to BF16) are not counted.
  int64_t activation_bytes() const { return activation_bytes_; }
  int64_t activation_bytes_without_checkpointing() const { return unchecked_activation_bytes_; }

  // Hugging Face's names and layout. GPT-2 (gpt2_hf.cpp): "transformer." before every name ("wte" and
  // "wpe" become "transformer.wte.weight" and "transformer.wpe.weight"), wte cut to the V real vocabulary
  // rows, and the blocks' linear weights (Conv1D in transformers) stored [in_features, out_features], the
  // transpose of octet's. Llama (llama_hf.cpp): octet's names are LlamaForCausalLM's without "model.",
  // embed_tokens and lm_head cut to the V real rows, every weight in octet's layout.
  std::string hf_name(const ParameterInfo& p) const override;
  std::vector<int64_t> hf_shape(const ParameterInfo& p) const override;
  std::vector<float> to_hf(const ParameterInfo& p, std::span<const float> params) const override;
  void from_hf(const ParameterInfo& p, std::span<const float> hf, std::span<float> params) const override;
  // GPT-2: n_layer, n_head, n_embd, vocab_size, padded_vocab_size and n_positions. Llama: LlamaConfig's
  // names (num_hidden_layers, hidden_size, ...) and padded_vocab_size.
  std::string model_json() const override;

 private:
  struct Activations;
  struct Gradients;
  struct Linear;
  struct BlockNames;
  BlockNames block_names(int64_t l) const;
  // Parameter names: the token embedding ("wte", "embed_tokens.weight") and the final normalization's
  // ("ln_f", "norm"; NAME.weight, NAME.bias).
  std::string embedding_name() const;
  // Whether p holds a row per token of the padded vocabulary (the token embedding, an untied head).
  bool vocabulary_rows(const ParameterInfo& p) const;
  std::string final_norm_name() const;
  // The normalization's kind and its parameters: bias null for RMSNorm.
  Normalization norm_kind() const;
  const float* norm_bias(const std::string& norm);
  float* norm_bias_grad(const std::string& norm);
  Activation activation_kind() const;
  // The linear layer's bias in params() (null: none).
  const float* bias_of(const Linear& layer);
  // Llama: the rotary table [max_seq_len, hs] (cos, then sin), made once.
  void build_rotary_table();
  ConstTensorView rotary_table(int64_t T) const;
  AttentionHeads attention_heads() const { return {config_.heads, config_.kv()}; }
  // What the last forward left for backward.
  enum class Pending : uint8_t { nothing, loss, head_backward_done };
  // A mixture-of-experts block (decoder_moe.cpp). moe_forward: the MLP half of block l's forward, from the
  // residual stream after attention (residual2) into residual3: the second normalization, the router and
  // the grouping of the tokens by expert, the experts' GEMMs (one per expert with tokens), the shared
  // expert, and the weighted sum into the residual stream.
  void moe_forward(int64_t l, int64_t B, int64_t T, const float* residual2);
  // Its backward, from d(residual3) in the gradients' residual buffer through the second normalization's
  // backward, which adds d(residual2) to it; `residual` is the block's input (for a residual2 recomputed
  // by fp8.recompute_residual). The router's gradient includes the load-balancing loss's, scaled by
  // dloss_scale * B * T.
  void moe_backward(int64_t l, int64_t B, int64_t T, const float* residual, float dloss_scale);
  // The experts' rows of block l's last forward: where each expert's start (E + 1, on the host), as the
  // backend's group_by_expert placed them.
  std::vector<std::vector<int64_t>> expert_offsets_;
  // Each expert's assignments in block l's last forward, and the layer's balance (router_balance).
  std::vector<std::vector<int64_t>> expert_counts_;
  std::vector<double> layer_balance_;
  // How the experts' grouped rows are stored: the gate/up input, the down input, the down output's gradient
  // and the gate/up output's gradient, each bf16 (Backend::storage_type, rounded_activation) where every
  // expert's GEMMs that read it are BF16, which round it to bf16 anyway, and float32 otherwise (FP8 casts
  // read float32).
  Dtype expert_input_type_ = Dtype::f32;
  Dtype expert_act_type_ = Dtype::f32;
  Dtype expert_dout_type_ = Dtype::f32;
  Dtype expert_fch_gradient_type_ = Dtype::f32;
  // The linear layers of each block, in the order the block runs them.
  std::vector<std::vector<Linear*>> block_linears_;
  void build_parameters();
  void plan_activations();
  // Allocates the float32 input of `layer` that the plan left out (its FP8 cast was all it read) once the
  // layer reads it, i.e. after it moved to BF16.
  void keep_input_of(std::string_view layer);
  // Whether some expert of `role` (expert_fc, expert_fc_proj) reads more of its input (`operand`
  // activation) or output gradient (gradient) than its FP8 cast: a float32 copy of those rows is kept.
  bool experts_read(LinearRole role, TensorRole operand) const;
  // Whether the output of linear layer `layer` is recomputed in the backward (fp8.recompute_mlp, _qkv,
  // _residual) rather than kept; keep_output_of allocates it once that layer moves to BF16.
  bool recomputes(std::string_view layer);
  // How many blocks recompute the output of their layer of `role` (fc, qkv, proj).
  int64_t recomputed_layers(LinearRole role);
  void keep_output_of(std::string_view layer);
  // (Re)allocates the gradient buffers (Gradients) for the gradients that the layers' precision modes
  // write; run again when a layer moves to BF16.
  void plan_gradients();
  // The blocks and ln_f; the LM head is left to the caller.
  void run_forward(const int32_t* tokens, int64_t B, int64_t T);
  ActivationCheckpointing checkpointing() const { return policy_.settings().activation_checkpointing; }
  // Block l's forward from its input (the embedding's output or block l-1's residual3).
  void forward_block(int64_t l, int64_t B, int64_t T);
  // Block l's forward again, just before its backward (train.activation_checkpointing = "full"): its FP8
  // casts take the scales the forward's took (Linear::forward_activation) and, like evaluation casts, update
  // no scaling state; no GEMM, cast or telemetry is counted a second time.
  void rerun_block(int64_t l, int64_t B, int64_t T);
  // Under "selective": the output of the normalization feeding `next` (qkv, fc) made again into `out` from
  // its kept input, mean and rstd written again with the same values.
  void renormalize(const Linear& next, void* out, float* mean, float* rstd, const float* inp,
                   const std::string& norm, int64_t N);
  // Rows per LM head chunk for N rows.
  int64_t head_chunk_rows(int64_t N);
  // The LM head and the loss over the N rows of ln_f, chunk by chunk: logits of a chunk, its losses and,
  // when `backward`, its logits' gradient (scaled by dloss), the head's input gradient rows and weight
  // gradient. `recompute` false: the logits are already in the chunk buffer (a single chunk).
  void head_and_loss(int64_t N, float dloss, bool backward, bool recompute);
  float mean_loss(int64_t N);
  Linear& linear(std::string_view name);
  // The float32 master weight of `layer`, [out_features, in_features].
  ConstTensorView weight_of(const Linear& layer);
  // `layer`'s execution for its next backward: its weight-gradient GEMM writes the gradient where it is the
  // first since zero_grad, and adds to it otherwise.
  LinearExecution& backward_exec(Linear& layer);
  // The backward of block layer `layer` (Backend::linear_backward) into its weight gradient, which is
  // rounded to bf16 in place afterwards where the model keeps it rounded but the backend stores it in
  // float32.
  // With gradient_cast_by_producer, the layer's output-gradient cast is in its slot already
  // (activation_backward_into, the experts' grouped ops).
  // `gradient_slot` (null: gradient_codes_) is where the output gradient's cast is.
  void backward_linear(Linear& layer, void* dinp, Dtype dinp_type, float* dbias, const void* dout,
                       Dtype dout_type, const void* inp, Dtype inp_type, int64_t N,
                       bool gradient_cast_by_producer = false,
                       std::unique_ptr<Fp8Tensor>* gradient_slot = nullptr);
  // The layer's FP8 input as its linear_forward takes it: input_codes, cast by its producer or not.
  static Fp8Operand fp8_input(Linear& layer, bool cast_by_producer);
  // The FP8 input cast that the layer's forward kept, for linear_recompute.
  static const Fp8Tensor& kept_input(const Linear& layer);
  // Sets every parameter's grad_offset and grad_type, and allocates the two gradient buffers.
  void plan_parameter_gradients();
  // The normalization (LayerNorm, RMSNorm: norm_kind; mean and bias null for RMSNorm) and the activation
  // feeding the linear layer `next`: where `next` runs its forward GEMM in FP8, the op casts its output for it
  // in the same pass, and leaves `out` unwritten when that cast is all `next` reads. `out` is stored as
  // next's input_type.
  void norm_into(Linear& next, void* out, float* mean, float* rstd, const float* inp, const float* weight,
                 const float* bias, int64_t N, int64_t C);
  // The activation (GELU, SwiGLU) of inp [N, k H], the MLP's hidden activation stored as hidden_type_, into
  // out [N, H].
  void activation_into(Linear& next, void* out, const void* inp, int64_t N, int64_t H);
  // The activation's backward dinp [N, k H] = dout [N, H] * activation'(inp), the output gradient of the
  // linear layer `next` (the MLP's up projection), then next's backward (its input gradient into next_dinp;
  // next_inp is its forward input). Where next casts that gradient to FP8, the activation's backward casts it
  // for next and adds next's bias gradient in the same pass, and leaves dinp unwritten when that cast is all
  // next reads. inp and dout are stored as hidden_type_, next_inp as next's input_type.
  void activation_backward_into(Linear& next, float* dinp, const void* inp, const void* dout, int64_t N,
                                int64_t H, float* next_dinp, Dtype next_dinp_type, const void* next_inp);
  // How a block layer fed by a normalization (qkv, fc) stores its input gradient, which the normalization's
  // backward reads: rounded to bf16 where its input-gradient GEMM is BF16 or FP8, as PyTorch autocast and
  // Transformer Engine return a BF16 layer's input gradient (Backend::storage_type, the model rounding
  // in place where that is f32); float32 otherwise.
  Dtype norm_gradient_type(const Linear& consumer) const;
  // The input gradient of `consumer` just written as `type`: rounded in place where consumer's input-gradient
  // GEMM rounds it but the backend stores it in float32.
  void round_norm_gradient(const Linear& consumer, Dtype type, float* dinp, int64_t n);
  // x [n], a hidden tensor just written in float32 by a backend that stores them so: rounded to bf16 in
  // place where the model rounds them (hidden_in_bf16_); a no-op otherwise.
  void round_hidden(void* x, int64_t n);

  ModelConfig config_;
  Backend& backend_;
  PrecisionPolicy policy_;
  int64_t max_batch_;
  int64_t max_seq_len_;
  std::vector<ParameterInfo> parameters_;
  int64_t parameter_count_ = 0;
  std::unique_ptr<Buffer> params_;
  std::unique_ptr<Buffer> grads_;       // float32 gradients
  std::unique_ptr<Buffer> grads_bf16_;  // bf16 gradients; null when none is bf16
  int64_t grad_f32_count_ = 0;
  int64_t grad_bf16_count_ = 0;  // elements, each gradient's slice rounded up to 8 (16 bytes)
  // What zero_grad zeroes in grads_: every gradient but the linear layers' weights.
  std::vector<Backend::Range> zeroed_by_zero_grad_;
  std::unique_ptr<Buffer> activations_;
  int64_t activation_bytes_ = 0;
  int64_t unchecked_activation_bytes_ = 0;
  std::unique_ptr<Buffer> gradient_scratch_;
  int64_t gradient_wide_b_ = 0;                       // the width of Gradients::wide_b in gradient_scratch_
  // Whether gradient_scratch_ holds the experts' output gradients in float32 (rows_dout, rows_2f): where
  // some expert's backward reads more of them than their FP8 casts.
  std::pair<bool, bool> gradient_expert_rows_{false, false};
  std::vector<std::unique_ptr<Buffer>> late_inputs_;  // keep_input_of
  std::unique_ptr<Buffer> full_logits_;               // forward_logits only
  // The FP8 cast of the output gradient that each FP8 layer's backward reads, one for all layers in turn.
  std::unique_ptr<Fp8Tensor> gradient_codes_;
  // The FP8 casts of a mixture-of-experts block's output gradients, one per expert: the grouped ops cast
  // every expert's rows before the experts' GEMMs read them.
  std::vector<std::unique_ptr<Fp8Tensor>> expert_gradient_codes_;
  std::unique_ptr<Buffer> tokens_;
  std::unique_ptr<Buffer> rotary_table_;  // Llama only
  std::unique_ptr<Activations> acts_;
  Dtype qkv_type_ =
      Dtype::f32;  // how acts_ stores attention's input (Backend::storage_type, StorageRole::attention_input)
  // How acts_ stores attention's output, and the gradients store d(atty) and d(qkv)
  // (Backend::storage_type, StorageRole::attention_output).
  Dtype atty_type_ = Dtype::f32;
  // Whether the MLP's hidden activation (mlp.c_fc's output, GELU's input) and the gradient that reaches it
  // (mlp.c_proj's input gradient) are rounded to bf16, as PyTorch autocast keeps them: in bf16 and fp8
  // modes. hidden_type_ is how they are stored: Backend::storage_type(rounded_activation) where rounded, f32
  // otherwise.
  bool hidden_in_bf16_ = false;
  Dtype hidden_type_ = Dtype::f32;
  std::unique_ptr<Gradients> dacts_;
  std::vector<std::unique_ptr<Linear>> linears_;
  std::unordered_map<std::string, Linear*> linear_by_name_;
  GemmCounters counters_;
  bool collect_telemetry_ = true;
  GradientReady gradient_ready_;  // set_gradient_ready
  // forward_parameter_bounds(): 0, each block's first parameter, the final norm's, parameter_count_.
  std::vector<int64_t> forward_bounds_;
  ParametersNeeded parameters_needed_;  // set_parameters_needed
  // Calls parameters_needed_ (where set) before the forward reads parameters below `end`.
  void need_parameters(int64_t end) {
    if (parameters_needed_) parameters_needed_(end);
  }
  ParametersNeeded backward_parameters_needed_;  // set_backward_parameters_needed
  // Calls backward_parameters_needed_ (where set) before the backward reads the run beginning at `begin`.
  void need_parameters_backward(int64_t begin) {
    if (backward_parameters_needed_) backward_parameters_needed_(begin);
  }
  int64_t weight_copies_made_ = 0;  // refresh_weight_copies' count
  // Reports to gradient_ready_ the gradients of the parameters `part` names, whose backward is enqueued, in
  // runs of each buffer; a weight gradient no backward wrote this step is zeroed first, as grads() would.
  void report_gradients(const std::function<bool(std::string_view name)>& part);
  int64_t last_B_ = 0;
  int64_t last_T_ = 0;
  Pending pending_ = Pending::nothing;
  float head_dloss_ = 0.0f;  // of the head's backward that the last forward ran
  bool logits_valid_ = false;
};

}  // namespace octet
