// The decoder's activation plan: what the forward keeps for the backward in one planned buffer, sized for the
// largest micro-batch, in the types the backend stores them in; the gradient buffers every layer's backward
// reuses; and the recompute choices (train.activation_checkpointing, fp8.recompute_mlp, _qkv, _residual,
// _weight_transposes) with the memory they save.
#include "octet/model/decoder.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "decoder_internal.h"
#include "octet/check.h"
#include "octet/numerics/format.h"

namespace octet {

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

}  // namespace

void Decoder::plan_activations() {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels, NH = config_.heads;
  const int64_t Vp = config_.padded_vocab(), H = config_.hidden(), W = config_.qkv_width();
  const int64_t FC = activation_inputs(activation_kind()) * H;
  const bool mean = norm_kind() == Normalization::layernorm;  // RMSNorm keeps rstd only
  // The input of a linear layer, unless its FP8 cast is all that the layer reads.
  auto read = [&](std::string_view consumer) { return !input_cast_suffices(linear(consumer).exec); };
  auto input_type = [&](std::string_view consumer) { return linear(consumer).input_type; };
  // q, k, v in bf16 where the backend's attention rounds them to bf16 anyway.
  qkv_type_ = backend_.storage_type({StorageRole::attention_input, C, NH, nullptr, config_.kv()});
  // Its output, and the gradients on either side of it, in bf16 where the backend's attention reads and
  // writes them in bf16 anyway.
  atty_type_ = backend_.storage_type({StorageRole::attention_output, C, NH, nullptr, config_.kv()});
  hidden_in_bf16_ = policy_.mode() == MixedPrecision::bf16 || policy_.mode() == MixedPrecision::fp8;
  hidden_type_ = hidden_in_bf16_ ? backend_.storage_type({StorageRole::rounded_activation}) : Dtype::f32;

  // What block l's forward writes for its backward, each of a layer's inputs as that layer stores it.
  struct Kept {
    bool ln1, qkv, residual2, ln2, fch, fch_gelu;
    Dtype ln1_type, ln2_type, fch_gelu_type;
  };
  auto kept = [&](int64_t l) {
    const BlockNames b = block_names(l);
    if (config_.moe()) {
      // The second normalization's output in float32, read by the router, the experts' gather and the
      // shared expert; the shared expert's tensors as the dense MLP's.
      const bool shared = config_.shared_expert;
      return Kept{read(b.qkv),
                  !recomputes(b.qkv),
                  !recomputes(b.proj),
                  true,
                  shared && !recomputes(b.fc),
                  shared && read(b.fc_proj),
                  input_type(b.qkv),
                  Dtype::f32,
                  shared ? input_type(b.fc_proj) : Dtype::f32};
    }
    return Kept{read(b.qkv),       !recomputes(b.qkv), !recomputes(b.proj),
                read(b.fc),        !recomputes(b.fc),  read(b.fc_proj),
                input_type(b.qkv), input_type(b.fc),   input_type(b.fc_proj)};
  };
  // The slices of one block's activations but residual3; under "selective" without the three inputs.
  auto take_block = [&](Planner& p, Activations::Layer& x, const Kept& k, bool inputs) {
    if (inputs && k.ln1) p.take(x.ln1, k.ln1_type, N * C);
    if (mean) p.take(x.ln1_mean, N);
    p.take(x.ln1_rstd, N);
    if (k.qkv) p.take(x.qkv, qkv_type_, N * W);
    p.take(x.atty, atty_type_, N * C);
    p.take(x.att_lse, N * NH);
    if (k.residual2) p.take(x.residual2, N * C);
    if (inputs && k.ln2) p.take(x.ln2, k.ln2_type, N * C);
    if (mean) p.take(x.ln2_mean, N);
    p.take(x.ln2_rstd, N);
    if (k.fch) p.take(x.fch, hidden_type_, N * FC);
    if (inputs && k.fch_gelu) p.take(x.fch_gelu, k.fch_gelu_type, N * H);
  };
  // A mixture-of-experts block's routing and experts' tensors (decoder_internal.h), the experts' rows in bf16
  // where every GEMM that reads them is BF16.
  auto experts_bf16 = [&](LinearRole role, bool reads_input) {
    bool all = config_.moe();
    for (const auto& l : linears_) {
      if (l->role != role) continue;
      const GemmMode first = reads_input ? l->exec.forward : l->exec.input_gradient;
      all &= first == GemmMode::bf16 && l->exec.weight_gradient == GemmMode::bf16;
    }
    return all ? backend_.storage_type({StorageRole::rounded_activation}) : Dtype::f32;
  };
  expert_input_type_ = experts_bf16(LinearRole::expert_fc, true);
  expert_act_type_ = experts_bf16(LinearRole::expert_fc_proj, true);
  expert_dout_type_ = experts_bf16(LinearRole::expert_fc_proj, false);
  expert_fch_gradient_type_ = hidden_in_bf16_ ? experts_bf16(LinearRole::expert_fc, false) : Dtype::f32;
  const int64_t E = config_.experts, top_k = config_.experts_per_token;
  const int64_t M = config_.moe() ? grouped_rows(N, top_k, E, kExpertRowAlign) : 0;
  // The experts' gathered inputs and SwiGLU outputs, unless each expert's FP8 cast of them is all that expert
  // reads (the gather and SwiGLU then write only the casts; keep_input_of makes them for an expert that
  // moves to BF16).
  const bool dispatched_read = experts_read(LinearRole::expert_fc, TensorRole::activation);
  const bool act_read = experts_read(LinearRole::expert_fc_proj, TensorRole::activation);
  auto take_moe = [&](Planner& p, Activations::Moe& m) {
    p.take(m.probs, N * E);
    p.take(reinterpret_cast<void*&>(m.experts), Dtype::f32, N * top_k);
    p.take(m.weights, N * top_k);
    p.take(reinterpret_cast<void*&>(m.slots), Dtype::f32, M);
    p.take(reinterpret_cast<void*&>(m.positions), Dtype::f32, N * top_k);
    p.take(reinterpret_cast<void*&>(m.offsets), Dtype::f32, E + 1);
    if (dispatched_read) p.take(m.dispatched, expert_input_type_, M * C);
    p.take(m.fch, hidden_type_, M * 2 * H);
    if (act_read) p.take(m.act, expert_act_type_, M * H);
    p.take(m.out, M * C);
  };
  auto lay_out = [&](Activations& a, Planner& p, ActivationCheckpointing level) {
    a.layers.resize(static_cast<size_t>(config_.layers));
    if (config_.moe()) {
      // Under "full" one set for every block, which each block's forward writes again before its backward.
      a.moe.resize(static_cast<size_t>(config_.layers));
      for (int64_t l = 0; l < config_.layers; ++l) {
        if (level != ActivationCheckpointing::full || l == 0) take_moe(p, a.moe[static_cast<size_t>(l)]);
      }
      p.take(a.router_logits, N * E);
      p.take(a.probability_sums, E);
    }
    p.take(a.encoded, N * C);
    Kept all{};  // what some block keeps: the shared set holds it, in float32 where the types differ
    for (int64_t l = 0; l < config_.layers; ++l) {
      const Kept k = kept(l);
      Activations::Layer& x = a.layers[static_cast<size_t>(l)];
      if (level != ActivationCheckpointing::full) take_block(p, x, k, level == ActivationCheckpointing::none);
      p.take(x.residual3, N * C);
      auto either = [&](Dtype kept_type, Dtype type, bool first) {
        return first || kept_type == type ? type : Dtype::f32;
      };
      all.ln1_type = either(all.ln1_type, k.ln1_type, l == 0);
      all.ln2_type = either(all.ln2_type, k.ln2_type, l == 0);
      all.fch_gelu_type = either(all.fch_gelu_type, k.fch_gelu_type, l == 0);
      all.ln1 |= k.ln1;
      all.qkv |= k.qkv;
      all.residual2 |= k.residual2;
      all.ln2 |= k.ln2;
      all.fch |= k.fch;
      all.fch_gelu |= k.fch_gelu;
    }
    if (level == ActivationCheckpointing::full) take_block(p, a.shared, all, true);
    if (level == ActivationCheckpointing::selective && (all.ln1 || all.ln2 || all.fch_gelu)) {
      p.take(a.block_input, Dtype::f32, N * std::max(C, H));
    }
    if (recomputed_layers(LinearRole::fc) > 0) p.take(a.fch_scratch, hidden_type_, N * FC);
    if (recomputed_layers(LinearRole::qkv) > 0) p.take(a.qkv_scratch, qkv_type_, N * W);
    if (recomputed_layers(LinearRole::proj) > 0) p.take(a.residual2_scratch, N * C);
    if (read("lm_head")) p.take(a.lnf, input_type("lm_head"), N * C);
    if (mean) p.take(a.lnf_mean, N);
    p.take(a.lnf_rstd, N);
    p.take(a.logits_chunk, head_chunk_rows(N) * Vp);
    p.take(a.losses, N);
  };

  const ActivationCheckpointing level = checkpointing();
  Activations unchecked;
  Planner without;
  lay_out(unchecked, without, ActivationCheckpointing::none);
  unchecked_activation_bytes_ = without.size() * int64_t{4};
  acts_ = std::make_unique<Activations>();
  Activations& a = *acts_;
  Planner p;
  lay_out(a, p, level);
  activation_bytes_ = p.size() * int64_t{4};
  activations_ = backend_.allocate(static_cast<size_t>(activation_bytes_));
  p.bind(activations_->floats());
  for (Activations::Moe& m : a.moe) {
    if (m.probs == nullptr) m = a.moe.front();
  }
  expert_offsets_.assign(static_cast<size_t>(config_.layers), std::vector<int64_t>(static_cast<size_t>(E + 1)));
  expert_counts_.assign(static_cast<size_t>(config_.layers), std::vector<int64_t>(static_cast<size_t>(E)));
  layer_balance_.assign(static_cast<size_t>(config_.layers), 0.0);
  // Every block's slots into the shared ones, where that block keeps the tensor.
  for (int64_t l = 0; l < config_.layers; ++l) {
    const Kept k = kept(l);
    Activations::Layer& x = a.layers[static_cast<size_t>(l)];
    if (level == ActivationCheckpointing::selective) {
      x.ln1 = k.ln1 ? a.block_input : nullptr;
      x.ln2 = k.ln2 ? a.block_input : nullptr;
      x.fch_gelu = k.fch_gelu ? a.block_input : nullptr;
    } else if (level == ActivationCheckpointing::full) {
      const Activations::Layer& s = a.shared;
      float* residual3 = x.residual3;
      x = s;
      x.residual3 = residual3;
      if (!k.ln1) x.ln1 = nullptr;
      if (!k.qkv) x.qkv = nullptr;
      if (!k.residual2) x.residual2 = nullptr;
      if (!k.ln2) x.ln2 = nullptr;
      if (!k.fch) x.fch = nullptr;
      if (!k.fch_gelu) x.fch_gelu = nullptr;
    }
  }

  plan_gradients();
}

