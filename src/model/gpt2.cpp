// GPT-2 forward and backward, by hand, against the backend interface (see gpt2.h). The structure follows
// llm.c's train_gpt2.c: named parameter tensors in one buffer, activations in one planned buffer, and a
// backward that walks the layers in reverse, accumulating the residual stream's gradient.
#include "octet/model/gpt2.h"

#include <cmath>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/numerics/random.h"

namespace octet {

// Pointers into the activation buffer (and, with the same layout, its gradient buffer), sized for the
// largest micro-batch N = max_batch * max_seq_len.
struct Gpt2::Activations {
  struct Layer {
    float* ln1;
    float* ln1_mean;
    float* ln1_rstd;
    float* qkv;
    float* atty;
    float* att_lse;
    float* attproj;
    float* residual2;
    float* ln2;
    float* ln2_mean;
    float* ln2_rstd;
    float* fch;
    float* fch_gelu;
    float* fcproj;
    float* residual3;
  };
  float* encoded;
  std::vector<Layer> layers;
  float* lnf;
  float* lnf_mean;
  float* lnf_rstd;
  float* logits;
  float* losses;
  int64_t floats = 0;
};

struct Gpt2::Linear {
  const LinearPlan* plan;
  int64_t weight_offset;
  int64_t bias_offset;  // -1: no bias
  Fp8LinearState state;
  Fp8LinearTelemetry telemetry;
  LinearExecution exec;
  std::unique_ptr<WeightCopy> copy;
};

namespace {

// Lays out named slices of one buffer; the same layout serves the activations and their gradients.
class Planner {
 public:
  int64_t take(int64_t count) {
    const int64_t at = next_;
    next_ += (count + 15) / 16 * 16;  // 64-byte aligned slices
    return at;
  }
  int64_t size() const { return next_; }

