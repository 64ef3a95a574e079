// The decoder's block, forward and backward, by hand, against the backend interface (see decoder.h), for
// GPT-2 and Llama alike. The structure follows llm.c's train_gpt2.c: a forward that runs the blocks in turn
// and the LM head and loss in row chunks, and a backward that walks the layers in reverse, accumulating the
// residual stream's gradient in one running buffer. The parameter plan is decoder_parameters.cpp's, the
// activation plan decoder_activations.cpp's.
#include "octet/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "decoder_internal.h"
#include "lm_head.h"
#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet {

Decoder::Decoder(const ModelConfig& config, Backend& backend, PrecisionPolicy policy, int64_t max_batch,
           int64_t max_seq_len)
    : config_(config),
      backend_(backend),
      policy_(std::move(policy)),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len) {
  config_.validate();
  OCTET_REQUIRE(max_batch >= 1, "the batch size must be at least 1, got {}", max_batch);
  OCTET_REQUIRE(max_seq_len >= 1 && max_seq_len <= config_.max_seq_len,
                "the sequence length must be between 1 and model.max_seq_len ({}), got {}",
                config_.max_seq_len, max_seq_len);
  build_parameters();
  if (config_.arch == ModelArchitecture::llama) build_rotary_table();
  plan_activations();
  const int64_t N = max_batch_ * max_seq_len_;
  tokens_ = backend_.allocate(static_cast<size_t>(2 * N) * sizeof(int32_t));
}

Decoder::~Decoder() = default;

Decoder::Linear& Decoder::linear(std::string_view name) {
  const auto found = linear_by_name_.find(std::string(name));
  OCTET_CHECK(found != linear_by_name_.end(), "a linear layer named {}", name);
  return *found->second;
}

Decoder::BlockNames Decoder::block_names(int64_t l) const {
  if (config_.arch == ModelArchitecture::gpt2) {
    const std::string h = fmt::format("h.{}.", l);
    return {h + "attn.c_attn", h + "attn.c_proj", h + "mlp.c_fc", h + "mlp.c_proj", h + "ln_1", h + "ln_2", {}, {}};
  }
  const std::string h = fmt::format("layers.{}.", l);
  if (!config_.moe()) {
    return {h + "self_attn.qkv_proj", h + "self_attn.o_proj",        h + "mlp.gate_up_proj",
            h + "mlp.down_proj",      h + "input_layernorm", h + "post_attention_layernorm", {}, {}};
  }
  const std::string shared = config_.shared_expert ? h + "mlp.shared_expert." : std::string();
  return {h + "self_attn.qkv_proj",
          h + "self_attn.o_proj",
          shared.empty() ? shared : shared + "gate_up_proj",
          shared.empty() ? shared : shared + "down_proj",
          h + "input_layernorm",
          h + "post_attention_layernorm",
          h + "mlp.gate",
          h + "mlp.experts."};
}

std::string Decoder::embedding_name() const {
  return config_.arch == ModelArchitecture::gpt2 ? "wte" : "embed_tokens.weight";
}

std::string Decoder::final_norm_name() const {
  return config_.arch == ModelArchitecture::gpt2 ? "ln_f" : "norm";
}

Normalization Decoder::norm_kind() const {
  return config_.arch == ModelArchitecture::gpt2 ? Normalization::layernorm : Normalization::rmsnorm;
}

Activation Decoder::activation_kind() const {
  return config_.arch == ModelArchitecture::gpt2 ? Activation::gelu : Activation::swiglu;
}

const float* Decoder::norm_bias(const std::string& norm) {
  return norm_kind() == Normalization::layernorm ? params() + parameter(norm + ".bias").offset : nullptr;
}

float* Decoder::norm_bias_grad(const std::string& norm) {
  if (norm_kind() != Normalization::layernorm) return nullptr;
  const ParameterInfo& info = parameter(norm + ".bias");
  return grads_->floats() + info.grad_offset;
}

const float* Decoder::bias_of(const Linear& layer) {
  return layer.bias_offset >= 0 ? params() + layer.bias_offset : nullptr;
}

void Decoder::build_rotary_table() {
  // As Hugging Face's LlamaRotaryEmbedding computes it in float32: inverse frequencies theta^(-2i/hs), Llama
  // 3.1's scaling of the low ones where model.rope_scaling_factor is set, then cos and sin of t * frequency.
  const int64_t hs = config_.head_size(), half = hs / 2, T = config_.max_seq_len;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(config_.rope_theta),
                        static_cast<float>(2 * i) / static_cast<float>(hs));
  }
  const RopeScaling& r = config_.rope_scaling;
  if (r.factor > 0.0) {
    const double low_wavelength = static_cast<double>(r.original_max_seq_len) / r.low_freq_factor;
    const double high_wavelength = static_cast<double>(r.original_max_seq_len) / r.high_freq_factor;
    for (float& f : inv_freq) {
      const double wavelength = 2.0 * 3.141592653589793 / f;
      if (wavelength > low_wavelength) {
        f = static_cast<float>(f / r.factor);
      } else if (wavelength >= high_wavelength) {
        const double smooth = (static_cast<double>(r.original_max_seq_len) / wavelength - r.low_freq_factor) /
                              (r.high_freq_factor - r.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / r.factor + smooth * f);
      }
    }
  }
  std::vector<float> table(static_cast<size_t>(T * hs));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t) * inv_freq[static_cast<size_t>(i)];
      table[static_cast<size_t>(t * hs + i)] = std::cos(angle);
      table[static_cast<size_t>(t * hs + half + i)] = std::sin(angle);
    }
  }
  rotary_table_ = backend_.allocate(table.size() * sizeof(float));
  backend_.copy_from_host(rotary_table_->data(), table.data(), table.size() * sizeof(float));
}

