// The decoder's parameter plan: every parameter's name, shape and place in the one parameter buffer, the
// initialisation, where each gradient lives (float32, or bf16 for weight gradients kept so) and the linear
// layers' weight copies that the GEMMs read.
#include "octet/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "decoder_internal.h"
#include "octet/check.h"
#include "octet/numerics/format.h"
#include "octet/numerics/random.h"

namespace octet {

using decoder_detail::ends_with;

namespace {

// Normal(0, 1) from the counter-based generator (Box-Muller), so initialisation depends only on the seed.
float normal_at(const CounterRng& rng, uint64_t index) {
  const double u1 = (static_cast<double>(rng.bits(index, 0)) + 1.0) / 4294967297.0;
  const double u2 = static_cast<double>(rng.bits(index, 1)) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// A run of the initialisation's normal draws: out[i] = scale * normal_at(rng, first + i) for i < count.
struct NormalRun {
  float* out;
  uint64_t first;
  int64_t count;
  float scale;
};

// Every run's draws, on up to 16 threads over equal slices of all the runs' elements: each element depends on
// its index alone, so the values are those of one thread (a billion draws take a thread over a minute).
void draw_normal(const CounterRng& rng, const std::vector<NormalRun>& runs) {
  int64_t total = 0;
  for (const NormalRun& r : runs) total += r.count;
  const int64_t threads = std::clamp<int64_t>(std::min<int64_t>(std::thread::hardware_concurrency(), 16), 1,
                                              total / (1 << 20) + 1);
  auto slice = [&](int64_t begin, int64_t end) {
    int64_t at = 0;
    for (const NormalRun& r : runs) {
      const int64_t from = std::max(begin - at, int64_t{0}), to = std::min(end - at, r.count);
      for (int64_t i = from; i < to; ++i)
        r.out[i] = r.scale * normal_at(rng, r.first + static_cast<uint64_t>(i));
      at += r.count;
    }
  };
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t)
    workers.emplace_back(slice, total * t / threads, total * (t + 1) / threads);
  slice(0, total / threads);
  for (std::thread& w : workers) w.join();
}

}  // namespace

LinearRole role_of(std::string_view layer) {
  if (layer == "lm_head") return LinearRole::head;
  if (layer.find(".mlp.experts.") != std::string_view::npos) {
    if (ends_with(layer, ".gate_up_proj")) return LinearRole::expert_fc;
    if (ends_with(layer, ".down_proj")) return LinearRole::expert_fc_proj;
  }
  for (const auto& [suffix, role] :
       {std::pair{"attn.c_attn", LinearRole::qkv}, std::pair{"attn.c_proj", LinearRole::proj},
        std::pair{"mlp.c_fc", LinearRole::fc}, std::pair{"mlp.c_proj", LinearRole::fc_proj},
        std::pair{"self_attn.qkv_proj", LinearRole::qkv}, std::pair{"self_attn.o_proj", LinearRole::proj},
        std::pair{"mlp.gate_up_proj", LinearRole::fc}, std::pair{"mlp.down_proj", LinearRole::fc_proj},
        std::pair{"mlp.shared_expert.gate_up_proj", LinearRole::fc},
        std::pair{"mlp.shared_expert.down_proj", LinearRole::fc_proj}, std::pair{"mlp.gate", LinearRole::router}}) {
    if (ends_with(layer, suffix)) return role;
  }
  OCTET_CHECK(false, "a linear layer of a known kind, got {}", layer);
  return LinearRole::head;
}

void Decoder::build_parameters() {
  const int64_t C = config_.channels, Vp = config_.padded_vocab(), L = config_.layers, H = config_.hidden();
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
  if (config_.arch == ModelArchitecture::gpt2) {
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
      add(h + "mlp.c_fc.weight", {H, C});
      add(h + "mlp.c_fc.bias", {H});
      add(h + "mlp.c_proj.weight", {C, H});
      add(h + "mlp.c_proj.bias", {C});
    }
    add("ln_f.weight", {C});
    add("ln_f.bias", {C});
  } else {
    // Hugging Face's LlamaForCausalLM names without "model.". q, k and v lie one after another, as do gate
    // and up: the fused layers' weights (qkv_proj, gate_up_proj) are those runs.
    const int64_t kv_C = config_.kv() * config_.head_size();
    add("embed_tokens.weight", {Vp, C});
    for (int64_t l = 0; l < L; ++l) {
      const std::string h = fmt::format("layers.{}.", l);
      add(h + "input_layernorm.weight", {C});
      add(h + "self_attn.q_proj.weight", {C, C});
      add(h + "self_attn.k_proj.weight", {kv_C, C});
      add(h + "self_attn.v_proj.weight", {kv_C, C});
      add(h + "self_attn.o_proj.weight", {C, C});
      add(h + "post_attention_layernorm.weight", {C});
      // A SwiGLU MLP's three matrices: the dense MLP's, each expert's (mlp.experts.E.) and the shared
      // expert's (mlp.shared_expert.).
      auto mlp = [&](const std::string& m) {
        add(m + "gate_proj.weight", {H, C});
        add(m + "up_proj.weight", {H, C});
        add(m + "down_proj.weight", {C, H});
      };
      if (!config_.moe()) {
        mlp(h + "mlp.");
        continue;
      }
      add(h + "mlp.gate.weight", {config_.experts, C});
      for (int64_t e = 0; e < config_.experts; ++e) mlp(fmt::format("{}mlp.experts.{}.", h, e));
      if (config_.shared_expert) mlp(h + "mlp.shared_expert.");
    }
    add("norm.weight", {C});
    if (!config_.tied_head()) add("lm_head.weight", {Vp, C});
  }
  params_ = backend_.allocate_releasable(static_cast<size_t>(parameter_count_) * sizeof(float));
  forward_bounds_ = {0};
  for (int64_t l = 0; l < L; ++l) {
    const std::string first = config_.arch == ModelArchitecture::gpt2 ? fmt::format("h.{}.ln_1.weight", l)
                                                                      : fmt::format("layers.{}.input_layernorm.weight", l);
    forward_bounds_.push_back(parameter(first).offset);
  }
  forward_bounds_.push_back(parameter(final_norm_name() + ".weight").offset);
  forward_bounds_.push_back(parameter_count_);

