// The decoder's internal types, shared by its source files: the activation and gradient plans (pointers into
// one buffer each), the linear layers with their execution state, and the names of a block's layers and
// parameters in each architecture. decoder.cpp is the block (forward and backward), decoder_parameters.cpp
// the parameter plan (names, shapes, initialisation, gradients and weight copies), decoder_activations.cpp
// the activation plan (what is kept for the backward, what is recomputed).
//
// The block's tensors keep GPT-2's names whatever the architecture: ln1 and ln2 are the two normalizations'
// outputs (Llama's input_layernorm and post_attention_layernorm), qkv the attention projection's output
// (after the rotary embedding, in Llama), atty attention's output, fch the MLP's up projection's output
// ([N, k H], k = activation_inputs: GPT-2's c_fc, Llama's gate and up) and fch_gelu the activation's output
// ([N, H]: GELU's, SwiGLU's), H the MLP's hidden width.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "octet/model/decoder.h"

namespace octet {

// Pointers into the activation buffer, sized for the largest micro-batch N = max_batch * max_seq_len: what
// the backward reads, and the few things the forward passes from one op to the next. The input of a linear
// layer (ln1, ln2, fch_gelu, lnf) is stored as that layer's input_type, and is null while its FP8 cast is
// all the layer reads (input_cast_suffices); keep_input_of allocates it, in float32, when the layer moves
// to BF16.
struct Decoder::Activations {
  struct Layer {
    void* ln1 = nullptr;        // [N, C]
    float* ln1_mean = nullptr;  // [N]; null for RMSNorm
    float* ln1_rstd = nullptr;  // [N]
    void* qkv = nullptr;   // [N, qkv width] in qkv_type_ (Backend::storage_type, StorageRole::attention_input); null
                           // where the backward recomputes it (fp8.recompute_qkv)
    void* atty = nullptr;  // [N, C] in atty_type_ (Backend::storage_type, StorageRole::attention_output)
    float* att_lse = nullptr;    // [N, NH]
    float* residual2 = nullptr;  // null where the backward recomputes it (fp8.recompute_residual)
    void* ln2 = nullptr;
    float* ln2_mean = nullptr;
    float* ln2_rstd = nullptr;
    void* fch = nullptr;       // [N, k H] in hidden_type_; null where the backward recomputes it
                               // (fp8.recompute_mlp)
    void* fch_gelu = nullptr;  // [N, H]
    float* residual3 = nullptr;
  };
  float* encoded = nullptr;
  // Under train.activation_checkpointing = "full" every layer's pointers but residual3 (the next block's
  // input) point into `shared`, one set of block activations that each block's forward writes, in the
  // forward and again just before its backward. Under "selective" every layer's ln1, ln2 and fch_gelu point
  // to `block_input`, [N, max(C, H)] floats, which each of them occupies from its producer to its consumer
  // GEMM, in the forward and again in the backward.
  std::vector<Layer> layers;
  Layer shared;
  void* block_input = nullptr;
  // [N, k H] in hidden_type_: the mlp.c_fc output of a layer that does not keep it (fp8.recompute_mlp), from
  // its GEMM to the GELU that reads it, in the forward and again in the backward. One buffer for every such
  // layer.
  void* fch_scratch = nullptr;
  // The same for the outputs of attn.c_attn (q, k, v) and attn.c_proj (the residual stream after attention)
  // where fp8.recompute_qkv and fp8.recompute_residual leave them out.
  void* qkv_scratch = nullptr;         // [N, 3C] in qkv_type_
  float* residual2_scratch = nullptr;  // [N, C]
  // A mixture-of-experts block's routing and its experts' tensors (decoder_moe.cpp), M =
  // grouped_rows(N, k, E, kExpertRowAlign) rows grouped by expert, of which the first expert_offsets_[l][E]
  // are used: what the backward reads. Under "full" every block's point into one set, which the block's
  // forward writes again before its backward.
  struct Moe {
    float* probs = nullptr;        // [N, E]: the router's softmax
    int32_t* experts = nullptr;    // [N, k]: the chosen experts
    float* weights = nullptr;      // [N, k]: their renormalized probabilities
    int32_t* slots = nullptr;      // [M]: the assignment n k + j each grouped row holds (-1: padding)
    int32_t* positions = nullptr;  // [N k]: the grouped row of each assignment
    int32_t* offsets = nullptr;    // [E + 1]: where each expert's rows start
    void* dispatched = nullptr;    // [M, C] in expert_input_type_: the tokens' normalized rows, grouped (the
                                   // experts' gate/up input)
    void* fch = nullptr;           // [M, 2 F] in hidden_type_: the experts' gate/up output
    void* act = nullptr;           // [M, F] in expert_act_type_: SwiGLU's output (the experts' down input)
    float* out = nullptr;          // [M, C]: the experts' down output
  };
  std::vector<Moe> moe;
  float* router_logits = nullptr;  // [N, E]: from the router's GEMM to the softmax, every block in turn
  float* probability_sums = nullptr;  // [E]: the router's probabilities summed over the tokens
  void* lnf = nullptr;                 // [N, C] in the LM head's input_type
  float* lnf_mean = nullptr;
  float* lnf_rstd = nullptr;
  // [head chunk rows, Vp] floats: a chunk's logits, then their gradient, in lm_head_logits_type (a bf16
  // chunk uses the first half)
  float* logits_chunk = nullptr;
  float* losses = nullptr;  // [N]
};

// Gradient buffers that every layer's backward reuses, each [N, width]. In layer l's backward:
// residual holds d(residual3), which mlp.c_proj reads; ln_2's backward adds into it, making it d(residual2),
// which attn.c_proj reads; ln_1's backward adds into it, making it d(residual3) of layer l-1 (d(encoded)
// after layer 0). The others hold one gradient each between its producer and its consumer:
//   wide_a [N, max(H, qkv width)]: d(fch_gelu) (mlp.c_proj -> GELU, in hidden_type_), then d(qkv) (attention ->
//                   attn.c_attn, in atty_type_)
//   wide_b [N, max(k H, C)]: d(fch) (GELU -> mlp.c_fc), then d(atty) (attn.c_proj -> attention, in atty_type_);
//                   [N, C] while d(fch) is not written, its FP8 cast being all that every mlp.c_fc reads
//                   (gradient_cast_suffices)
//   ln     [N, C]:  d(lnf) (lm_head -> ln_f), d(ln2) (mlp.c_fc -> ln_2), d(ln1) (attn.c_attn -> ln_1)
struct Decoder::Gradients {
  float* residual = nullptr;
  float* ln = nullptr;
  float* wide_a = nullptr;
  float* wide_b = nullptr;
  // A mixture-of-experts block's (decoder_moe.cpp), M grouped rows:
  //   rows_dout [M, C] in expert_dout_type_: d(out) (combine -> the experts' down)
  //   rows_c   [M, C]: d(dispatched) (gate/up -> the gather)
  //   rows_f   [M, F] in hidden_type_: d(act) (down -> SwiGLU)
  //   rows_2f  [M, 2 F] in expert_fch_gradient_type_: d(fch) (SwiGLU -> gate/up)
  //   dweights [N k], dlogits [N, E], dprobs [E]: the routing's gradients
  //   dln      [N, C]: the MoE part of d(ln2) where a shared expert writes its own part into ln
  void* rows_dout = nullptr;
  float* rows_c = nullptr;
  void* rows_f = nullptr;
  void* rows_2f = nullptr;
  float* dweights = nullptr;
  float* dlogits = nullptr;
  float* dprobs = nullptr;
  float* dln = nullptr;
};

// What a linear layer is in the block (or the head): its producer, its consumer and its fusions follow.
enum class LinearRole : uint8_t {
  qkv,      // GPT-2's attn.c_attn, Llama's q, k and v projections: fed by the first normalization
  proj,     // attn.c_proj, o_proj: reads attention's output, joins the residual stream
  fc,       // mlp.c_fc, gate and up: fed by the second normalization
  fc_proj,  // mlp.c_proj, down_proj: fed by the activation, joins the residual stream
  head,     // lm_head: fed by the final normalization
  // A mixture-of-experts block's (a shared expert's layers are fc and fc_proj):
  router,          // mlp.gate: fed by the second normalization, its logits choose the experts
  expert_fc,       // mlp.experts.E.gate_up_proj: fed by the gathered rows of the second normalization
  expert_fc_proj,  // mlp.experts.E.down_proj: fed by SwiGLU, its rows combined into the residual stream
};
// The role of a linear layer by its name, in either architecture.
LinearRole role_of(std::string_view layer);

// The names of block l's linear layers and of its normalizations' parameters (NAME.weight, NAME.bias).
// In a mixture-of-experts block fc and fc_proj are the shared expert's (empty without one), router the
// router's and experts the prefix of the experts' ("layers.3.mlp.experts.": expert_fc(e), expert_fc_proj(e)).
struct Decoder::BlockNames {
  std::string qkv, proj, fc, fc_proj;
  std::string norm1, norm2;
  std::string router, experts;
  std::string expert_fc(int64_t e) const { return experts + std::to_string(e) + ".gate_up_proj"; }
  std::string expert_fc_proj(int64_t e) const { return experts + std::to_string(e) + ".down_proj"; }
};

// The rows of each expert start at a multiple of this (Backend::group_by_expert's align): FP8 GEMMs need
// every dimension a multiple of 16, an expert's rows included; the padding rows are zero throughout.
inline constexpr int64_t kExpertRowAlign = 16;

struct Decoder::Linear {
  const LinearPlan* plan;
  LinearRole role = LinearRole::head;
  int64_t weight_offset;
  int64_t bias_offset;  // -1: no bias
  Fp8LinearState state;
  // The activation's scaling state as the last forward's cast found it (train.activation_checkpointing =
  // "full"): the block's forward run again casts with it, so that its codes are the forward's.
  ScalingState forward_activation;
  Fp8LinearTelemetry telemetry;
  LinearExecution exec;
  std::unique_ptr<WeightCopy> copy;
  // The FP8 cast of the layer's input (FP8 forward): made by its producer (norm_into, activation_into) or its
  // forward, read by its forward GEMM and kept for its backward.
  std::unique_ptr<Fp8Tensor> input_codes;
  // How the model stores the input that LayerNorm or GELU writes for this layer (attn.c_attn, mlp.c_fc,
  // mlp.c_proj, lm_head; Activations): Backend::storage_type where the plan runs both GEMMs that read it,
  // the forward and the weight gradient, in BF16, which round it to bf16 anyway, so that storing it rounded
  // changes no result; f32 otherwise (attn.c_proj's input is attention's output, stored as atty_type_). It
  // stays so when the layer moves to BF16.
  Dtype input_type = Dtype::f32;
  int64_t weight_count = 0;
  // Whether a backward has written the weight gradient since zero_grad (the buffer starts zeroed).
  bool weight_gradient_written = true;
  // The weight's gradient (in grads_ or grads_bf16_, as its parameter's grad_type says), and whether the
  // model rounds it to bf16 in place after each backward (bf16 weight gradients that the backend stores in
  // float32).
  void* weight_grad = nullptr;
  Dtype weight_grad_type = Dtype::f32;
  bool round_weight_gradient = false;
  float* bias_grad = nullptr;  // null: no bias
};

namespace decoder_detail {

inline bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace decoder_detail
}  // namespace octet