ConstTensorView Decoder::rotary_table(int64_t T) const {
  return {rotary_table_->floats(), {T, config_.head_size()}};
}

Fp8LinearState* Decoder::fp8_state(std::string_view layer) {
  Linear& l = linear(layer);
  if (!l.plan->fp8()) return nullptr;
  backend_.fetch_scaling(l.state);  // the device's state, where the backend keeps it there
  return &l.state;
}

std::vector<Fp8LinearState*> Decoder::fp8_states(std::span<const std::string> layers) {
  std::vector<Fp8LinearState*> states;
  states.reserve(layers.size());
  for (const std::string& name : layers) {
    Linear& l = linear(name);
    states.push_back(l.plan->fp8() ? &l.state : nullptr);
  }
  std::vector<Fp8LinearState*> present;
  for (Fp8LinearState* s : states) {
    if (s != nullptr) present.push_back(s);
  }
  backend_.fetch_scaling(present);
  return states;
}

Fp8LinearTelemetry* Decoder::telemetry(std::string_view layer) {
  Linear& l = linear(layer);
  if (!l.plan->fp8()) return nullptr;
  backend_.fetch_telemetry(l.telemetry);  // the device's totals, where the backend keeps them there
  return &l.telemetry;
}

void Decoder::reset_telemetry() {
  for (auto& l : linears_) l->telemetry = {};
}

void Decoder::set_telemetry(bool collect, bool measure_sqnr) {
  collect_telemetry_ = collect;
  for (auto& l : linears_) {
    l->exec.telemetry = collect && l->plan->fp8() ? &l->telemetry : nullptr;
    l->exec.measure_sqnr = collect && measure_sqnr;
  }
}

void Decoder::move_layer_to_bf16(std::string_view layer, std::string reason) {
  OCTET_REQUIRE(pending_ != Pending::head_backward_done,
                "a layer moves to BF16 between steps, not between a forward and its backward");
  Linear& l = linear(layer);
  policy_.move_layer_to_bf16(layer, std::move(reason));
  l.exec.forward = l.exec.input_gradient = l.exec.weight_gradient = GemmMode::bf16;
  if (l.exec.keep_input_codes) keep_output_of(layer);  // the backward reads it: no FP8 forward to rerun
  l.exec.keep_input_codes = false;
  l.exec.transpose_weight_per_use = false;
  l.exec.telemetry = nullptr;
  l.input_codes.reset();
  l.copy.reset();  // an FP8 copy holds no rounded weight: make a fresh one
  backend_.prepare_weight(l.copy, params() + l.weight_offset, l.plan->out_features, l.plan->in_features,
                          l.exec);
  keep_input_of(layer);  // the BF16 GEMMs read the float32 input
  plan_gradients();      // and their float32 output gradient
}

std::vector<FusionRecord> Decoder::fusions() const {
  std::vector<FusionRecord> out;
  auto add = [&](const Linear& l, Fusion fusion, std::string producer) {
    LinearExecution e = l.exec;
    e.measure_sqnr = false;
    FusionRecord r{l.plan->name, fusion, std::move(producer), backend_.supports(fusion, e), std::nullopt};
    if (l.plan->fp8()) {
      Fp8LinearTelemetry counted;
      e.telemetry = &counted;
      e.measure_sqnr = true;
      FusionSupport on_sqnr_steps = backend_.supports(fusion, e);
      if (on_sqnr_steps.fused != r.support.fused) r.on_sqnr_steps = std::move(on_sqnr_steps);
    }
    out.push_back(std::move(r));
  };
  // The ops of the block and the head that take a fusion: norm_into and activation_into cast an FP8 layer's
  // input, activation_backward_into casts the MLP's up projection's output gradient, and both layers that
  // join the residual stream add it in their forward GEMM.
  const std::string activation = activation_name(activation_kind()).data();
  for (const auto& l : linears_) {
    const std::string& name = l->plan->name;
    const bool fp8_forward = l->exec.forward == GemmMode::fp8;
    if (l->role == LinearRole::head) {
      if (fp8_forward) add(*l, Fusion::input_cast, final_norm_name());
      continue;
    }
    const int64_t block = std::stoll(name.substr(name.find('.') + 1));
    const BlockNames b = block_names(block);
    const std::string mlp = b.fc.substr(0, b.fc.rfind('.') + 1);  // "h.3.mlp."
    switch (l->role) {
      case LinearRole::qkv:
        if (fp8_forward) add(*l, Fusion::input_cast, b.norm1);
        break;
      case LinearRole::fc:
        // A mixture of experts' shared expert casts its own input (decoder_moe.cpp).
        if (fp8_forward && !config_.moe()) add(*l, Fusion::input_cast, b.norm2);
        if (casts_gradient(l->exec)) add(*l, Fusion::gradient_cast, mlp + activation);
        break;
      case LinearRole::fc_proj:
        if (fp8_forward) add(*l, Fusion::input_cast, mlp + activation);
        add(*l, Fusion::residual_add, name);
        break;
      case LinearRole::proj:
        add(*l, Fusion::residual_add, name);
        break;
      case LinearRole::expert_fc: {
        // An expert's rows are cast for it by the gather (its input) and by its SwiGLU's backward (its
        // output gradient); its down projection's by its SwiGLU and by the gather of the combine's gradient
        // (decoder_moe.cpp).
        const std::string expert = name.substr(0, name.rfind('.') + 1);  // "layers.3.mlp.experts.5."
        if (fp8_forward) add(*l, Fusion::input_cast, b.experts + "gather");
        if (casts_gradient(l->exec)) add(*l, Fusion::gradient_cast, expert + activation);
        break;
      }
      case LinearRole::expert_fc_proj: {
        const std::string expert = name.substr(0, name.rfind('.') + 1);
        if (fp8_forward) add(*l, Fusion::input_cast, expert + activation);
        if (casts_gradient(l->exec)) add(*l, Fusion::gradient_cast, b.experts + "gather");
        break;
      }
      case LinearRole::head:
      case LinearRole::router:
        break;  // a router's input is kept in float32: no producer casts
    }
  }
  return out;
}