  for (const LinearPlan& plan : policy_.layers()) {
    auto linear = std::make_unique<Linear>();
    linear->plan = &plan;
    linear->role = role_of(plan.name);
    // The first parameter of the layer's weight (a fused layer's weight spans several) and its bias.
    std::string first = plan.name + ".weight";
    if (linear->role == LinearRole::head) {
      first = config_.tied_head() ? embedding_name() : "lm_head.weight";
    } else if (config_.arch == ModelArchitecture::llama) {
      const std::string prefix = plan.name.substr(0, plan.name.rfind('.') + 1);
      if (linear->role == LinearRole::qkv) first = prefix + "q_proj.weight";
      if (linear->role == LinearRole::fc || linear->role == LinearRole::expert_fc) {
        first = prefix + "gate_proj.weight";
      }
    }
    linear->weight_offset = parameter(first).offset;
    linear->weight_count = plan.out_features * plan.in_features;
    linear->bias_offset = -1;
    if (config_.arch == ModelArchitecture::gpt2 && linear->role != LinearRole::head) {
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
      linear->state = policy_.initial_fp8_state(plan.name);  // calibrated scales where the policy has them
      e.state = &linear->state;
      e.telemetry = &linear->telemetry;
    }
    // fp8.recompute_mlp, _qkv and _residual: the backward runs this forward GEMM again on its kept input
    // codes.
    const PrecisionSettings& settings = policy_.settings();
    const LinearRole role = linear->role;
    const bool recomputed = (settings.recompute_mlp && role == LinearRole::fc) ||
                            (settings.recompute_qkv && role == LinearRole::qkv) ||
                            (settings.recompute_residual && role == LinearRole::proj);
    e.keep_input_codes = recomputed && input_cast_suffices(e);
    e.transpose_weight_per_use = settings.recompute_weight_transposes && e.input_gradient == GemmMode::fp8 &&
                                 e.recipe != nullptr &&
                                 e.recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor;
    // A mixture-of-experts block keeps its second normalization's output in float32 (the router and the
    // experts' gather read it too), and its experts' inputs, gathered by token, in float32.
    const bool moe_input = role == LinearRole::router || role == LinearRole::expert_fc ||
                           role == LinearRole::expert_fc_proj || (config_.moe() && role == LinearRole::fc);
    const bool fed_by_norm_or_gelu = role != LinearRole::proj;
    if (fed_by_norm_or_gelu && !moe_input && e.forward == GemmMode::bf16 &&
        e.weight_gradient == GemmMode::bf16) {
      linear->input_type = backend_.storage_type({StorageRole::rounded_activation});
    }
    e.fp8_gemms = &counters_.fp8_gemms;
    e.other_gemms = &counters_.other_gemms;
    e.saturated = &counters_.saturated;
    e.underflowed = &counters_.underflowed;
    linears_.push_back(std::move(linear));
  }
  block_linears_.resize(static_cast<size_t>(L));
  for (const auto& l : linears_) {
    linear_by_name_[l->plan->name] = l.get();
    const std::string& name = l->plan->name;
    if (l->role == LinearRole::head) continue;
    const int64_t block = std::stoll(name.substr(name.find('.') + 1));
    block_linears_[static_cast<size_t>(block)].push_back(l.get());
  }
  plan_parameter_gradients();
}