 private:
  int64_t next_ = 0;
};

// Normal(0, 1) from the counter-based generator (Box-Muller), so initialisation depends only on the seed.
float normal_at(const CounterRng& rng, uint64_t index) {
  const double u1 = (static_cast<double>(rng.bits(index, 0)) + 1.0) / 4294967297.0;
  const double u2 = static_cast<double>(rng.bits(index, 1)) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

Gpt2::Gpt2(const Gpt2Config& config, Backend& backend, PrecisionPolicy policy, int64_t max_batch,
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
  plan_activations();
  const int64_t N = max_batch_ * max_seq_len_;
  tokens_ = backend_.allocate(static_cast<size_t>(2 * N) * sizeof(int32_t));
}

Gpt2::~Gpt2() = default;

void Gpt2::build_parameters() {
  const int64_t C = config_.channels, Vp = config_.padded_vocab(), L = config_.layers;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParameterInfo p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.count = 1;
    for (const int64_t d : p.shape) p.count *= d;
    p.offset = parameter_count_;
    p.weight_decay = p.shape.size() == 2;
    parameter_count_ += p.count;
    parameters_.push_back(std::move(p));
  };
  add("wte", {Vp, C});
  add("wpe", {config_.max_seq_len, C});
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {3 * C, C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {4 * C, C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {C, 4 * C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  params_ = backend_.allocate(static_cast<size_t>(parameter_count_) * sizeof(float));
  grads_ = backend_.allocate(static_cast<size_t>(parameter_count_) * sizeof(float));

  for (const LinearPlan& plan : policy_.layers()) {
    auto linear = std::make_unique<Linear>();
    linear->plan = &plan;
    if (plan.name == "lm_head") {
      linear->weight_offset = parameter("wte").offset;  // tied to the token embedding
      linear->bias_offset = -1;
    } else {
      linear->weight_offset = parameter(plan.name + ".weight").offset;
      linear->bias_offset = parameter(plan.name + ".bias").offset;
    }
    LinearExecution& e = linear->exec;
    e.forward = plan.forward;
    e.input_gradient = plan.input_gradient;
    e.weight_gradient = plan.weight_gradient;
    if (plan.fp8()) {
      e.recipe = policy_.recipe();
      e.formats = policy_.formats();
      e.fast_accumulation_forward = policy_.settings().fast_accumulation_forward;
      e.fast_accumulation_backward = policy_.settings().fast_accumulation_backward;
      linear->state = {e.recipe->initial_state(), e.recipe->initial_state(), e.recipe->initial_state()};
      e.state = &linear->state;
      e.telemetry = &linear->telemetry;
    }
    e.fp8_gemms = &counters_.fp8_gemms;
    e.other_gemms = &counters_.other_gemms;
    e.saturated = &counters_.saturated;
    e.underflowed = &counters_.underflowed;
    linears_.push_back(std::move(linear));
  }
}

void Gpt2::plan_activations() {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels, NH = config_.heads;
  Planner p;
  struct Offsets {
    int64_t encoded, lnf, lnf_mean, lnf_rstd, logits, losses;
    std::vector<std::array<int64_t, 15>> layers;
  } o;
  o.encoded = p.take(N * C);
  for (int64_t l = 0; l < config_.layers; ++l) {
    o.layers.push_back({p.take(N * C), p.take(N), p.take(N), p.take(N * 3 * C), p.take(N * C), p.take(N * NH),
                        p.take(N * C), p.take(N * C), p.take(N * C), p.take(N), p.take(N), p.take(N * 4 * C),
                        p.take(N * 4 * C), p.take(N * C), p.take(N * C)});
  }
  o.lnf = p.take(N * C);
  o.lnf_mean = p.take(N);
  o.lnf_rstd = p.take(N);
  o.logits = p.take(N * config_.padded_vocab());
  o.losses = p.take(N);
  activations_ = backend_.allocate(static_cast<size_t>(p.size()) * sizeof(float));
  activation_grads_ = backend_.allocate(static_cast<size_t>(p.size()) * sizeof(float));
  acts_ = std::make_unique<Activations>();
  float* base = activations_->floats();
  acts_->floats = p.size();
  acts_->encoded = base + o.encoded;
  for (const auto& a : o.layers) {
    acts_->layers.push_back({base + a[0], base + a[1], base + a[2], base + a[3], base + a[4], base + a[5],
                             base + a[6], base + a[7], base + a[8], base + a[9], base + a[10], base + a[11],
                             base + a[12], base + a[13], base + a[14]});
  }
  acts_->lnf = base + o.lnf;
  acts_->lnf_mean = base + o.lnf_mean;
  acts_->lnf_rstd = base + o.lnf_rstd;
  acts_->logits = base + o.logits;
  acts_->losses = base + o.losses;
}

const ParameterInfo& Gpt2::parameter(std::string_view name) const {
  for (const ParameterInfo& p : parameters_) {
    if (p.name == name) return p;
  }
  OCTET_REQUIRE(false, "no parameter named '{}' in this model", name);
  return parameters_.front();
}

Gpt2::Linear& Gpt2::linear(std::string_view name) {
  for (auto& l : linears_) {
    if (l->plan->name == name) return *l;
  }
  OCTET_CHECK(false, "a linear layer named {}", name);
  return *linears_.front();
}

Fp8LinearState* Gpt2::fp8_state(std::string_view layer) {
  Linear& l = linear(layer);
  if (!l.plan->fp8()) return nullptr;
  backend_.fetch_scaling(l.state);  // the device's state, where the backend keeps it there
  return &l.state;
}

Fp8LinearTelemetry* Gpt2::telemetry(std::string_view layer) {
  Linear& l = linear(layer);
  if (!l.plan->fp8()) return nullptr;
  backend_.fetch_telemetry(l.telemetry);  // the device's totals, where the backend keeps them there
  return &l.telemetry;
}

void Gpt2::reset_telemetry() {
  for (auto& l : linears_) l->telemetry = {};
}

void Gpt2::set_telemetry(bool collect, bool measure_sqnr) {
  collect_telemetry_ = collect;
  for (auto& l : linears_) {
    l->exec.telemetry = collect && l->plan->fp8() ? &l->telemetry : nullptr;
    l->exec.measure_sqnr = collect && measure_sqnr;
  }
}

void Gpt2::move_layer_to_bf16(std::string_view layer, std::string reason) {
  Linear& l = linear(layer);
  policy_.move_layer_to_bf16(layer, std::move(reason));
  l.exec.forward = l.exec.input_gradient = l.exec.weight_gradient = GemmMode::bf16;
  l.exec.telemetry = nullptr;
  l.exec.saved_input.reset();
  l.copy.reset();  // an FP8 copy holds no rounded weight: make a fresh one
  backend_.prepare_weight(l.copy, params() + l.weight_offset, l.plan->out_features, l.plan->in_features,
                          l.exec);
}

void Gpt2::init_weights(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(parameter_count_), 0.0f);
  const CounterRng rng(seed);
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers));
  for (const ParameterInfo& p : parameters_) {
    float* out = host.data() + p.offset;
    if (p.shape.size() == 2) {
      const float std = (ends_with(p.name, "attn.c_proj.weight") || ends_with(p.name, "mlp.c_proj.weight"))
                            ? residual_std
                            : 0.02f;
      int64_t count = p.count;
      if (p.name == "wte") count = config_.vocab_size * config_.channels;  // padded rows stay zero
      for (int64_t i = 0; i < count; ++i) out[i] = std * normal_at(rng, static_cast<uint64_t>(p.offset + i));
    } else if (ends_with(p.name, ".weight")) {
      for (int64_t i = 0; i < p.count; ++i) out[i] = 1.0f;  // LayerNorm gain
    }
  }
  backend_.copy_from_host(params(), host.data(), host.size() * sizeof(float));
  refresh_weight_copies();
}

void Gpt2::refresh_weight_copies() {
  for (auto& l : linears_) {
    const LinearPlan& plan = *l->plan;
    const bool wide = plan.forward != GemmMode::f32 || plan.input_gradient != GemmMode::f32;
    if (wide)
      backend_.prepare_weight(l->copy, params() + l->weight_offset, plan.out_features, plan.in_features,
                              l->exec);
  }
}

void Gpt2::run_forward(const int32_t* tokens, int64_t B, int64_t T) {
  OCTET_REQUIRE(B >= 1 && B <= max_batch_,
                "batch size {} is outside 1..{} (the size the model was planned for)", B, max_batch_);
  OCTET_REQUIRE(T >= 1 && T <= max_seq_len_, "sequence length {} is outside 1..{}", T, max_seq_len_);
  const int64_t N = B * T, C = config_.channels, NH = config_.heads;
  for (int64_t i = 0; i < N; ++i) {
    OCTET_REQUIRE(tokens[i] >= 0 && tokens[i] < config_.vocab_size,
                  "token {} at position {} is outside the vocabulary (0..{})", tokens[i], i,
                  config_.vocab_size - 1);
  }
  backend_.copy_from_host(tokens_->ints(), tokens, static_cast<size_t>(N) * sizeof(int32_t));
  float* p = params();
  auto P = [&](const std::string& name) { return p + parameter(name).offset; };
  Activations& a = *acts_;
  backend_.encoder_forward(a.encoded, tokens_->ints(), P("wte"), P("wpe"), B, T, C);
  const float* residual = a.encoded;
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    Activations::Layer& x = a.layers[static_cast<size_t>(l)];
    Linear& qkv = linear(h + "attn.c_attn");
    Linear& proj = linear(h + "attn.c_proj");
    Linear& fc = linear(h + "mlp.c_fc");
    Linear& fc_proj = linear(h + "mlp.c_proj");
    backend_.layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, P(h + "ln_1.weight"),
                               P(h + "ln_1.bias"), N, C);
    backend_.linear_forward(x.qkv, x.ln1, p + qkv.weight_offset, qkv.copy.get(), p + qkv.bias_offset, N, C,
                            3 * C, qkv.exec);
    backend_.attention_forward(x.atty, x.att_lse, x.qkv, B, T, C, NH);
    backend_.linear_forward(x.attproj, x.atty, p + proj.weight_offset, proj.copy.get(), p + proj.bias_offset,
                            N, C, C, proj.exec);
    backend_.residual_forward(x.residual2, residual, x.attproj, N * C);
    backend_.layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.residual2, P(h + "ln_2.weight"),
                               P(h + "ln_2.bias"), N, C);
    backend_.linear_forward(x.fch, x.ln2, p + fc.weight_offset, fc.copy.get(), p + fc.bias_offset, N, C,
                            4 * C, fc.exec);
    backend_.gelu_forward(x.fch_gelu, x.fch, N * 4 * C);
    backend_.linear_forward(x.fcproj, x.fch_gelu, p + fc_proj.weight_offset, fc_proj.copy.get(),
                            p + fc_proj.bias_offset, N, 4 * C, C, fc_proj.exec);
    backend_.residual_forward(x.residual3, x.residual2, x.fcproj, N * C);
    residual = x.residual3;
  }
  backend_.layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, residual, P("ln_f.weight"), P("ln_f.bias"), N, C);
  Linear& head = linear("lm_head");
  backend_.linear_forward(a.logits, a.lnf, p + head.weight_offset, head.copy.get(), nullptr, N, C,
                          config_.padded_vocab(), head.exec);
  last_B_ = B;
  last_T_ = T;
}