void Decoder::norm_into(Linear& next, void* out, float* mean, float* rstd, const float* inp,
                          const float* weight, const float* bias, int64_t N, int64_t C) {
  OCTET_CHECK(out != nullptr || input_cast_suffices(next.exec), "an input kept for {}", next.plan->name);
  const ConstTensorView x(inp, {N, C});
  if (next.exec.forward != GemmMode::fp8) {
    backend_.normalization_forward(norm_kind(), TensorView(out, next.input_type, {N, C}), mean, rstd, x, weight,
                                   bias, {});
    return;
  }
  OCTET_CHECK(next.input_type == Dtype::f32, "the float32 input of FP8 layer {}", next.plan->name);
  const TensorView kept(input_cast_suffices(next.exec) ? nullptr : out, Dtype::f32, {N, C});
  backend_.normalization_forward(norm_kind(), kept, mean, rstd, x, weight, bias,
                                 {&next.exec, &next.input_codes});
}

void Decoder::activation_into(Linear& next, void* out, const void* inp, int64_t N, int64_t H) {
  OCTET_CHECK(out != nullptr || input_cast_suffices(next.exec), "an input kept for {}", next.plan->name);
  const ConstTensorView x(inp, hidden_type_, {N, activation_inputs(activation_kind()) * H});
  if (next.exec.forward != GemmMode::fp8) {
    backend_.activation_forward(activation_kind(), TensorView(out, next.input_type, {N, H}), x, {});
    return;
  }
  OCTET_CHECK(next.input_type == Dtype::f32, "the float32 input of FP8 layer {}", next.plan->name);
  const TensorView kept(input_cast_suffices(next.exec) ? nullptr : out, Dtype::f32, {N, H});
  backend_.activation_forward(activation_kind(), kept, x, {&next.exec, &next.input_codes});
}

void Decoder::round_hidden(void* x, int64_t n) {
  if (hidden_in_bf16_ && hidden_type_ == Dtype::f32) {
    backend_.round_in_place(static_cast<float*>(x), n, Dtype::bf16);
  }
}

namespace {

// Whether a linear layer's input-gradient GEMM rounds its result to bf16 for LayerNorm's backward.
bool rounds_input_gradient(const LinearExecution& exec) {
  return exec.input_gradient == GemmMode::bf16 || exec.input_gradient == GemmMode::fp8;
}

}  // namespace

Dtype Decoder::norm_gradient_type(const Linear& consumer) const {
  return rounds_input_gradient(consumer.exec) ? backend_.storage_type({StorageRole::rounded_activation})
                                              : Dtype::f32;
}

void Decoder::round_norm_gradient(const Linear& consumer, Dtype type, float* dinp, int64_t n) {
  if (rounds_input_gradient(consumer.exec) && type == Dtype::f32) {
    backend_.round_in_place(dinp, n, Dtype::bf16);
  }
}

void Decoder::activation_backward_into(Linear& next, float* dinp, const void* inp, const void* dout, int64_t N,
                                       int64_t H, float* next_dinp, Dtype next_dinp_type, const void* next_inp) {
  const int64_t width = activation_inputs(activation_kind()) * H;
  OCTET_CHECK(width == next.plan->out_features, "the activation's input width {} is {}'s output width {}", width,
              next.plan->name, next.plan->out_features);
  float* dbias = next.bias_grad;
  const ConstTensorView x(inp, hidden_type_, {N, width});
  const ConstTensorView dy(dout, hidden_type_, {N, H});
  if (!casts_gradient(next.exec)) {
    // Both GEMMs that read next's output gradient in BF16 (the input and the weight gradient): the
    // activation's backward rounds it to bf16 once, as PyTorch autocast keeps it, and next's bias gradient is
    // summed from the rounded values.
    const bool rounded =
        next.exec.input_gradient == GemmMode::bf16 && next.exec.weight_gradient == GemmMode::bf16;
    const Dtype type = rounded ? backend_.storage_type({StorageRole::rounded_activation}) : Dtype::f32;
    backend_.activation_backward(activation_kind(), TensorView(dinp, type, {N, width}), x, dy, nullptr, {});
    if (rounded && type == Dtype::f32) backend_.round_in_place(dinp, N * width, Dtype::bf16);
    backward_linear(next, next_dinp, next_dinp_type, dbias, dinp, type, next_inp, next.input_type, N);
    return;
  }
  // The bias gradient is summed by the activation's backward; the float32 gradient is written only where
  // next reads it.
  float* kept = gradient_cast_suffices(next.exec) ? nullptr : dinp;
  backend_.activation_backward(activation_kind(), TensorView(kept, {N, width}), x, dy, dbias,
                               {&next.exec, &gradient_codes_});
  backward_linear(next, next_dinp, next_dinp_type, nullptr, kept, Dtype::f32, next_inp, next.input_type, N,
                  true);
}