void Decoder::plan_parameter_gradients() {
  // Which weight gradients are kept rounded to bf16, and how the backend stores them.
  const bool bf16_weights = policy_.settings().bf16_weight_gradients;
  for (const auto& l : linears_) {
    const GemmMode mode = l->plan->weight_gradient;
    if (!bf16_weights || l->plan->name == "lm_head" || (mode != GemmMode::bf16 && mode != GemmMode::fp8)) {
      continue;
    }
    const Dtype type = backend_.storage_type({.role = StorageRole::weight_gradient, .layer = &l->exec});
    OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "weight gradients in f32 or bf16, got {}",
                dtype_name(type));
    l->round_weight_gradient = type == Dtype::f32;
    for (ParameterInfo& p : parameters_) {
      if (p.offset >= l->weight_offset && p.offset < l->weight_offset + l->weight_count) {
        p.grad_type = type;
        p.grad_precision = Dtype::bf16;
      }
    }
  }
  // The float32 gradients in the parameters' order, the bf16 ones in theirs: 16-byte aligned slices, one
  // per layer's weight (a fused layer's parameters one after another in it, as in params()).
  auto continues_fused_weight = [&](const ParameterInfo& p) {
    for (const auto& l : linears_) {
      if (p.offset > l->weight_offset && p.offset < l->weight_offset + l->weight_count) return true;
    }
    return false;
  };
  for (ParameterInfo& p : parameters_) {
    if (p.grad_type == Dtype::f32) {
      p.grad_offset = grad_f32_count_;
      grad_f32_count_ += p.count;
    } else {
      if (!continues_fused_weight(p)) grad_bf16_count_ = (grad_bf16_count_ + 7) / 8 * 8;
      p.grad_offset = grad_bf16_count_;
      grad_bf16_count_ += p.count;
    }
  }
  grad_bf16_count_ = (grad_bf16_count_ + 7) / 8 * 8;
  grads_ = backend_.allocate(static_cast<size_t>(grad_f32_count_) * sizeof(float));
  if (grad_bf16_count_ > 0) {
    grads_bf16_ = backend_.allocate(static_cast<size_t>(grad_bf16_count_) * sizeof(uint16_t));
  }
  auto* bf16_base = grads_bf16_ ? static_cast<uint16_t*>(grads_bf16_->data()) : nullptr;
  for (const auto& l : linears_) {
    const ParameterInfo& w =
        *std::find_if(parameters_.begin(), parameters_.end(),
                      [&](const ParameterInfo& p) { return p.offset == l->weight_offset; });
    if (l->bias_offset >= 0) {
      const ParameterInfo& b =
          *std::find_if(parameters_.begin(), parameters_.end(),
                        [&](const ParameterInfo& p) { return p.offset == l->bias_offset; });
      l->bias_grad = grads_->floats() + b.grad_offset;
    }
    l->weight_grad_type = w.grad_type;
    l->weight_grad = w.grad_type == Dtype::bf16 ? static_cast<void*>(bf16_base + w.grad_offset)
                                                : static_cast<void*>(grads_->floats() + w.grad_offset);
  }
  // zero_grad's ranges: the gaps between the float32 weight gradients of the linear layers (sorted; the LM
  // head's is wte's).
  std::vector<std::pair<int64_t, int64_t>> weights;
  for (const auto& l : linears_) {
    if (l->weight_grad_type == Dtype::f32) {
      weights.emplace_back(static_cast<float*>(l->weight_grad) - grads_->floats(), l->weight_count);
    }
  }
  std::sort(weights.begin(), weights.end());
  int64_t at = 0;
  for (const auto& [offset, count] : weights) {
    OCTET_CHECK(offset >= at, "linear layers' weights overlap at {}", offset);
    if (offset > at) zeroed_by_zero_grad_.push_back({at, offset - at});
    at = offset + count;
  }
  if (grad_f32_count_ > at) zeroed_by_zero_grad_.push_back({at, grad_f32_count_ - at});
}

const ParameterInfo& Decoder::parameter(std::string_view name) const {
  for (const ParameterInfo& p : parameters_) {
    if (p.name == name) return p;
  }
  OCTET_REQUIRE(false, "no parameter named '{}' in this model", name);
  return parameters_.front();
}

int64_t Decoder::flop_parameter_count() const {
  if (config_.arch == ModelArchitecture::gpt2) return parameter_count_ - parameter("wpe").count;
  int64_t count = parameter_count_ - (config_.tied_head() ? 0 : parameter(embedding_name()).count);
  // A token runs experts_per_token of the experts: the others' weights do no work for it.
  if (config_.moe()) {
    int64_t experts = 0;
    for (const ParameterInfo& p : parameters_) {
      if (p.name.find(".mlp.experts.") != std::string::npos) experts += p.count;
    }
    count -= experts - experts / config_.experts * config_.experts_per_token;
  }
  return count;
}