void Gpt2::forward_logits(const int32_t* tokens, int64_t B, int64_t T) {
  run_forward(tokens, B, T);
  have_targets_ = false;
}

float Gpt2::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  run_forward(tokens, B, T);
  const int64_t N = B * T;
  for (int64_t i = 0; i < N; ++i) {
    OCTET_REQUIRE(targets[i] >= 0 && targets[i] < config_.vocab_size,
                  "target {} at position {} is outside the vocabulary (0..{})", targets[i], i,
                  config_.vocab_size - 1);
  }
  int32_t* device_targets = tokens_->ints() + max_batch_ * max_seq_len_;
  backend_.copy_from_host(device_targets, targets, static_cast<size_t>(N) * sizeof(int32_t));
  backend_.softmax_cross_entropy(acts_->losses, acts_->logits, device_targets, N, config_.vocab_size,
                                 config_.padded_vocab(), 0.0f);
  std::vector<float> losses(static_cast<size_t>(N));
  backend_.copy_to_host(losses.data(), acts_->losses, losses.size() * sizeof(float));
  double sum = 0.0;
  for (const float l : losses) sum += l;
  have_targets_ = true;
  return static_cast<float>(sum / static_cast<double>(N));
}

void Gpt2::zero_grad() {
  backend_.fill_zero(grads(), parameter_count_);
}