void Decoder::forward_block(int64_t l, int64_t B, int64_t T) {
  const int64_t N = B * T, C = config_.channels, NH = config_.heads;
  const int64_t H = config_.hidden(), FC = activation_inputs(activation_kind()) * H, W = config_.qkv_width();
  float* p = params();
  auto P = [&](const std::string& name) { return p + parameter(name).offset; };
  const bool gpt2 = config_.arch == ModelArchitecture::gpt2;
  Activations& a = *acts_;
  const float* residual = l == 0 ? a.encoded : a.layers[static_cast<size_t>(l - 1)].residual3;
  const BlockNames b = block_names(l);
  Activations::Layer& x = a.layers[static_cast<size_t>(l)];
  Linear& qkv = linear(b.qkv);
  Linear& proj = linear(b.proj);
  norm_into(qkv, x.ln1, x.ln1_mean, x.ln1_rstd, residual, P(b.norm1 + ".weight"), norm_bias(b.norm1), N, C);
  const TensorView qkv_out(x.qkv != nullptr ? x.qkv : a.qkv_scratch, qkv_type_, {B, T, W});
  backend_.linear_forward(qkv_out, ConstTensorView(x.ln1, qkv.input_type, {N, C}), weight_of(qkv),
                          qkv.copy.get(), {.bias = bias_of(qkv)}, qkv.exec, fp8_input(qkv, true));
  if (!gpt2) backend_.rotary_embedding(qkv_out, rotary_table(T), NH + config_.kv(), false);
  const TensorView atty(x.atty, atty_type_, {B, T, C});
  backend_.attention_forward(atty, x.att_lse, qkv_out, attention_heads());
  float* residual2 = x.residual2 != nullptr ? x.residual2 : a.residual2_scratch;
  backend_.linear_forward(TensorView(residual2, {N, C}), atty, weight_of(proj), proj.copy.get(),
                          {.bias = bias_of(proj), .residual = residual}, proj.exec, fp8_input(proj, false));
  if (config_.moe()) {
    moe_forward(l, B, T, residual2);
    return;
  }
  Linear& fc = linear(b.fc);
  Linear& fc_proj = linear(b.fc_proj);
  norm_into(fc, x.ln2, x.ln2_mean, x.ln2_rstd, residual2, P(b.norm2 + ".weight"), norm_bias(b.norm2), N, C);
  void* fch = x.fch != nullptr ? x.fch : a.fch_scratch;
  backend_.linear_forward(TensorView(fch, hidden_type_, {N, FC}),
                          ConstTensorView(x.ln2, fc.input_type, {N, C}), weight_of(fc), fc.copy.get(),
                          {.bias = bias_of(fc)}, fc.exec, fp8_input(fc, true));
  round_hidden(fch, N * FC);
  activation_into(fc_proj, x.fch_gelu, fch, N, H);
  backend_.linear_forward(TensorView(x.residual3, {N, C}),
                          ConstTensorView(x.fch_gelu, fc_proj.input_type, {N, H}), weight_of(fc_proj),
                          fc_proj.copy.get(), {.bias = bias_of(fc_proj), .residual = residual2}, fc_proj.exec,
                          fp8_input(fc_proj, true));
}

void Decoder::rerun_block(int64_t l, int64_t B, int64_t T) {
  const std::vector<Linear*>& layers = block_linears_[static_cast<size_t>(l)];
  std::vector<LinearExecution> saved(layers.size());
  std::vector<Linear*> fp8;
  for (size_t i = 0; i < layers.size(); ++i) {
    Linear& layer = *layers[i];
    saved[i] = layer.exec;
    LinearExecution& e = layer.exec;
    e.update_scaling = false;
    e.fp8_gemms = e.other_gemms = e.saturated = e.underflowed = nullptr;
    e.telemetry = nullptr;
    e.measure_sqnr = false;
    if (layer.plan->fp8()) fp8.push_back(&layer);
  }
  // The forward's scales in, the current state out, for the length of the block's forward: the block's
  // states fetched and published together (a GPU backend waits once for each, not once a layer).
  std::vector<Fp8LinearState*> states;
  for (Linear* layer : fp8) states.push_back(&layer->state);
  const auto swap_scales = [&] {
    for (Linear* layer : fp8) std::swap(layer->state.activation, layer->forward_activation);
    backend_.publish_scaling(std::span<const Fp8LinearState* const>(states.data(), states.size()));
  };
  if (!states.empty()) {
    backend_.fetch_scaling(std::span<Fp8LinearState* const>(states));
    swap_scales();
  }
  forward_block(l, B, T);
  for (size_t i = 0; i < layers.size(); ++i) layers[i]->exec = saved[i];
  if (!states.empty()) swap_scales();
}

