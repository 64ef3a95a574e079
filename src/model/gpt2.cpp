// GPT-2 forward and backward, by hand, against the backend interface (see gpt2.h). The structure follows
// llm.c's train_gpt2.c: named parameter tensors in one buffer, activations in one planned buffer, and a
// backward that walks the layers in reverse, accumulating the residual stream's gradient in one running
// buffer.
#include "octet/model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/numerics/format.h"
#include "octet/numerics/random.h"

namespace octet {

// Pointers into the activation buffer, sized for the largest micro-batch N = max_batch * max_seq_len: what
// the backward reads, and the few things the forward passes from one op to the next. The input of a linear
// layer (ln1, ln2, fch_gelu, lnf) is stored as that layer's input_type, and is null while its FP8 cast is
// all the layer reads (input_cast_suffices); keep_input_of allocates it, in float32, when the layer moves
// to BF16.
struct Gpt2::Activations {
  struct Layer {
    void* ln1 = nullptr;        // [N, C]
    float* ln1_mean = nullptr;  // [N]
    float* ln1_rstd = nullptr;  // [N]
    void* qkv = nullptr;  // [N, 3C] in qkv_type_ (Backend::storage_type, StorageRole::attention_input); null
                          // where the backward recomputes it (fp8.recompute_qkv)
    void* atty = nullptr;      // [N, C] in atty_type_ (Backend::storage_type, StorageRole::attention_output)
    float* att_lse = nullptr;  // [N, NH]
    float* residual2 = nullptr;  // null where the backward recomputes it (fp8.recompute_residual)
    void* ln2 = nullptr;
    float* ln2_mean = nullptr;
    float* ln2_rstd = nullptr;
    void* fch = nullptr;       // [N, 4C] in hidden_type_; null where the backward recomputes it
                               // (fp8.recompute_mlp)
    void* fch_gelu = nullptr;  // [N, 4C]
    float* residual3 = nullptr;
  };
  float* encoded = nullptr;
  std::vector<Layer> layers;
  // [N, 4C] in hidden_type_: the mlp.c_fc output of a layer that does not keep it (fp8.recompute_mlp), from
  // its GEMM to the GELU that reads it, in the forward and again in the backward. One buffer for every such
  // layer.
  void* fch_scratch = nullptr;
  // The same for the outputs of attn.c_attn (q, k, v) and attn.c_proj (the residual stream after attention)
  // where fp8.recompute_qkv and fp8.recompute_residual leave them out.
  void* qkv_scratch = nullptr;         // [N, 3C] in qkv_type_
  float* residual2_scratch = nullptr;  // [N, C]
  float* lnf = nullptr;
  float* lnf_mean = nullptr;
  float* lnf_rstd = nullptr;
  float* logits_chunk = nullptr;  // [head chunk rows, Vp]: a chunk's logits, then their gradient
  float* losses = nullptr;        // [N]
};

// Gradient buffers that every layer's backward reuses, each [N, width]. In layer l's backward:
// residual holds d(residual3), which mlp.c_proj reads; ln_2's backward adds into it, making it d(residual2),
// which attn.c_proj reads; ln_1's backward adds into it, making it d(residual3) of layer l-1 (d(encoded)
// after layer 0). The others hold one gradient each between its producer and its consumer:
//   wide_a [N, 4C]: d(fch_gelu) (mlp.c_proj -> GELU, in hidden_type_), then d(qkv) (attention ->
//                   attn.c_attn, in atty_type_)
//   wide_b [N, 4C]: d(fch) (GELU -> mlp.c_fc), then d(atty) (attn.c_proj -> attention, in atty_type_);
//                   [N, C] while d(fch) is not written, its FP8 cast being all that every mlp.c_fc reads
//                   (gradient_cast_suffices)
//   ln     [N, C]:  d(lnf) (lm_head -> ln_f), d(ln2) (mlp.c_fc -> ln_2), d(ln1) (attn.c_attn -> ln_1)
struct Gpt2::Gradients {
  float* residual = nullptr;
  float* ln = nullptr;
  float* wide_a = nullptr;
  float* wide_b = nullptr;
};

struct Gpt2::Linear {
  const LinearPlan* plan;
  int64_t weight_offset;
  int64_t bias_offset;  // -1: no bias
  Fp8LinearState state;
  Fp8LinearTelemetry telemetry;
  LinearExecution exec;
  std::unique_ptr<WeightCopy> copy;
  // How the model stores the input that LayerNorm or GELU writes for this layer (attn.c_attn, mlp.c_fc,
  // mlp.c_proj; Activations): Backend::storage_type where the plan runs both GEMMs that read it, the
  // forward and the weight gradient, in BF16, which round it to bf16 anyway, so that storing it rounded
  // changes no result; f32 otherwise, and for the LM head, whose chunked ops read float32 (attn.c_proj's
  // input is attention's output, stored as atty_type_). It stays so when the layer moves to BF16.
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

namespace {

// Lays out slices of one buffer: take() reserves a slice for a pointer, bind() points them all into the
// allocated buffer.
class Planner {
 public:
  void take(float*& slot, int64_t count) {
    slots_.emplace_back(&slot, next_);
    next_ += (count + 15) / 16 * 16;  // 64-byte aligned slices
  }
  // `count` elements of a 32- or 16-bit type.
  void take(void*& slot, Dtype type, int64_t count) {
    OCTET_CHECK(type == Dtype::f32 || type == Dtype::bf16, "activations in f32 or bf16, got {}",
                dtype_name(type));
    untyped_slots_.emplace_back(&slot, next_);
    const int64_t floats = type == Dtype::f32 ? count : (count + 1) / 2;
    next_ += (floats + 15) / 16 * 16;
  }
  int64_t size() const { return next_; }
  void bind(float* base) const {
    for (const auto& [slot, at] : slots_) *slot = base + at;
    for (const auto& [slot, at] : untyped_slots_) *slot = base + at;
  }