void Decoder::plan_gradients() {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels, H = config_.hidden();
  const int64_t FC = activation_inputs(activation_kind()) * H;
  bool dfch_written = false;
  for (int64_t l = 0; l < config_.layers && config_.dense_mlp(); ++l) {
    dfch_written |= !gradient_cast_suffices(linear(block_names(l).fc).exec);
  }
  const int64_t wide_a = std::max(H, config_.qkv_width());
  const int64_t wide_b = dfch_written ? std::max(FC, C) : C;
  // The experts' output gradients in float32, unless each expert's FP8 casts of them are all it reads.
  const std::pair<bool, bool> expert_rows{experts_read(LinearRole::expert_fc_proj, TensorRole::gradient),
                                          experts_read(LinearRole::expert_fc, TensorRole::gradient)};
  if (gradient_scratch_ != nullptr && wide_b == gradient_wide_b_ && expert_rows == gradient_expert_rows_) return;
  gradient_scratch_.reset();  // freed before the new plan is allocated
  dacts_ = std::make_unique<Gradients>();
  Planner q;
  q.take(dacts_->residual, N * C);
  q.take(dacts_->ln, N * C);
  q.take(dacts_->wide_a, N * wide_a);
  q.take(dacts_->wide_b, N * wide_b);
  if (config_.moe()) {
    const int64_t E = config_.experts, k = config_.experts_per_token;
    const int64_t M = grouped_rows(N, k, E, kExpertRowAlign);
    if (expert_rows.first) q.take(dacts_->rows_dout, expert_dout_type_, M * C);
    q.take(dacts_->rows_c, M * C);
    q.take(dacts_->rows_f, hidden_type_, M * H);
    if (expert_rows.second) q.take(dacts_->rows_2f, Dtype::f32, M * 2 * H);
    q.take(dacts_->dweights, N * k);
    q.take(dacts_->dlogits, N * E);
    q.take(dacts_->dprobs, E);
    if (config_.shared_expert) q.take(dacts_->dln, N * C);
  }
  gradient_scratch_ = backend_.allocate(static_cast<size_t>(q.size()) * sizeof(float));
  q.bind(gradient_scratch_->floats());
  gradient_wide_b_ = wide_b;
  gradient_expert_rows_ = expert_rows;
}