void Decoder::renormalize(const Linear& next, void* out, float* mean, float* rstd, const float* inp,
                          const std::string& norm, int64_t N) {
  const int64_t C = config_.channels;
  backend_.normalization_forward(norm_kind(), TensorView(out, next.input_type, {N, C}), mean, rstd,
                                 ConstTensorView(inp, {N, C}), params() + parameter(norm + ".weight").offset,
                                 norm_bias(norm), {});
}

void Decoder::run_forward(const int32_t* tokens, int64_t B, int64_t T) {
  OCTET_REQUIRE(B >= 1 && B <= max_batch_,
                "batch size {} is outside 1..{} (the size the model was planned for)", B, max_batch_);
  OCTET_REQUIRE(T >= 1 && T <= max_seq_len_, "sequence length {} is outside 1..{}", T, max_seq_len_);
  const int64_t N = B * T, C = config_.channels;
  for (int64_t i = 0; i < N; ++i) {
    OCTET_REQUIRE(tokens[i] >= 0 && tokens[i] < config_.vocab_size,
                  "token {} at position {} is outside the vocabulary (0..{})", tokens[i], i,
                  config_.vocab_size - 1);
  }
  backend_.copy_from_host(tokens_->ints(), tokens, static_cast<size_t>(N) * sizeof(int32_t));
  float* p = params();
  auto P = [&](const std::string& name) { return p + parameter(name).offset; };
  const bool gpt2 = config_.arch == ModelArchitecture::gpt2;
  Activations& a = *acts_;
  need_parameters(forward_bounds_[1]);
  backend_.embedding_forward(TensorView(a.encoded, {B, T, C}), tokens_->ints(),
                             ConstTensorView(P(embedding_name()), {config_.padded_vocab(), C}),
                             gpt2 ? ConstTensorView(P("wpe"), {T, C}) : ConstTensorView());
  if (checkpointing() == ActivationCheckpointing::full) {
    // The scales this forward's casts take, for the blocks' forwards again in the backward.
    std::vector<Fp8LinearState*> states;
    for (auto& l : linears_) {
      if (l->plan->fp8()) states.push_back(&l->state);
    }
    backend_.fetch_scaling(std::span<Fp8LinearState* const>(states));  // together: one wait on a GPU
    for (auto& l : linears_) {
      if (l->plan->fp8()) l->forward_activation = l->state.activation;
    }
  }
  for (int64_t l = 0; l < config_.layers; ++l) {
    need_parameters(forward_bounds_[static_cast<size_t>(l) + 2]);
    forward_block(l, B, T);
  }
  need_parameters(parameter_count_);  // the final norm and the head
  const float* residual = config_.layers > 0 ? a.layers.back().residual3 : a.encoded;
  Linear& head = linear("lm_head");
  const std::string lnf = final_norm_name();
  norm_into(head, a.lnf, a.lnf_mean, a.lnf_rstd, residual, P(lnf + ".weight"), norm_bias(lnf), N, C);
  last_B_ = B;
  last_T_ = T;
  pending_ = Pending::nothing;
  logits_valid_ = false;
}

void Decoder::forward_logits(const int32_t* tokens, int64_t B, int64_t T) {
  run_forward(tokens, B, T);
  const int64_t N = B * T, Vp = config_.padded_vocab();
  if (!full_logits_) {
    full_logits_ = backend_.allocate(static_cast<size_t>(max_batch_ * max_seq_len_ * Vp) * sizeof(float));
  }
  Linear& head = linear("lm_head");
  backend_.linear_forward(TensorView(full_logits_->floats(), {N, Vp}),
                          ConstTensorView(acts_->lnf, head.input_type, {N, config_.channels}),
                          weight_of(head), head.copy.get(), {}, head.exec, fp8_input(head, true));
  logits_valid_ = true;
}

float Decoder::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float dloss) {
  run_forward(tokens, B, T);
  const int64_t N = B * T;
  for (int64_t i = 0; i < N; ++i) {
    OCTET_REQUIRE(targets[i] >= 0 && targets[i] < config_.vocab_size,
                  "target {} at position {} is outside the vocabulary (0..{})", targets[i], i,
                  config_.vocab_size - 1);
  }
  int32_t* device_targets = tokens_->ints() + max_batch_ * max_seq_len_;
  backend_.copy_from_host(device_targets, targets, static_cast<size_t>(N) * sizeof(int32_t));
  head_and_loss(N, dloss, dloss != 0.0f, true);
  pending_ = dloss != 0.0f ? Pending::head_backward_done : Pending::loss;
  head_dloss_ = dloss;
  return mean_loss(N);
}