 private:
  std::vector<std::pair<float**, int64_t>> slots_;
  std::vector<std::pair<void**, int64_t>> untyped_slots_;
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

  for (const LinearPlan& plan : policy_.layers()) {
    auto linear = std::make_unique<Linear>();
    linear->plan = &plan;
    if (plan.name == "lm_head") {
      linear->weight_offset = parameter("wte").offset;  // tied to the token embedding
      linear->weight_count = parameter("wte").count;
      linear->bias_offset = -1;
    } else {
      linear->weight_offset = parameter(plan.name + ".weight").offset;
      linear->weight_count = parameter(plan.name + ".weight").count;
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
    // fp8.recompute_mlp, _qkv and _residual: the backward runs this forward GEMM again on its kept input
    // codes.
    const PrecisionSettings& settings = policy_.settings();
    const bool recomputed = (settings.recompute_mlp && ends_with(plan.name, ".mlp.c_fc")) ||
                            (settings.recompute_qkv && ends_with(plan.name, ".attn.c_attn")) ||
                            (settings.recompute_residual && ends_with(plan.name, ".attn.c_proj"));
    e.keep_input_codes = recomputed && input_cast_suffices(e);
    e.transpose_weight_per_use = settings.recompute_weight_transposes && e.input_gradient == GemmMode::fp8 &&
                                 e.recipe != nullptr &&
                                 e.recipe->granularity(TensorRole::weight) == ScaleGranularity::per_tensor;
    const bool fed_by_norm_or_gelu = ends_with(plan.name, "attn.c_attn") ||
                                     ends_with(plan.name, "mlp.c_fc") || ends_with(plan.name, "mlp.c_proj");
    if (fed_by_norm_or_gelu && e.forward == GemmMode::bf16 && e.weight_gradient == GemmMode::bf16) {
      linear->input_type = backend_.storage_type({StorageRole::rounded_activation});
    }
    e.fp8_gemms = &counters_.fp8_gemms;
    e.other_gemms = &counters_.other_gemms;
    e.saturated = &counters_.saturated;
    e.underflowed = &counters_.underflowed;
    linears_.push_back(std::move(linear));
  }
  plan_parameter_gradients();
}

void Gpt2::plan_parameter_gradients() {
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
    auto it = std::find_if(parameters_.begin(), parameters_.end(),
                           [&](const ParameterInfo& p) { return p.offset == l->weight_offset; });
    OCTET_CHECK(it != parameters_.end(), "the weight of {} is a parameter", l->plan->name);
    it->grad_type = type;
  }
  // The float32 gradients in the parameters' order, the bf16 ones in theirs (16-byte aligned slices).
  for (ParameterInfo& p : parameters_) {
    if (p.grad_type == Dtype::f32) {
      p.grad_offset = grad_f32_count_;
      grad_f32_count_ += p.count;
    } else {
      p.grad_offset = grad_bf16_count_;
      grad_bf16_count_ += (p.count + 7) / 8 * 8;
    }
  }
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

void Gpt2::plan_activations() {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels, NH = config_.heads;
  const int64_t Vp = config_.padded_vocab();
  // The input of a linear layer, unless its FP8 cast is all that the layer reads.
  auto read = [&](std::string_view consumer) { return !input_cast_suffices(linear(consumer).exec); };
  auto input_type = [&](std::string_view consumer) { return linear(consumer).input_type; };
  // q, k, v in bf16 where the backend's attention rounds them to bf16 anyway.
  qkv_type_ = backend_.storage_type({StorageRole::attention_input, C, NH});
  // Its output, and the gradients on either side of it, in bf16 where the backend's attention reads and
  // writes them in bf16 anyway.
  atty_type_ = backend_.storage_type({StorageRole::attention_output, C, NH});
  hidden_in_bf16_ = policy_.mode() == MixedPrecision::bf16 || policy_.mode() == MixedPrecision::fp8;
  hidden_type_ = hidden_in_bf16_ ? backend_.storage_type({StorageRole::rounded_activation}) : Dtype::f32;
  acts_ = std::make_unique<Activations>();
  Activations& a = *acts_;
  a.layers.resize(static_cast<size_t>(config_.layers));
  Planner p;
  p.take(a.encoded, N * C);
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    Activations::Layer& x = a.layers[static_cast<size_t>(l)];
    if (read(h + "attn.c_attn")) p.take(x.ln1, input_type(h + "attn.c_attn"), N * C);
    p.take(x.ln1_mean, N);
    p.take(x.ln1_rstd, N);
    if (!recomputes(h + "attn.c_attn")) p.take(x.qkv, qkv_type_, N * 3 * C);
    p.take(x.atty, atty_type_, N * C);
    p.take(x.att_lse, N * NH);
    if (!recomputes(h + "attn.c_proj")) p.take(x.residual2, N * C);
    if (read(h + "mlp.c_fc")) p.take(x.ln2, input_type(h + "mlp.c_fc"), N * C);
    p.take(x.ln2_mean, N);
    p.take(x.ln2_rstd, N);
    if (!recomputes(h + "mlp.c_fc")) p.take(x.fch, hidden_type_, N * 4 * C);
    if (read(h + "mlp.c_proj")) p.take(x.fch_gelu, input_type(h + "mlp.c_proj"), N * 4 * C);
    p.take(x.residual3, N * C);
  }
  if (recomputed_layers("mlp.c_fc") > 0) p.take(a.fch_scratch, hidden_type_, N * 4 * C);
  if (recomputed_layers("attn.c_attn") > 0) p.take(a.qkv_scratch, qkv_type_, N * 3 * C);
  if (recomputed_layers("attn.c_proj") > 0) p.take(a.residual2_scratch, N * C);
  if (read("lm_head")) p.take(a.lnf, N * C);
  p.take(a.lnf_mean, N);
  p.take(a.lnf_rstd, N);
  p.take(a.logits_chunk, head_chunk_rows(N) * Vp);
  p.take(a.losses, N);
  activations_ = backend_.allocate(static_cast<size_t>(p.size()) * sizeof(float));
  p.bind(activations_->floats());