void Decoder::init_weights(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(parameter_count_), 0.0f);
  const CounterRng rng(seed);
  const float residual_std = config_.arch == ModelArchitecture::gpt2
                                 ? 0.02f / std::sqrt(2.0f * static_cast<float>(config_.layers))
                                 : 0.02f;
  std::vector<NormalRun> normal;
  for (const ParameterInfo& p : parameters_) {
    float* out = host.data() + p.offset;
    if (p.shape.size() == 2) {
      const float std = (ends_with(p.name, "attn.c_proj.weight") || ends_with(p.name, "mlp.c_proj.weight"))
                            ? residual_std
                            : 0.02f;
      int64_t count = p.count;
      if (p.shape[0] == config_.padded_vocab() && p.shape[1] == config_.channels &&
          (p.name == embedding_name() || p.name == "lm_head.weight")) {
        count = config_.vocab_size * config_.channels;  // padded rows stay zero
      }
      normal.push_back({out, static_cast<uint64_t>(p.offset), count, std});
    } else if (ends_with(p.name, ".weight")) {
      for (int64_t i = 0; i < p.count; ++i) out[i] = 1.0f;  // LayerNorm gain
    }
  }
  draw_normal(rng, normal);
  backend_.copy_from_host(params(), host.data(), host.size() * sizeof(float));
  refresh_weight_copies();
}

void Decoder::refresh_weight_copies() {
  for (const WeightCopySlot& slot : weight_copy_slots()) {
    backend_.prepare_weight(*slot.copy, params() + slot.offset, slot.rows, slot.cols, *slot.exec);
  }
  ++weight_copies_made_;
}

std::vector<Decoder::WeightCopySlot> Decoder::weight_copy_slots() {
  std::vector<WeightCopySlot> slots;
  for (auto& l : linears_) {
    const LinearPlan& plan = *l->plan;
    const bool wide = plan.forward != GemmMode::f32 || plan.input_gradient != GemmMode::f32;
    if (wide) {
      const bool tied = config_.tied_head() && l->weight_offset == parameter(embedding_name()).offset;
      slots.push_back({l->weight_offset, plan.out_features, plan.in_features, &l->copy, &l->exec,
                       l->bias_offset, plan.name, tied});
    }
  }
  return slots;
}

std::optional<Model::TokenRowGradient> Decoder::token_row_gradient() const {
  // GPT-2's table is also its head (and wpe's rows are positions); an untied Llama's embedding gradient is
  // zeroed by zero_grad and written by embedding_backward alone, in the rows of the tokens.
  if (config_.tied_head()) return std::nullopt;
  const ParameterInfo& table = parameter(embedding_name());
  if (table.grad_type != Dtype::f32) return std::nullopt;
  return TokenRowGradient{.offset = table.grad_offset, .rows = table.shape[0], .cols = table.shape[1]};
}

void Decoder::zero_grad() {
  backend_.fill_zero_ranges(grads_->floats(), zeroed_by_zero_grad_);
  for (const auto& l : linears_) l->weight_gradient_written = false;
}

float* Decoder::grads() {
  for (const auto& l : linears_) {
    if (l->weight_gradient_written) continue;
    // A bf16 gradient's slice is whole 16-byte words (plan_parameter_gradients).
    const int64_t floats = l->weight_grad_type == Dtype::f32 ? l->weight_count : (l->weight_count + 1) / 2;
    backend_.fill_zero(static_cast<float*>(l->weight_grad), floats);
    l->weight_gradient_written = true;
  }
  return grads_->floats();
}

void* Decoder::grads_bf16() {
  grads();
  return grads_bf16_ ? grads_bf16_->data() : nullptr;
}

const void* Decoder::gradient(const ParameterInfo& p) {
  if (p.grad_type == Dtype::f32) return grads() + p.grad_offset;
  return static_cast<const uint16_t*>(grads_bf16()) + p.grad_offset;
}

double Decoder::gradient_sum_of_squares() {
  double sum = backend_.sum_of_squares(ConstTensorView(grads(), {grad_f32_count_}));
  // The bf16 slices' padding stays zero: buffers start zero-filled, and nothing writes past a gradient.
  if (grads_bf16_)
    sum += backend_.sum_of_squares(ConstTensorView(grads_bf16(), Dtype::bf16, {grad_bf16_count_}));
  return sum;
}

bool Decoder::gradient_finite(const ParameterInfo& p) {
  if (p.grad_type == Dtype::f32) return backend_.all_finite(grads() + p.grad_offset, p.count);
  // A float64 sum of float32 squares is finite exactly when every value is.
  return std::isfinite(backend_.sum_of_squares(ConstTensorView(gradient(p), p.grad_type, {p.count})));
}

}  // namespace octet