void Decoder::head_and_loss(int64_t N, float dloss, bool backward, bool recompute) {
  const int64_t C = config_.channels, V = config_.vocab_size, Vp = config_.padded_vocab();
  const int64_t rows = head_chunk_rows(N);
  OCTET_CHECK(recompute || rows >= N, "the logits of a single chunk");
  Activations& a = *acts_;
  Linear& head = linear("lm_head");
  const float* w = params() + head.weight_offset;
  OCTET_CHECK(head.weight_grad_type == Dtype::f32, "the LM head's weight gradient in float32");
  float* dw = static_cast<float*>(head.weight_grad);
  const int32_t* targets = tokens_->ints() + max_batch_ * max_seq_len_;
  // The chunks count as the one GEMM of each kind that they split (more than one chunk only without FP8):
  // after the first, the head's GEMMs go uncounted until this returns.
  struct Restore {
    int64_t*& slot;
    int64_t* value;
    ~Restore() { slot = value; }
  } restore{head.exec.other_gemms, head.exec.other_gemms};
  for (int64_t r = 0; r < N; r += rows) {
    const int64_t n = std::min(rows, N - r);
    // Null (FP8 head, single chunk) when the cast is all the head reads of ln_f.
    const void* lnf =
        a.lnf != nullptr ? static_cast<const char*>(a.lnf) + storage_bytes(head.input_type, r * C) : nullptr;
    const ConstTensorView inp(lnf, head.input_type, {n, C});
    const TensorView dinp(backward ? dacts_->ln + r * C : nullptr, {n, C});
    if (recompute) {
      // GEMM, loss and the head's backward in turn (lm_head.h), the logits in the type the backend keeps them
      // in throughout.
      lm_head_chunk(backend_,
                    {.losses = a.losses + r,
                     .logits = a.logits_chunk,
                     .targets = targets + r,
                     .dinp = dinp,
                     .dweight = TensorView(dw, {Vp, C}),
                     .inp = inp,
                     .weight = ConstTensorView(w, {Vp, C}),
                     .copy = head.copy.get(),
                     .input = fp8_input(head, r == 0),
                     .gradient = {&gradient_codes_},
                     .V = V,
                     .dloss = backward ? dloss : 0.0f},
                    backward ? backward_exec(head) : head.exec);
      head.exec.other_gemms = nullptr;
      continue;
    }
    const TensorView logits(a.logits_chunk, {n, Vp});
    backend_.softmax_cross_entropy(a.losses + r, logits, targets + r, V, backward ? dloss : 0.0f);
    if (backward) {
      // The chunk now holds its logits' gradient.
      backend_.linear_backward(dinp, TensorView(dw, {Vp, C}), nullptr, logits, inp,
                               ConstTensorView(w, {Vp, C}), head.copy.get(), backward_exec(head),
                               head.input_codes.get(), {&gradient_codes_});
    }
    head.exec.other_gemms = nullptr;
  }
}

float Decoder::mean_loss(int64_t N) {
  std::vector<float> losses(static_cast<size_t>(N));
  backend_.copy_to_host(losses.data(), acts_->losses, losses.size() * sizeof(float));
  double sum = 0.0;
  for (const float l : losses) sum += l;
  return static_cast<float>(sum / static_cast<double>(N));
}

ConstTensorView Decoder::weight_of(const Linear& layer) {
  return {params() + layer.weight_offset, {layer.plan->out_features, layer.plan->in_features}};
}

LinearExecution& Decoder::backward_exec(Linear& layer) {
  layer.exec.accumulate_weight_gradient = layer.weight_gradient_written;
  layer.weight_gradient_written = true;
  return layer.exec;
}

Fp8Operand Decoder::fp8_input(Linear& layer, bool cast_by_producer) {
  return {&layer.input_codes, cast_by_producer && layer.exec.forward == GemmMode::fp8};
}

const Fp8Tensor& Decoder::kept_input(const Linear& layer) {
  OCTET_CHECK(layer.input_codes != nullptr, "{}'s FP8 input, kept by its forward", layer.plan->name);
  return *layer.input_codes;
}

void Decoder::backward_linear(Linear& layer, void* dinp, Dtype dinp_type, float* dbias, const void* dout,
                           Dtype dout_type, const void* inp, Dtype inp_type, int64_t N,
                           bool gradient_cast_by_producer, std::unique_ptr<Fp8Tensor>* gradient_slot) {
  const int64_t OC = layer.plan->out_features, IC = layer.plan->in_features;
  backend_.linear_backward(TensorView(dinp, dinp_type, {N, IC}),
                           TensorView(layer.weight_grad, layer.weight_grad_type, {OC, IC}), dbias,
                           ConstTensorView(dout, dout_type, {N, OC}), ConstTensorView(inp, inp_type, {N, IC}),
                           weight_of(layer), layer.copy.get(), backward_exec(layer), layer.input_codes.get(),
                           {gradient_slot != nullptr ? gradient_slot : &gradient_codes_, gradient_cast_by_producer});
  if (layer.round_weight_gradient) {
    backend_.round_in_place(static_cast<float*>(layer.weight_grad), layer.weight_count, Dtype::bf16);
  }
}