bool Decoder::experts_read(LinearRole role, TensorRole operand) const {
  for (const auto& l : linears_) {
    if (l->role != role) continue;
    if (operand == TensorRole::activation ? !input_cast_suffices(l->exec) : !gradient_cast_suffices(l->exec)) {
      return true;
    }
  }
  return false;
}

void Decoder::keep_input_of(std::string_view layer) {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels, H = config_.hidden();
  // In float32: a layer that moves to BF16 was planned FP8, with input_type f32.
  auto keep = [&](auto*& slot, int64_t floats) {
    if (slot != nullptr) return;
    late_inputs_.push_back(backend_.allocate(static_cast<size_t>(floats) * sizeof(float)));
    slot = late_inputs_.back()->floats();
  };
  if (layer == "lm_head") return keep(acts_->lnf, N * C);
  for (int64_t l = 0; l < config_.layers; ++l) {
    const BlockNames b = block_names(l);
    Activations::Layer& x = acts_->layers[static_cast<size_t>(l)];
    if (layer == b.qkv) return keep(x.ln1, N * C);
    if (layer == b.fc) return keep(x.ln2, N * C);
    if (layer == b.fc_proj) return keep(x.fch_gelu, N * H);
    if (config_.moe() && layer.starts_with(b.experts)) {
      // An expert's rows: the block's gathered inputs or SwiGLU outputs, for every expert of the block
      // (grouped_rows of them), in float32 (the experts' rows of a block with an FP8 expert).
      const int64_t rows = grouped_rows(N, config_.experts_per_token, config_.experts, kExpertRowAlign);
      Activations::Moe& m = acts_->moe[static_cast<size_t>(l)];
      const bool up = linear(layer).role == LinearRole::expert_fc;
      return keep(up ? m.dispatched : m.act, rows * (up ? C : H));
    }
  }
}

