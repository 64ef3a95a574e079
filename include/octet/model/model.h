// A language model as the engine sees it: named parameters in one contiguous buffer and their gradients, the
// weight copies the GEMMs read, forward and backward over token batches, the linear layers the precision
// policy decides on with their FP8 state and telemetry, and the map between its parameters and a Hugging Face
// checkpoint's tensors. The trainer, optimizer, checkpoints, telemetry, benchmarks and sampling work on this
// interface only; the decoder (decoder.h) implements it for GPT-2 and Llama, as model.arch says.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "octet/backend/backend.h"
#include "octet/model/config.h"
#include "octet/model/precision_policy.h"

namespace octet {

struct ParameterInfo {
  std::string name;            // "wte", "wpe", "h.0.ln_1.weight", "h.0.attn.c_attn.weight", ..., "ln_f.bias"
  std::vector<int64_t> shape;  // linear weights are [out_features, in_features]
  int64_t offset = 0;          // into the parameter buffer (and AdamW's moments), in floats
  int64_t count = 0;
  // Where its gradient is: grad_offset elements into the float32 gradients (Model::grads()), or, with
  // grad_type bf16 (a linear layer's weight under train.weight_gradients = "bf16" where the backend stores it
  // so, Backend::storage_type, StorageRole::weight_gradient), into the bf16 ones (Model::grads_bf16()). With
  // every gradient in float32, grad_offset is offset.
  int64_t grad_offset = 0;
  Dtype grad_type = Dtype::f32;
  // The precision of the gradient's values: bf16 for a weight gradient kept in BF16 (train.weight_gradients
  // = "bf16"), whether stored as bf16 (grad_type) or as float32 rounded to BF16 after every accumulation
  // (where the backend stores weight gradients in float32). Several ranks sum such gradients in BF16.
  Dtype grad_precision = Dtype::f32;
  bool weight_decay = false;  // matrices (every 2-D parameter, embeddings included) decay; vectors do not
};

// Counters of what the GEMMs did since the last reset.
struct GemmCounters {
  int64_t fp8_gemms = 0;
  int64_t other_gemms = 0;
  int64_t saturated = 0;
  int64_t underflowed = 0;
};

// A fusion the model relies on for one linear layer (Backend::supports), and how it runs: the layer, the op
// whose pass would do the work (the producer of the layer's input or output gradient; the layer itself for
// its GEMM's epilogue), the backend's answer on ordinary steps, and its answer on the steps that measure the
// casts' SQNR (telemetry) where that differs.
struct FusionRecord {
  std::string layer;
  Fusion fusion = Fusion::input_cast;
  std::string producer;
  FusionSupport support;
  std::optional<FusionSupport> on_sqnr_steps;
};

class Model {
 public:
  virtual ~Model() = default;

  // The architecture's name as model.arch spells it ("gpt2", "llama").
  virtual std::string_view architecture() const = 0;
  // One line for the startup log: the architecture and its shape.
  virtual std::string describe() const = 0;
  virtual const PrecisionPolicy& policy() const = 0;
  virtual Backend& backend() = 0;

  // Sizes that generation and evaluation need: V (tokens the loss covers), Vp (rows of the logits, V padded
  // for GEMM efficiency) and the longest sequence the model has positions for.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t padded_vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;

  // The architecture's initialisation, deterministic from the seed.
  virtual void init_weights(uint64_t seed) = 0;

  virtual const std::vector<ParameterInfo>& parameters() const = 0;
  // The parameter named `name`; throws when there is none.
  virtual const ParameterInfo& parameter(std::string_view name) const = 0;
  virtual int64_t parameter_count() const = 0;
  // The parameters a token's forward multiplies by (the 6 N of the FLOP count per trained token): every
  // parameter but a learned position embedding.
  virtual int64_t flop_parameter_count() const = 0;
  virtual float* params() = 0;
  // The memory of params(), whose pages can be given back where a rank leaves float32 masters stale
  // (Buffer::release; src/train/parameter_gather.h).
  virtual Buffer& parameter_memory() = 0;
  // The float32 gradients, each at its parameter's grad_offset. A linear layer's weight gradient that no
  // backward has written since zero_grad is zeroed here first (zero_grad leaves those to their layer's first
  // backward), in both gradient buffers.
  virtual float* grads() = 0;
  // The bf16 gradients (parameters whose grad_type is bf16; null when there are none), zeroed as grads().
  virtual void* grads_bf16() = 0;
  // A parameter's gradient, in the buffer of its grad_type (after grads()' zeroing).
  virtual const void* gradient(const ParameterInfo& p) = 0;
  // The sum of the squares of every gradient, in float64, bf16 ones as their float32 values: in a fixed
  // order, and finite exactly when every gradient is.
  virtual double gradient_sum_of_squares() = 0;
  // Whether every element of a parameter's gradient is finite.
  virtual bool gradient_finite(const ParameterInfo& p) = 0;