void Decoder::backward(float dloss_scale) {
  OCTET_REQUIRE(pending_ != Pending::nothing, "backward needs a forward with targets first");
  const int64_t B = last_B_, T = last_T_, N = B * T, C = config_.channels, NH = config_.heads;
  need_parameters_backward(forward_bounds_[forward_bounds_.size() - 2]);  // the final norm and the head
  if (pending_ == Pending::head_backward_done) {
    OCTET_REQUIRE(dloss_scale == head_dloss_,
                  "backward's loss gradient scale ({}) differs from the one the forward's LM head used ({})",
                  dloss_scale, head_dloss_);
  } else {
    // A single chunk's float32 logits are still there; more chunks', or logits rounded to BF16 (which a
    // backend may keep in BF16: lm_head.h), are made again.
    const bool recompute = head_chunk_rows(N) < N || logits_in_bf16(linear("lm_head").exec);
    head_and_loss(N, dloss_scale, true, recompute);
  }
  pending_ = Pending::nothing;
  float* p = params();
  float* g = grads_->floats();
  auto P = [&](const std::string& name) { return p + parameter(name).offset; };
  auto G = [&](const std::string& name) {
    const ParameterInfo& info = parameter(name);
    OCTET_CHECK(info.grad_type == Dtype::f32, "the gradient of {} in float32", name);
    return g + info.grad_offset;
  };
  Activations& a = *acts_;
  Gradients& d = *dacts_;

  // d.ln holds d(lnf), from the head's backward. The residual stream's gradient starts at zero.
  const bool gpt2 = config_.arch == ModelArchitecture::gpt2;
  const int64_t H = config_.hidden(), FC = activation_inputs(activation_kind()) * H, W = config_.qkv_width();
  const float* last_residual = config_.layers > 0 ? a.layers.back().residual3 : a.encoded;
  const std::string lnf = final_norm_name();
  backend_.fill_zero(d.residual, N * C);
  backend_.normalization_backward(norm_kind(), d.residual, G(lnf + ".weight"), norm_bias_grad(lnf),
                                  ConstTensorView(d.ln, {N, C}), last_residual, P(lnf + ".weight"), a.lnf_mean,
                                  a.lnf_rstd);
  // What gradients are final as the backward goes: the head's and the final norm's now, each block's after
  // its backward, the embeddings' at the end.
  const std::string block_word = gpt2 ? "h." : "layers.";
  const auto embedding = [&](std::string_view name) { return name == embedding_name() || name == "wpe"; };
  if (gradient_ready_) {
    report_gradients([&](std::string_view name) { return !embedding(name) && !name.starts_with(block_word); });
  }

  for (int64_t l = config_.layers - 1; l >= 0; --l) {
    need_parameters_backward(forward_bounds_[static_cast<size_t>(l) + 1]);
    const BlockNames b = block_names(l);
    Activations::Layer& x = a.layers[static_cast<size_t>(l)];
    const float* residual = l == 0 ? a.encoded : a.layers[static_cast<size_t>(l - 1)].residual3;
    Linear& qkv = linear(b.qkv);
    Linear& proj = linear(b.proj);
    float* dqkv = d.wide_a;
    float* datty = d.wide_b;

    // Under "full" the shared activations hold the last block's forward already; the others run theirs
    // again. Under "selective" the inputs of the GEMMs below are made again from what the block kept, each
    // just before its GEMM reads it.
    const bool selective = checkpointing() == ActivationCheckpointing::selective;
    if (checkpointing() == ActivationCheckpointing::full && l != config_.layers - 1) rerun_block(l, B, T);
    if (config_.moe()) {
      moe_backward(l, B, T, residual, dloss_scale);
    } else {
    Linear& fc = linear(b.fc);
    Linear& fc_proj = linear(b.fc_proj);
    float* dfch_gelu = d.wide_a;
    float* dfch = d.wide_b;
    const void* fch = x.fch;
    if (fch == nullptr) {  // not kept (fp8.recompute_mlp): the forward's GEMM again, from its kept input codes
      backend_.linear_recompute(TensorView(a.fch_scratch, hidden_type_, {N, FC}), weight_of(fc), fc.copy.get(),
                                {.bias = bias_of(fc)}, fc.exec, kept_input(fc));
      round_hidden(a.fch_scratch, N * FC);
      fch = a.fch_scratch;
    }
    if (selective && x.fch_gelu != nullptr) {
      backend_.activation_forward(activation_kind(), TensorView(x.fch_gelu, fc_proj.input_type, {N, H}),
                                  ConstTensorView(fch, hidden_type_, {N, FC}), {});
    }
    // d.residual: d(residual3) = d(fcproj), as residual3 = residual2 + fcproj.
    backward_linear(fc_proj, dfch_gelu, hidden_type_, fc_proj.bias_grad, d.residual, Dtype::f32, x.fch_gelu,
                    fc_proj.input_type, N);
    round_hidden(dfch_gelu, N * H);
    const float* residual2 = x.residual2;
    if (residual2 == nullptr) {  // not kept (fp8.recompute_residual): the projection's forward and add again
      backend_.linear_recompute(TensorView(a.residual2_scratch, {N, C}), weight_of(proj), proj.copy.get(),
                                {.bias = bias_of(proj), .residual = residual}, proj.exec, kept_input(proj));
      residual2 = a.residual2_scratch;
    }
    if (selective && x.ln2 != nullptr) renormalize(fc, x.ln2, x.ln2_mean, x.ln2_rstd, residual2, b.norm2, N);
    const Dtype dln2_type = norm_gradient_type(fc);
    activation_backward_into(fc, dfch, fch, dfch_gelu, N, H, d.ln, dln2_type, x.ln2);
    round_norm_gradient(fc, dln2_type, d.ln, N * C);
    backend_.normalization_backward(norm_kind(), d.residual, G(b.norm2 + ".weight"), norm_bias_grad(b.norm2),
                                    ConstTensorView(d.ln, dln2_type, {N, C}), residual2, P(b.norm2 + ".weight"),
                                    x.ln2_mean, x.ln2_rstd);
    }
    // d.residual: d(residual2) = d(attproj), as residual2 = residual + attproj.
    backward_linear(proj, datty, atty_type_, proj.bias_grad, d.residual, Dtype::f32, x.atty, atty_type_, N);
    const void* qkv_in = x.qkv;
    if (qkv_in == nullptr) {  // not kept (fp8.recompute_qkv): the projection's forward GEMM again
      const TensorView again(a.qkv_scratch, qkv_type_, {B, T, W});
      backend_.linear_recompute(again, weight_of(qkv), qkv.copy.get(), {.bias = bias_of(qkv)}, qkv.exec,
                                kept_input(qkv));
      if (!gpt2) backend_.rotary_embedding(again, rotary_table(T), NH + config_.kv(), false);
      qkv_in = a.qkv_scratch;
    }
    const TensorView dqkv_view(dqkv, atty_type_, {B, T, W});
    backend_.attention_backward(dqkv_view, ConstTensorView(datty, atty_type_, {B, T, C}),
                                ConstTensorView(qkv_in, qkv_type_, {B, T, W}),
                                ConstTensorView(x.atty, atty_type_, {B, T, C}), x.att_lse, attention_heads());
    // The rotary embedding's backward: the gradient of q and k rotated back.
    if (!gpt2) backend_.rotary_embedding(dqkv_view, rotary_table(T), NH + config_.kv(), true);
    if (selective && x.ln1 != nullptr) renormalize(qkv, x.ln1, x.ln1_mean, x.ln1_rstd, residual, b.norm1, N);
    const Dtype dln1_type = norm_gradient_type(qkv);
    backward_linear(qkv, d.ln, dln1_type, qkv.bias_grad, dqkv, atty_type_, x.ln1, qkv.input_type, N);
    round_norm_gradient(qkv, dln1_type, d.ln, N * C);
    backend_.normalization_backward(norm_kind(), d.residual, G(b.norm1 + ".weight"), norm_bias_grad(b.norm1),
                                    ConstTensorView(d.ln, dln1_type, {N, C}), residual, P(b.norm1 + ".weight"),
                                    x.ln1_mean, x.ln1_rstd);
    if (gradient_ready_) {
      const std::string block = fmt::format("{}{}.", block_word, l);
      report_gradients([&](std::string_view name) { return name.starts_with(block); });
    }
  }
  need_parameters_backward(0);  // the embeddings
  backend_.embedding_backward(TensorView(G(embedding_name()), {config_.padded_vocab(), C}),
                              gpt2 ? TensorView(G("wpe"), {T, C}) : TensorView(),
                              ConstTensorView(d.residual, {B, T, C}), tokens_->ints());
  if (gradient_ready_) report_gradients(embedding);
}