bool Decoder::recomputes(std::string_view layer) {
  return linear(layer).exec.keep_input_codes;
}

int64_t Decoder::recomputed_layers(LinearRole role) {
  int64_t count = 0;
  for (const auto& l : linears_) count += l->role == role && l->exec.keep_input_codes ? 1 : 0;
  return count;
}

void Decoder::keep_output_of(std::string_view layer) {
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels;
  const int64_t FC = activation_inputs(activation_kind()) * config_.hidden();
  auto keep = [&](void*& slot, Dtype type, int64_t width) {
    if (slot != nullptr) return;
    late_inputs_.push_back(
        backend_.allocate(static_cast<size_t>(N * width * dtype_info(type).storage_bits / 8)));
    slot = late_inputs_.back()->data();
  };
  for (int64_t l = 0; l < config_.layers; ++l) {
    const BlockNames b = block_names(l);
    Activations::Layer& x = acts_->layers[static_cast<size_t>(l)];
    if (layer == b.fc) return keep(x.fch, hidden_type_, FC);
    if (layer == b.qkv) return keep(x.qkv, qkv_type_, config_.qkv_width());
    if (layer == b.proj) {
      void* residual2 = x.residual2;
      keep(residual2, Dtype::f32, C);
      x.residual2 = static_cast<float*>(residual2);
      return;
    }
  }
}