void Gpt2::backward(float dloss_scale) {
  OCTET_REQUIRE(have_targets_, "backward needs a forward with targets first");
  const int64_t B = last_B_, T = last_T_, N = B * T, C = config_.channels, NH = config_.heads;
  const int64_t Vp = config_.padded_vocab();
  float* p = params();
  float* g = grads();
  auto P = [&](const std::string& name) { return p + parameter(name).offset; };
  auto G = [&](const std::string& name) { return g + parameter(name).offset; };
  // The gradient buffer mirrors the activation buffer's layout.
  const ptrdiff_t shift = activation_grads_->floats() - activations_->floats();
  auto d = [&](const float* activation) { return const_cast<float*>(activation) + shift; };
  backend_.fill_zero(activation_grads_->floats(), acts_->floats);
  Activations& a = *acts_;

  const int32_t* targets = tokens_->ints() + max_batch_ * max_seq_len_;
  backend_.softmax_cross_entropy(a.losses, a.logits, targets, N, config_.vocab_size, Vp, dloss_scale);
  const float* dlogits = a.logits;  // overwritten in place by their gradient
  Linear& head = linear("lm_head");
  backend_.linear_backward(d(a.lnf), g + head.weight_offset, nullptr, dlogits, a.lnf, p + head.weight_offset,
                           head.copy.get(), N, C, Vp, head.exec);
  const float* last_residual = config_.layers > 0 ? a.layers.back().residual3 : a.encoded;
  backend_.layernorm_backward(d(last_residual), G("ln_f.weight"), G("ln_f.bias"), d(a.lnf), last_residual,
                              P("ln_f.weight"), a.lnf_mean, a.lnf_rstd, N, C);

  for (int64_t l = config_.layers - 1; l >= 0; --l) {
    const std::string h = fmt::format("h.{}.", l);
    Activations::Layer& x = a.layers[static_cast<size_t>(l)];
    const float* residual = l == 0 ? a.encoded : a.layers[static_cast<size_t>(l - 1)].residual3;
    float* dres3 = d(x.residual3);
    float* dres2 = d(x.residual2);
    float* dres = d(residual);
    Linear& qkv = linear(h + "attn.c_attn");
    Linear& proj = linear(h + "attn.c_proj");
    Linear& fc = linear(h + "mlp.c_fc");
    Linear& fc_proj = linear(h + "mlp.c_proj");

    backend_.accumulate(dres2, dres3, N * C);  // residual3 = residual2 + fcproj
    backend_.linear_backward(d(x.fch_gelu), g + fc_proj.weight_offset, g + fc_proj.bias_offset, dres3,
                             x.fch_gelu, p + fc_proj.weight_offset, fc_proj.copy.get(), N, 4 * C, C,
                             fc_proj.exec);
    backend_.gelu_backward(d(x.fch), x.fch, d(x.fch_gelu), N * 4 * C);
    backend_.linear_backward(d(x.ln2), g + fc.weight_offset, g + fc.bias_offset, d(x.fch), x.ln2,
                             p + fc.weight_offset, fc.copy.get(), N, C, 4 * C, fc.exec);
    backend_.layernorm_backward(dres2, G(h + "ln_2.weight"), G(h + "ln_2.bias"), d(x.ln2), x.residual2,
                                P(h + "ln_2.weight"), x.ln2_mean, x.ln2_rstd, N, C);
    backend_.accumulate(dres, dres2, N * C);  // residual2 = residual + attproj
    backend_.linear_backward(d(x.atty), g + proj.weight_offset, g + proj.bias_offset, dres2, x.atty,
                             p + proj.weight_offset, proj.copy.get(), N, C, C, proj.exec);
    backend_.attention_backward(d(x.qkv), d(x.atty), x.qkv, x.atty, x.att_lse, B, T, C, NH);
    backend_.linear_backward(d(x.ln1), g + qkv.weight_offset, g + qkv.bias_offset, d(x.qkv), x.ln1,
                             p + qkv.weight_offset, qkv.copy.get(), N, C, 3 * C, qkv.exec);
    backend_.layernorm_backward(dres, G(h + "ln_1.weight"), G(h + "ln_1.bias"), d(x.ln1), residual,
                                P(h + "ln_1.weight"), x.ln1_mean, x.ln1_rstd, N, C);
  }
  backend_.encoder_backward(G("wte"), G("wpe"), d(a.encoded), tokens_->ints(), B, T, C);
  have_targets_ = false;  // the logits now hold their gradient
}

void Gpt2::set_scaling_updates(bool on) {
  // Evaluation casts leave the telemetry alone too: it describes what training does.
  for (auto& l : linears_) {
    l->exec.update_scaling = on;
    l->exec.telemetry = on && collect_telemetry_ && l->plan->fp8() ? &l->telemetry : nullptr;
  }
}

const float* Gpt2::logits() const {
  return acts_->logits;
}
const float* Gpt2::losses() const {
  return acts_->losses;
}

}  // namespace octet