void Decoder::report_gradients(const std::function<bool(std::string_view name)>& part) {
  for (const auto& l : linears_) {
    if (l->weight_gradient_written) continue;
    const auto first = std::find_if(parameters_.begin(), parameters_.end(),
                                    [&](const ParameterInfo& p) { return p.offset == l->weight_offset; });
    if (first == parameters_.end() || !part(first->name)) continue;
    // A bf16 gradient's slice is whole 16-byte words (plan_parameter_gradients).
    const int64_t floats = l->weight_grad_type == Dtype::f32 ? l->weight_count : (l->weight_count + 1) / 2;
    backend_.fill_zero(static_cast<float*>(l->weight_grad), floats);
    l->weight_gradient_written = true;
  }
  // Each buffer's gradients in runs: neighbours in it merge into one run.
  for (const Dtype storage : {Dtype::f32, Dtype::bf16}) {
    std::vector<std::pair<int64_t, int64_t>> runs;
    for (const ParameterInfo& p : parameters_) {
      if (p.grad_type != storage || !part(p.name)) continue;
      if (!runs.empty() && runs.back().second == p.grad_offset) {
        runs.back().second += p.count;
      } else {
        runs.emplace_back(p.grad_offset, p.grad_offset + p.count);
      }
    }
    for (const auto& [begin, end] : runs) gradient_ready_(storage, begin, end);
  }
}

void Decoder::set_scaling_updates(bool on) {
  // Evaluation casts leave the telemetry alone too: it describes what training does.
  for (auto& l : linears_) {
    l->exec.update_scaling = on;
    l->exec.telemetry = on && collect_telemetry_ && l->plan->fp8() ? &l->telemetry : nullptr;
  }
}

const float* Decoder::logits() const {
  OCTET_REQUIRE(logits_valid_,
                "logits() holds the logits of forward_logits only (a forward with targets keeps "
                "none of them)");
  return full_logits_->floats();
}
const float* Decoder::losses() const {
  return acts_->losses;
}

}  // namespace octet