  plan_gradients();
}

void Gpt2::plan_gradients() {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels;
  bool dfch_written = false;
  for (int64_t l = 0; l < config_.layers; ++l) {
    dfch_written |= !gradient_cast_suffices(linear(fmt::format("h.{}.mlp.c_fc", l)).exec);
  }
  const int64_t wide_b = dfch_written ? 4 * C : C;
  if (gradient_scratch_ != nullptr && wide_b == gradient_wide_b_) return;
  gradient_scratch_.reset();  // freed before the new plan is allocated
  dacts_ = std::make_unique<Gradients>();
  Planner q;
  q.take(dacts_->residual, N * C);
  q.take(dacts_->ln, N * C);
  q.take(dacts_->wide_a, N * 4 * C);
  q.take(dacts_->wide_b, N * wide_b);
  gradient_scratch_ = backend_.allocate(static_cast<size_t>(q.size()) * sizeof(float));
  q.bind(gradient_scratch_->floats());
  gradient_wide_b_ = wide_b;
}

void Gpt2::keep_input_of(std::string_view layer) {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels;
  // In float32: a layer that moves to BF16 was planned FP8, with input_type f32.
  auto keep = [&](auto*& slot, int64_t width) {
    if (slot != nullptr) return;
    late_inputs_.push_back(backend_.allocate(static_cast<size_t>(N * width) * sizeof(float)));
    slot = late_inputs_.back()->floats();
  };
  if (layer == "lm_head") return keep(acts_->lnf, C);
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    Activations::Layer& x = acts_->layers[static_cast<size_t>(l)];
    if (layer == h + "attn.c_attn") return keep(x.ln1, C);
    if (layer == h + "mlp.c_fc") return keep(x.ln2, C);
    if (layer == h + "mlp.c_proj") return keep(x.fch_gelu, 4 * C);
  }
}

bool Gpt2::recomputes(std::string_view layer) {
  return linear(layer).exec.keep_input_codes;
}

int64_t Gpt2::recomputed_layers(std::string_view kind) {
  int64_t count = 0;
  for (int64_t l = 0; l < config_.layers; ++l) count += recomputes(fmt::format("h.{}.{}", l, kind)) ? 1 : 0;
  return count;
}

void Gpt2::keep_output_of(std::string_view layer) {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels;
  auto keep = [&](void*& slot, Dtype type, int64_t width) {
    if (slot != nullptr) return;
    late_inputs_.push_back(
        backend_.allocate(static_cast<size_t>(N * width * dtype_info(type).storage_bits / 8)));
    slot = late_inputs_.back()->data();
  };
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    Activations::Layer& x = acts_->layers[static_cast<size_t>(l)];
    if (layer == h + "mlp.c_fc") return keep(x.fch, hidden_type_, 4 * C);
    if (layer == h + "attn.c_attn") return keep(x.qkv, qkv_type_, 3 * C);
    if (layer == h + "attn.c_proj") {
      void* residual2 = x.residual2;
      keep(residual2, Dtype::f32, C);
      x.residual2 = static_cast<float*>(residual2);
      return;
    }
  }
}

std::string Gpt2::memory_line() {
  const PrecisionSettings& s = policy_.settings();
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels;
  struct Kind {
    bool on;
    const char* key;
    const char* layer;
    const char* output;
    int64_t output_bytes;  // per layer, [N, width] in its stored type
  };
  const int64_t bytes_of[] = {dtype_info(hidden_type_).storage_bits / 8,
                              dtype_info(qkv_type_).storage_bits / 8};
  const Kind kinds[] = {
      {s.recompute_mlp, "fp8.recompute_mlp", "mlp.c_fc", "output (GELU's input)", bytes_of[0] * N * 4 * C},
      {s.recompute_qkv, "fp8.recompute_qkv", "attn.c_attn", "output (q, k, v)", bytes_of[1] * N * 3 * C},
      {s.recompute_residual, "fp8.recompute_residual", "attn.c_proj",
       "output (the residual stream, ln_2's input)", int64_t{4} * N * C},
  };
  std::string line;
  for (const Kind& k : kinds) {
    if (!k.on) continue;
    // Per layer: the output not kept, the codes of the input [N, C] kept; one output-sized buffer shared
    // by the layers that recompute.
    const int64_t recomputed = recomputed_layers(k.layer);
    const double saved =
        static_cast<double>(recomputed * (k.output_bytes - N * C) - (recomputed > 0 ? k.output_bytes : 0));
    if (!line.empty()) line += "\n";
    line += fmt::format(
        "{}: {} of {} {} layers keep their FP8 input codes instead of their {} and run their forward GEMM "
        "again in the backward ({:.0f} MiB fewer activations){}",
        k.key, recomputed, config_.layers, k.layer, k.output, saved / (1024.0 * 1024.0),
        recomputed == config_.layers ? ""
                                     : "; the others keep their output (recomputing needs the forward and "
                                       "the weight gradient in FP8 with per-tensor scaling)");
  }
  if (s.recompute_weight_transposes) {
    int64_t layers = 0, weights = 0;
    for (const auto& l : linears_) {
      if (!l->exec.transpose_weight_per_use) continue;
      ++layers;
      weights += l->weight_count;
    }
    if (!line.empty()) line += "\n";
    line += fmt::format(
        "fp8.recompute_weight_transposes: {} of {} linear layers keep the FP8 codes of their weight only and "
        "transpose them before each input-gradient GEMM ({:.1f} MiB less where the backend keeps weight "
        "copies, the GPU)",
        layers, linears_.size(), static_cast<double>(weights) / (1024.0 * 1024.0));
  }
  return line;
}

int64_t Gpt2::head_chunk_rows(int64_t N) {
  return linear("lm_head").plan->fp8() ? N : std::min(N, kHeadChunkRows);
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
  OCTET_REQUIRE(pending_ != Pending::head_backward_done,
                "a layer moves to BF16 between steps, not between a forward and its backward");
  Linear& l = linear(layer);
  policy_.move_layer_to_bf16(layer, std::move(reason));
  l.exec.forward = l.exec.input_gradient = l.exec.weight_gradient = GemmMode::bf16;
  if (l.exec.keep_input_codes) keep_output_of(layer);  // the backward reads it: no FP8 forward to rerun
  l.exec.keep_input_codes = false;
  l.exec.transpose_weight_per_use = false;
  l.exec.telemetry = nullptr;
  l.exec.saved_input.reset();
  l.copy.reset();  // an FP8 copy holds no rounded weight: make a fresh one
  backend_.prepare_weight(l.copy, params() + l.weight_offset, l.plan->out_features, l.plan->in_features,
                          l.exec);
  keep_input_of(layer);  // the BF16 GEMMs read the float32 input
  plan_gradients();      // and their float32 output gradient
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
  for (const WeightCopySlot& slot : weight_copy_slots()) {
    backend_.prepare_weight(*slot.copy, params() + slot.offset, slot.rows, slot.cols, *slot.exec);
  }
}

std::vector<Gpt2::WeightCopySlot> Gpt2::weight_copy_slots() {
  std::vector<WeightCopySlot> slots;
  for (auto& l : linears_) {
    const LinearPlan& plan = *l->plan;
    const bool wide = plan.forward != GemmMode::f32 || plan.input_gradient != GemmMode::f32;
    if (wide) {
      slots.push_back(
          {l->weight_offset, plan.out_features, plan.in_features, &l->copy, &l->exec, l->bias_offset});
    }
  }
  return slots;
}

void Gpt2::layernorm_into(Linear& next, void* out, float* mean, float* rstd, const float* inp,
                          const float* weight, const float* bias, int64_t N, int64_t C) {
  OCTET_CHECK(out != nullptr || input_cast_suffices(next.exec), "an input kept for {}", next.plan->name);
  const ConstTensorView x(inp, {N, C});
  if (next.exec.forward != GemmMode::fp8) {
    backend_.normalization_forward(Normalization::layernorm, TensorView(out, next.input_type, {N, C}), mean,
                                   rstd, x, weight, bias, nullptr);
    return;
  }
  OCTET_CHECK(next.input_type == Dtype::f32, "the float32 input of FP8 layer {}", next.plan->name);
  const TensorView kept(input_cast_suffices(next.exec) ? nullptr : out, Dtype::f32, {N, C});
  backend_.normalization_forward(Normalization::layernorm, kept, mean, rstd, x, weight, bias, &next.exec);
}

void Gpt2::gelu_into(Linear& next, void* out, const void* inp, int64_t N, int64_t C) {
  OCTET_CHECK(out != nullptr || input_cast_suffices(next.exec), "an input kept for {}", next.plan->name);
  const ConstTensorView x(inp, hidden_type_, {N, C});
  if (next.exec.forward != GemmMode::fp8) {
    backend_.activation_forward(Activation::gelu, TensorView(out, next.input_type, {N, C}), x, nullptr);
    return;
  }
  OCTET_CHECK(next.input_type == Dtype::f32, "the float32 input of FP8 layer {}", next.plan->name);
  const TensorView kept(input_cast_suffices(next.exec) ? nullptr : out, Dtype::f32, {N, C});
  backend_.activation_forward(Activation::gelu, kept, x, &next.exec);
}

void Gpt2::round_hidden(void* x, int64_t n) {
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

Dtype Gpt2::layernorm_gradient_type(const Linear& consumer) const {
  return rounds_input_gradient(consumer.exec) ? backend_.storage_type({StorageRole::rounded_activation})
                                              : Dtype::f32;
}

void Gpt2::round_layernorm_gradient(const Linear& consumer, Dtype type, float* dinp, int64_t n) {
  if (rounds_input_gradient(consumer.exec) && type == Dtype::f32) {
    backend_.round_in_place(dinp, n, Dtype::bf16);
  }
}

void Gpt2::gelu_backward_into(Linear& next, float* dinp, const void* inp, const void* dout, int64_t N,
                              int64_t C, float* next_dinp, Dtype next_dinp_type, const void* next_inp) {
  const int64_t OC = next.plan->out_features;
  OCTET_CHECK(C == OC, "GELU's width {} is {}'s output width {}", C, next.plan->name, OC);
  float* dbias = next.bias_grad;
  const ConstTensorView x(inp, hidden_type_, {N, C});
  const ConstTensorView dy(dout, hidden_type_, {N, C});
  if (!casts_gradient(next.exec)) {
    // Both GEMMs that read next's output gradient in BF16 (the input and the weight gradient): GELU's
    // backward rounds it to bf16 once, as PyTorch autocast keeps it, and next's bias gradient is summed from
    // the rounded values.
    const bool rounded =
        next.exec.input_gradient == GemmMode::bf16 && next.exec.weight_gradient == GemmMode::bf16;
    const Dtype type = rounded ? backend_.storage_type({StorageRole::rounded_activation}) : Dtype::f32;
    backend_.activation_backward(Activation::gelu, TensorView(dinp, type, {N, C}), x, dy, nullptr, nullptr);
    if (rounded && type == Dtype::f32) backend_.round_in_place(dinp, N * C, Dtype::bf16);
    backward_linear(next, next_dinp, next_dinp_type, dbias, dinp, type, next_inp, next.input_type, N);
    return;
  }
  // The bias gradient is summed by the GELU backward; the float32 gradient is written only where next reads
  // it.
  float* kept = gradient_cast_suffices(next.exec) ? nullptr : dinp;
  backend_.activation_backward(Activation::gelu, TensorView(kept, {N, C}), x, dy, dbias, &next.exec);
  backward_linear(next, next_dinp, next_dinp_type, nullptr, kept, Dtype::f32, next_inp, next.input_type, N);
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
    layernorm_into(qkv, x.ln1, x.ln1_mean, x.ln1_rstd, residual, P(h + "ln_1.weight"), P(h + "ln_1.bias"), N,
                   C);
    const TensorView qkv_out(x.qkv != nullptr ? x.qkv : a.qkv_scratch, qkv_type_, {B, T, 3 * C});
    backend_.linear_forward(qkv_out, ConstTensorView(x.ln1, qkv.input_type, {N, C}), weight_of(qkv),
                            qkv.copy.get(), {.bias = p + qkv.bias_offset}, qkv.exec);
    const TensorView atty(x.atty, atty_type_, {B, T, C});
    backend_.attention_forward(atty, x.att_lse, qkv_out, NH);
    float* residual2 = x.residual2 != nullptr ? x.residual2 : a.residual2_scratch;
    backend_.linear_forward(TensorView(residual2, {N, C}), atty, weight_of(proj), proj.copy.get(),
                            {.bias = p + proj.bias_offset, .residual = residual}, proj.exec);
    layernorm_into(fc, x.ln2, x.ln2_mean, x.ln2_rstd, residual2, P(h + "ln_2.weight"), P(h + "ln_2.bias"), N,
                   C);
    void* fch = x.fch != nullptr ? x.fch : a.fch_scratch;
    backend_.linear_forward(TensorView(fch, hidden_type_, {N, 4 * C}),
                            ConstTensorView(x.ln2, fc.input_type, {N, C}), weight_of(fc), fc.copy.get(),
                            {.bias = p + fc.bias_offset}, fc.exec);
    round_hidden(fch, N * 4 * C);
    gelu_into(fc_proj, x.fch_gelu, fch, N, 4 * C);
    backend_.linear_forward(TensorView(x.residual3, {N, C}),
                            ConstTensorView(x.fch_gelu, fc_proj.input_type, {N, 4 * C}), weight_of(fc_proj),
                            fc_proj.copy.get(), {.bias = p + fc_proj.bias_offset, .residual = residual2},
                            fc_proj.exec);
    residual = x.residual3;
  }
  Linear& head = linear("lm_head");
  layernorm_into(head, a.lnf, a.lnf_mean, a.lnf_rstd, residual, P("ln_f.weight"), P("ln_f.bias"), N, C);
  last_B_ = B;
  last_T_ = T;
  pending_ = Pending::nothing;
  logits_valid_ = false;
}

void Gpt2::forward_logits(const int32_t* tokens, int64_t B, int64_t T) {
  run_forward(tokens, B, T);
  const int64_t N = B * T, Vp = config_.padded_vocab();
  if (!full_logits_) {
    full_logits_ = backend_.allocate(static_cast<size_t>(max_batch_ * max_seq_len_ * Vp) * sizeof(float));
  }
  Linear& head = linear("lm_head");
  backend_.linear_forward(TensorView(full_logits_->floats(), {N, Vp}),
                          ConstTensorView(acts_->lnf, {N, config_.channels}), weight_of(head),
                          head.copy.get(), {}, head.exec);
  logits_valid_ = true;
}

float Gpt2::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, float dloss) {
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

void Gpt2::head_and_loss(int64_t N, float dloss, bool backward, bool recompute) {
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
    const float* lnf = a.lnf != nullptr ? a.lnf + r * C : nullptr;
    if (recompute) {
      // GEMM, loss and the head's backward in one call, so that a backend may keep the logits in the GEMM's
      // output type throughout.
      backend_.lm_head_chunk(a.losses + r, a.logits_chunk, targets + r,
                             backward ? dacts_->ln + r * C : nullptr, dw, lnf, w, head.copy.get(), n, C, V,
                             Vp, backward ? dloss : 0.0f, backward ? backward_exec(head) : head.exec);
      head.exec.other_gemms = nullptr;
      continue;
    }
    backend_.softmax_cross_entropy(a.losses + r, a.logits_chunk, targets + r, n, V, Vp,
                                   backward ? dloss : 0.0f);
    if (backward) {
      // The chunk now holds its logits' gradient.
      backend_.linear_backward(TensorView(dacts_->ln + r * C, {n, C}), TensorView(dw, {Vp, C}), nullptr,
                               ConstTensorView(a.logits_chunk, {n, Vp}), ConstTensorView(lnf, {n, C}),
                               ConstTensorView(w, {Vp, C}), head.copy.get(), backward_exec(head));
    }
    head.exec.other_gemms = nullptr;
  }
}