  // Remakes the GEMMs' weight copies (BF16/FP16 rounding, FP8 casts); call after every change of params().
  virtual void refresh_weight_copies() = 0;
  // The weights whose copies the GEMMs read, with what remakes them: an optimizer that updates one of these
  // parameters can remake its copy in the same pass (Backend::optimizer_update) instead of calling
  // refresh_weight_copies afterwards.
  struct WeightCopySlot {
    int64_t offset;  // of the weight in params()
    int64_t rows;    // [out_features, in_features]
    int64_t cols;
    std::unique_ptr<WeightCopy>* copy;
    LinearExecution* exec;
    int64_t bias_offset = -1;  // of the layer's bias in params(); -1: none
    std::string_view layer;    // the layer's name in policy().layers()
    // Whether another op reads the weight's float32 values too (a head tied to the token embedding, which
    // the embedding's lookup reads): its copy alone does not stand for it.
    bool shared = false;
  };
  virtual std::vector<WeightCopySlot> weight_copy_slots() = 0;

  // Forward over tokens and targets [B, T] (host memory); returns the mean loss over the B*T positions. With
  // dloss != 0 the LM head's backward runs here too: the gradient of dloss * sum(losses) is added to the
  // head's weight gradient (zero the gradients before this forward, not after it) and backward(dloss) goes
  // on from there. With dloss = 0 (evaluation) only the loss is computed.
  virtual float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        float dloss = 0.0f) = 0;
  // Logits-only forward (no targets); logits() then holds [B*T, Vp].
  virtual void forward_logits(const int32_t* tokens, int64_t B, int64_t T) = 0;
  // Backward of the last forward with targets, accumulating into grads(): the gradient of
  // dloss_scale * sum(losses), plus dloss_scale * B * T times the auxiliary loss where the model has one.
  // Use dloss_scale = loss_scale / (B * T * accumulation_steps) for the mean over an accumulated step; after
  // forward(..., dloss) it takes the same dloss.
  virtual void backward(float dloss_scale) = 0;
  // While set, backward() calls ready(storage, begin, end) for each run [begin, end) of gradient elements
  // that the rest of the backward will not write, once the work that writes it is enqueued on the backend:
  // offsets into grads() for storage f32, into grads_bf16() for bf16. A data-parallel trainer starts summing
  // those over the ranks while the backward goes on. Runs never reported are the caller's to take after
  // backward() returns. Null: none (the default).
  using GradientReady = std::function<void(Dtype storage, int64_t begin, int64_t end)>;
  virtual void set_gradient_ready(GradientReady ready) { (void)ready; }
  // The parameters in the order the forward reads them: bounds of runs [bounds[i], bounds[i + 1]) of params(),
  // ascending from 0 to parameter_count() (the embeddings, then each block, then the final norm and the
  // head). The forward reads the parameters of a run, and the weight copies of its layers, only after every
  // run before it has been read.
  virtual std::vector<int64_t> forward_parameter_bounds() const = 0;
  // While set, every forward calls needed(end) before it reads a parameter below offset `end` of params() or
  // a weight copy of one, `end` being one of forward_parameter_bounds(), and calls it with
  // parameter_count() before it reads the last run: a trainer whose parameters are still on their way from
  // other ranks (a sharded optimizer's gathers) waits there for those below `end`. Null: none (the default).
  using ParametersNeeded = std::function<void(int64_t end)>;
  virtual void set_parameters_needed(ParametersNeeded needed) = 0;
  // While set, every backward calls needed(begin) before it reads a parameter of the run of the forward that
  // begins at `begin` (one of forward_parameter_bounds()) or a weight copy of one, the runs in the reverse of
  // the forward's order (the head's and the final norm's run, each block's from the last, the embeddings'),
  // a block's forward run again under activation checkpointing included: a trainer that gives back the
  // weight copies of the runs the forward is done with (fully sharded weights) makes them again there, and
  // gives back those of the runs after `begin`. Null: none (the default).
  virtual void set_backward_parameters_needed(ParametersNeeded needed) = 0;
  // How many times refresh_weight_copies has remade every copy from the parameters: what holds a copy's
  // codes elsewhere (a fully sharded trainer's own codes) takes them again when this moves.
  virtual int64_t weight_copies_made() const = 0;
  // A float32 gradient whose rows are indexed by input tokens: [rows, cols] at `offset` in grads(), and after
  // zero_grad and the backwards since, every row but those of the token ids the forwards read holds +0 (an
  // untied token embedding). A data-parallel trainer sums only the rows some rank's tokens touched; the
  // others' sum is +0 on every rank. nullopt where there is none (a table that the LM head also reads has a
  // gradient in every row).
  struct TokenRowGradient {
    int64_t offset = 0;
    int64_t rows = 0;
    int64_t cols = 0;
  };
  virtual std::optional<TokenRowGradient> token_row_gradient() const { return std::nullopt; }
  // A mixture-of-experts model's router balance over the last forward: each layer's E x sum_e f_e P_e (f_e
  // expert e's share of the assignments, P_e its mean router probability), averaged over the layers; 1 when
  // balanced, up to E when every token goes to one expert. The auxiliary loss that training adds to the
  // mean loss is router_aux_loss_coef x the sum over layers. nullopt for a model without experts.
  virtual std::optional<double> router_balance() const { return std::nullopt; }
  // Zeroes the gradients (the linear layers' weight gradients by their next backward, which writes them).
  virtual void zero_grad() = 0;
  // Backend memory: [B*T, Vp] logits of the last forward_logits, and the [B*T] losses of the last forward
  // with targets.
  virtual const float* logits() const = 0;
  virtual const float* losses() const = 0;