std::string Decoder::memory_line() {
  const PrecisionSettings& s = policy_.settings();
  const int64_t N = max_batch_ * max_seq_len_, C = config_.channels;
  const int64_t FC = activation_inputs(activation_kind()) * config_.hidden();
  struct Kind {
    bool on;
    const char* key;
    LinearRole role;
    std::string layer;  // the layer's name within its block
    std::string output;
    int64_t output_bytes;  // per layer, [N, width] in its stored type
  };
  const int64_t bytes_of[] = {dtype_info(hidden_type_).storage_bits / 8,
                              dtype_info(qkv_type_).storage_bits / 8};
  const BlockNames b = block_names(0);
  auto in_block = [](const std::string& name) { return name.substr(name.find('.', name.find('.') + 1) + 1); };
  const std::string activation = activation_kind() == Activation::gelu ? "GELU" : "SwiGLU";
  const Kind kinds[] = {
      {s.recompute_mlp, "fp8.recompute_mlp", LinearRole::fc, in_block(b.fc), "output (" + activation + "'s input)",
       bytes_of[0] * N * FC},
      {s.recompute_qkv, "fp8.recompute_qkv", LinearRole::qkv, in_block(b.qkv), "output (q, k, v)",
       bytes_of[1] * N * config_.qkv_width()},
      {s.recompute_residual, "fp8.recompute_residual", LinearRole::proj, in_block(b.proj),
       "output (the residual stream, " + in_block(b.norm2) + "'s input)", int64_t{4} * N * C},
  };
  std::string line;
  const ActivationCheckpointing level = checkpointing();
  if (level != ActivationCheckpointing::none) {
    const char* what =
        level == ActivationCheckpointing::full
            ? "each block keeps only its input (the residual stream) and runs its forward again "
              "before its backward"
            : "the blocks keep no normalization or activation outputs (the GEMMs' inputs) and "
              "make them again in the backward";
    constexpr double kMiB = 1024.0 * 1024.0;
    line = fmt::format(
        "train.activation_checkpointing = {}: {}: activations {:.1f} MiB instead of {:.1f} MiB ({:.1f} MiB "
        "fewer)",
        activation_checkpointing_name(level), what, static_cast<double>(activation_bytes_) / kMiB,
        static_cast<double>(unchecked_activation_bytes_) / kMiB,
        static_cast<double>(unchecked_activation_bytes_ - activation_bytes_) / kMiB);
  }
  for (const Kind& k : kinds) {
    if (!k.on) continue;
    // Per layer: the output not kept, the codes of the input [N, C] kept; one output-sized buffer shared
    // by the layers that recompute.
    const int64_t recomputed = recomputed_layers(k.role);
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

int64_t Decoder::head_chunk_rows(int64_t N) {
  return linear("lm_head").plan->fp8() ? N : std::min(N, kHeadChunkRows);
}

}  // namespace octet