float Gpt2::mean_loss(int64_t N) {
  std::vector<float> losses(static_cast<size_t>(N));
  backend_.copy_to_host(losses.data(), acts_->losses, losses.size() * sizeof(float));
  double sum = 0.0;
  for (const float l : losses) sum += l;
  return static_cast<float>(sum / static_cast<double>(N));
}

void Gpt2::zero_grad() {
  backend_.fill_zero_ranges(grads_->floats(), zeroed_by_zero_grad_);
  for (const auto& l : linears_) l->weight_gradient_written = false;
}

float* Gpt2::grads() {
  for (const auto& l : linears_) {
    if (l->weight_gradient_written) continue;
    // A bf16 gradient's slice is whole 16-byte words (plan_parameter_gradients).
    const int64_t floats = l->weight_grad_type == Dtype::f32 ? l->weight_count : (l->weight_count + 1) / 2;
    backend_.fill_zero(static_cast<float*>(l->weight_grad), floats);
    l->weight_gradient_written = true;
  }
  return grads_->floats();
}

const void* Gpt2::grads_bf16() {
  grads();
  return grads_bf16_ ? grads_bf16_->data() : nullptr;
}

const void* Gpt2::gradient(const ParameterInfo& p) {
  if (p.grad_type == Dtype::f32) return grads() + p.grad_offset;
  return static_cast<const uint16_t*>(grads_bf16()) + p.grad_offset;
}