  virtual GemmCounters& counters() = 0;
  // Whether forwards update the FP8 scaling state (amax histories); off while evaluating.
  virtual void set_scaling_updates(bool on) = 0;
  // FP8 scaling state of a linear layer named in policy().layers() (null when the layer is not in FP8).
  virtual Fp8LinearState* fp8_state(std::string_view layer) = 0;
  // The FP8 scaling states of the layers `layers` names (null for one not in FP8), brought up to date from
  // the backend together: one wait for a GPU, where fp8_state waits once per layer.
  virtual std::vector<Fp8LinearState*> fp8_states(std::span<const std::string> layers) = 0;
  // FP8 cast telemetry of a linear layer: running totals of its training casts since construction or the
  // last reset_telemetry (null when the layer is not in FP8), brought up to date from the backend (a copy
  // from the device on a GPU: call it on telemetry steps only). reset_telemetry zeroes the host copies.
  virtual Fp8LinearTelemetry* telemetry(std::string_view layer) = 0;
  virtual void reset_telemetry() = 0;
  // Whether training casts add to the telemetry (on by default), and whether they also add the signal and
  // noise energies behind the SQNR (off by default: a dequantizing pass per cast).
  virtual void set_telemetry(bool collect, bool measure_sqnr) = 0;
  // Runs all three GEMMs of `layer` in BF16 from the next forward on, remakes its weight copy to match, and
  // records `reason` in the precision policy (and so in its map).
  virtual void move_layer_to_bf16(std::string_view layer, std::string reason) = 0;
  // Lines about the memory that the fp8.recompute_* settings save in this model, joined by '\n'; empty when
  // there is nothing to say.
  virtual std::string memory_line() = 0;
  // Every fusion the model's ops rely on, with the backend's answers as the layers run now.
  virtual std::vector<FusionRecord> fusions() const = 0;

  // The Hugging Face map, which checkpoints write model.safetensors with (loadable by transformers):
  // each parameter's name there, its shape there, and its conversion from and to octet's layout.
  virtual std::string hf_name(const ParameterInfo& p) const = 0;
  virtual std::vector<int64_t> hf_shape(const ParameterInfo& p) const = 0;
  // Parameter `p` of `params` (a host copy of params(), parameter_count() floats) in the Hugging Face
  // layout: hf_shape(p) elements.
  virtual std::vector<float> to_hf(const ParameterInfo& p, std::span<const float> params) const = 0;
  // The reverse: `hf` (hf_shape(p) elements) written into p's place in `params`; elements that the Hugging
  // Face tensor does not hold (padding) are set to zero.
  virtual void from_hf(const ParameterInfo& p, std::span<const float> hf, std::span<float> params) const = 0;
  // The model's description as a JSON object (the Hugging Face config's names and sizes): stored in a
  // checkpoint's state.json and model.safetensors metadata, and compared key by key on load.
  virtual std::string model_json() const = 0;
};

// The model of architecture shape.arch with the shape `shape`, its precision policy and the largest
// micro-batch its activation plan holds (B <= max_batch, T <= max_seq_len).
std::unique_ptr<Model> make_model(const ModelConfig& shape, Backend& backend, PrecisionPolicy policy,
                                  int64_t max_batch, int64_t max_seq_len);

// A fusion record in words: "h.0.ln_1, fused", "h.0.ln_1, not fused: FALLBACK", "h.0.ln_1, fused; on steps
// that measure SQNR not fused: FALLBACK".
std::string fusion_summary(const FusionRecord& record);
// The precision policy's map (PrecisionPolicy::map_json) with each layer's fusions as members named after
// them ("input_cast": fusion_summary): what precision_map.json holds.
std::string precision_map_json(const Model& model);

// Rows of logits the LM head of `architecture` computes at a time in training when it does not run in FP8,
// for benchmarks that size the head's GEMMs without building a model.
int64_t lm_head_chunk_rows(ModelArchitecture architecture);

}  // namespace octet