double Gpt2::gradient_sum_of_squares() {
  double sum = backend_.sum_of_squares(ConstTensorView(grads(), {grad_f32_count_}));
  // The bf16 slices' padding stays zero: buffers start zero-filled, and nothing writes past a gradient.
  if (grads_bf16_)
    sum += backend_.sum_of_squares(ConstTensorView(grads_bf16(), Dtype::bf16, {grad_bf16_count_}));
  return sum;
}

bool Gpt2::gradient_finite(const ParameterInfo& p) {
  if (p.grad_type == Dtype::f32) return backend_.all_finite(grads() + p.grad_offset, p.count);
  // A float64 sum of float32 squares is finite exactly when every value is.
  return std::isfinite(backend_.sum_of_squares(ConstTensorView(gradient(p), p.grad_type, {p.count})));
}

ConstTensorView Gpt2::weight_of(const Linear& layer) {
  return {params() + layer.weight_offset, {layer.plan->out_features, layer.plan->in_features}};
}

LinearExecution& Gpt2::backward_exec(Linear& layer) {
  layer.exec.accumulate_weight_gradient = layer.weight_gradient_written;
  layer.weight_gradient_written = true;
  return layer.exec;
}

void Gpt2::backward_linear(Linear& layer, void* dinp, Dtype dinp_type, float* dbias, const void* dout,
                           Dtype dout_type, const void* inp, Dtype inp_type, int64_t N) {
  const int64_t OC = layer.plan->out_features, IC = layer.plan->in_features;
  backend_.linear_backward(TensorView(dinp, dinp_type, {N, IC}),
                           TensorView(layer.weight_grad, layer.weight_grad_type, {OC, IC}), dbias,
                           ConstTensorView(dout, dout_type, {N, OC}), ConstTensorView(inp, inp_type, {N, IC}),
                           weight_of(layer), layer.copy.get(), backward_exec(layer));
  if (layer.round_weight_gradient) {
    backend_.round_in_place(static_cast<float*>(layer.weight_grad), layer.weight_count, Dtype::bf16);
  }
}

void Gpt2::backward(float dloss_scale) {
  OCTET_REQUIRE(pending_ != Pending::nothing, "backward needs a forward with targets first");
  const int64_t B = last_B_, T = last_T_, N = B * T, C = config_.channels, NH = config_.heads;
  if (pending_ == Pending::head_backward_done) {
    OCTET_REQUIRE(dloss_scale == head_dloss_,
                  "backward's loss gradient scale ({}) differs from the one the forward's LM head used ({})",
                  dloss_scale, head_dloss_);
  } else {
    // A single chunk's float32 logits are still there; more chunks', or logits a backend kept in BF16 (see
    // Backend::lm_head_chunk), are made again.
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
  const float* last_residual = config_.layers > 0 ? a.layers.back().residual3 : a.encoded;
  backend_.fill_zero(d.residual, N * C);
  backend_.normalization_backward(Normalization::layernorm, d.residual, G("ln_f.weight"), G("ln_f.bias"),
                                  ConstTensorView(d.ln, {N, C}), last_residual, P("ln_f.weight"), a.lnf_mean,
                                  a.lnf_rstd);

  for (int64_t l = config_.layers - 1; l >= 0; --l) {
    const std::string h = fmt::format("h.{}.", l);
    Activations::Layer& x = a.layers[static_cast<size_t>(l)];
    const float* residual = l == 0 ? a.encoded : a.layers[static_cast<size_t>(l - 1)].residual3;
    Linear& qkv = linear(h + "attn.c_attn");
    Linear& proj = linear(h + "attn.c_proj");
    Linear& fc = linear(h + "mlp.c_fc");
    Linear& fc_proj = linear(h + "mlp.c_proj");
    float* dfch_gelu = d.wide_a;
    float* dfch = d.wide_b;
    float* dqkv = d.wide_a;
    float* datty = d.wide_b;

    // d.residual: d(residual3) = d(fcproj), as residual3 = residual2 + fcproj.
    backward_linear(fc_proj, dfch_gelu, hidden_type_, fc_proj.bias_grad, d.residual, Dtype::f32, x.fch_gelu,
                    fc_proj.input_type, N);
    round_hidden(dfch_gelu, N * 4 * C);
    const void* fch = x.fch;
    if (fch ==
        nullptr) {  // not kept (fp8.recompute_mlp): the forward's GEMM again, from its kept input codes
      backend_.linear_recompute(TensorView(a.fch_scratch, hidden_type_, {N, 4 * C}), weight_of(fc),
                                fc.copy.get(), {.bias = p + fc.bias_offset}, fc.exec);
      round_hidden(a.fch_scratch, N * 4 * C);
      fch = a.fch_scratch;
    }
    const Dtype dln2_type = layernorm_gradient_type(fc);
    gelu_backward_into(fc, dfch, fch, dfch_gelu, N, 4 * C, d.ln, dln2_type, x.ln2);
    round_layernorm_gradient(fc, dln2_type, d.ln, N * C);
    const float* residual2 = x.residual2;
    if (residual2 == nullptr) {  // not kept (fp8.recompute_residual): attn.c_proj's forward and add again
      backend_.linear_recompute(TensorView(a.residual2_scratch, {N, C}), weight_of(proj), proj.copy.get(),
                                {.bias = p + proj.bias_offset, .residual = residual}, proj.exec);
      residual2 = a.residual2_scratch;
    }
    backend_.normalization_backward(Normalization::layernorm, d.residual, G(h + "ln_2.weight"),
                                    G(h + "ln_2.bias"), ConstTensorView(d.ln, dln2_type, {N, C}), residual2,
                                    P(h + "ln_2.weight"), x.ln2_mean, x.ln2_rstd);
    // d.residual: d(residual2) = d(attproj), as residual2 = residual + attproj.
    backward_linear(proj, datty, atty_type_, proj.bias_grad, d.residual, Dtype::f32, x.atty, atty_type_, N);
    const void* qkv_in = x.qkv;
    if (qkv_in == nullptr) {  // not kept (fp8.recompute_qkv): attn.c_attn's forward GEMM again
      backend_.linear_recompute(TensorView(a.qkv_scratch, qkv_type_, {N, 3 * C}), weight_of(qkv),
                                qkv.copy.get(), {.bias = p + qkv.bias_offset}, qkv.exec);
      qkv_in = a.qkv_scratch;
    }
    backend_.attention_backward(TensorView(dqkv, atty_type_, {B, T, 3 * C}),
                                ConstTensorView(datty, atty_type_, {B, T, C}),
                                ConstTensorView(qkv_in, qkv_type_, {B, T, 3 * C}),
                                ConstTensorView(x.atty, atty_type_, {B, T, C}), x.att_lse, NH);
    const Dtype dln1_type = layernorm_gradient_type(qkv);
    backward_linear(qkv, d.ln, dln1_type, qkv.bias_grad, dqkv, atty_type_, x.ln1, qkv.input_type, N);
    round_layernorm_gradient(qkv, dln1_type, d.ln, N * C);
    backend_.normalization_backward(Normalization::layernorm, d.residual, G(h + "ln_1.weight"),
                                    G(h + "ln_1.bias"), ConstTensorView(d.ln, dln1_type, {N, C}), residual,
                                    P(h + "ln_1.weight"), x.ln1_mean, x.ln1_rstd);
  }
  backend_.encoder_backward(G("wte"), G("wpe"), d.residual, tokens_->ints(), B, T, C);
}

void Gpt2::set_scaling_updates(bool on) {
  // Evaluation casts leave the telemetry alone too: it describes what training does.
  for (auto& l : linears_) {
    l->exec.update_scaling = on;
    l->exec.telemetry = on && collect_telemetry_ && l->plan->fp8() ? &l->telemetry : nullptr;
  }
}

const float* Gpt2::logits() const {
  OCTET_REQUIRE(logits_valid_,
                "logits() holds the logits of forward_logits only (a forward with targets keeps "
                "none of them)");
  return full_logits_->floats();
}
const float* Gpt2::losses() const {
  return acts_->losses;
}

}  // namespace octet
