// The decoder's mixture-of-experts MLP (Llama's variant, as Mixtral's block), forward and backward, composed
// of the backend's routing ops and its linear ops (see decoder.h):
//
//   ln2 = RMSNorm(residual2)
//   probs = softmax(ln2 x router^T); each token chooses its k most probable experts, weighted by their
//     probabilities renormalized to sum to 1
//   the chosen (token, expert) pairs grouped by expert (each expert's rows starting at a multiple of 16);
//     each expert e runs its SwiGLU MLP on its rows: one GEMM per expert that has rows, gate/up then down
//   residual3 = residual2 + sum over the token's experts of weight x expert output (+ the shared expert's
//     MLP of ln2, where there is one)
//
// Dropless: every expert takes all the tokens that chose it. The router's load-balancing loss per layer,
// router_aux_loss_coef x E x sum_e f_e P_e (f_e = count_e / (N k), P_e = the mean of probs[:, e]), reaches
// the router through P_e only: its gradient is dloss x coef x E x f_e / N for every token's probs[n, e].
#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "decoder_internal.h"
#include "octet/check.h"
#include "octet/model/decoder.h"
#include "octet/numerics/format.h"

namespace octet {

namespace {

// A pointer `rows` rows of `width` elements of `type` past p.
template <typename T>
T* rows_past(T* p, Dtype type, int64_t rows, int64_t width) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + storage_bytes(type, rows * width));
}

// The gate/up and down layers (Layer: the decoder's linear layers) of the experts that have rows this step,
// null for the others, with `at` the experts' row offsets; `up(e)` and `down(e)` find expert e's layers.
template <typename Layer>
struct ExpertLayers {
  std::vector<Layer*> up, down;
  template <typename Test>
  bool any_up(Test test) const {
    return std::any_of(up.begin(), up.end(), [&](const Layer* l) { return l != nullptr && test(l->exec); });
  }
  template <typename Test>
  bool any_down(Test test) const {
    return std::any_of(down.begin(), down.end(),
                       [&](const Layer* l) { return l != nullptr && test(l->exec); });
  }
};
template <typename Up, typename Down>
auto experts_with_rows(const std::vector<int64_t>& at, Up up, Down down) {
  using Layer = std::remove_pointer_t<decltype(up(int64_t{0}))>;
  const size_t E = at.size() - 1;
  ExpertLayers<Layer> layers{std::vector<Layer*>(E, nullptr), std::vector<Layer*>(E, nullptr)};
  for (size_t e = 0; e < E; ++e) {
    if (at[e + 1] == at[e]) continue;
    layers.up[e] = up(static_cast<int64_t>(e));
    layers.down[e] = down(static_cast<int64_t>(e));
  }
  return layers;
}

// The casts of the experts' rows for one of their layers (Backend::RowGroupCasts' targets, one per expert):
// `target(e, layer)` for each expert e with rows, and whether any is given.
struct ExpertCasts {
  std::vector<Fp8CastTarget> targets;
  bool any = false;
};
template <typename Layer, typename Target>
ExpertCasts expert_casts(const std::vector<Layer*>& layers, Target target) {
  ExpertCasts casts{std::vector<Fp8CastTarget>(layers.size()), false};
  for (size_t e = 0; e < layers.size(); ++e) {
    if (layers[e] == nullptr) continue;
    casts.targets[e] = target(e, *layers[e]);
    casts.any |= casts.targets[e].given();
  }
  return casts;
}

// An expert's rows [from, from + rows) of a tensor of `width` columns, or null where the op that would write
// them writes only their FP8 cast (`cast_only`), which is all that the expert's GEMMs read.
void* expert_rows(void* p, Dtype type, int64_t from, int64_t width, bool cast_only) {
  return cast_only ? nullptr : rows_past(p, type, from, width);
}

}  // namespace

std::optional<double> Decoder::router_balance() const {
  if (!config_.moe()) return std::nullopt;
  return std::accumulate(layer_balance_.begin(), layer_balance_.end(), 0.0) /
         static_cast<double>(layer_balance_.size());
}

void Decoder::moe_forward(int64_t l, int64_t B, int64_t T, const float* residual2) {
  const int64_t N = B * T, C = config_.channels, H = config_.hidden();
  const int64_t E = config_.experts, k = config_.experts_per_token;
  const BlockNames b = block_names(l);
  Activations& a = *acts_;
  Activations::Layer& x = a.layers[static_cast<size_t>(l)];
  Activations::Moe& m = a.moe[static_cast<size_t>(l)];
  const float* norm_weight = params() + parameter(b.norm2 + ".weight").offset;

  // The normalization in float32 for the router, the gather and the shared expert. The shared expert's
  // gate/up casts its own input (an FP8 producer's cast would be overwritten by the experts' casts before
  // that GEMM runs, on a backend that shares one buffer for input codes).
  Linear* shared_fc = config_.shared_expert ? &linear(b.fc) : nullptr;
  const ConstTensorView ln2(x.ln2, Dtype::f32, {N, C});
  backend_.normalization_forward(norm_kind(), TensorView(x.ln2, Dtype::f32, {N, C}), x.ln2_mean, x.ln2_rstd,
                                 ConstTensorView(residual2, {N, C}), norm_weight, nullptr, {});

  // Routing: logits, the top-k softmax, the grouping by expert.
  Linear& router = linear(b.router);
  backend_.linear_forward(TensorView(a.router_logits, {N, E}), ln2, weight_of(router), router.copy.get(), {},
                          router.exec, fp8_input(router, false));
  backend_.top_k_softmax(TensorView(m.probs, {N, E}), m.experts, m.weights,
                         ConstTensorView(a.router_logits, {N, E}), k);
  backend_.group_by_expert(m.offsets, m.slots, m.positions, m.experts, N, k, E, kExpertRowAlign);
  // The rows of each expert, for the GEMMs the host launches, and the balance: the grouping's offsets, the
  // chosen experts and the probabilities' sums, to the host (a wait for the router of this block; the sums
  // are enqueued first, so that the copies follow one another on an idle GPU).
  backend_.column_sums(a.probability_sums, ConstTensorView(m.probs, {N, E}));
  std::vector<int32_t> offsets(static_cast<size_t>(E + 1));
  backend_.copy_to_host(offsets.data(), m.offsets, offsets.size() * sizeof(int32_t));
  std::vector<int32_t> chosen(static_cast<size_t>(N * k));
  backend_.copy_to_host(chosen.data(), m.experts, chosen.size() * sizeof(int32_t));
  std::vector<float> probability_sums(static_cast<size_t>(E));
  backend_.copy_to_host(probability_sums.data(), a.probability_sums, probability_sums.size() * sizeof(float));
  std::vector<int64_t>& at = expert_offsets_[static_cast<size_t>(l)];
  std::vector<int64_t>& count = expert_counts_[static_cast<size_t>(l)];
  std::fill(count.begin(), count.end(), 0);
  for (const int32_t e : chosen) ++count[static_cast<size_t>(e)];
  double balance = 0.0;
  for (int64_t e = 0; e <= E; ++e) at[static_cast<size_t>(e)] = offsets[static_cast<size_t>(e)];
  for (int64_t e = 0; e < E; ++e) {
    balance += static_cast<double>(count[static_cast<size_t>(e)]) / static_cast<double>(N * k) *
               (static_cast<double>(probability_sums[static_cast<size_t>(e)]) / static_cast<double>(N));
  }
  layer_balance_[static_cast<size_t>(l)] = static_cast<double>(E) * balance;
  const int64_t M = at.back();

  // The experts: gather, gate/up per expert, SwiGLU, down per expert. An FP8 expert's input and hidden
  // activation are cast for it where they are made, each with that expert's own scale: by the gather of the
  // rows and by SwiGLU over them, one op for every expert's rows (Backend's grouped ops), before the
  // experts' GEMMs. The float32 rows are written where some expert reads more than its cast.
  const auto layers = experts_with_rows(
      at, [&](int64_t e) { return &linear(b.expert_fc(e)); },
      [&](int64_t e) { return &linear(b.expert_fc_proj(e)); });
  const std::vector<Linear*>& ups = layers.up;
  const std::vector<Linear*>& downs = layers.down;
  const ExpertCasts up_casts = expert_casts(ups, [](size_t, Linear& up) -> Fp8CastTarget {
    if (up.exec.forward != GemmMode::fp8) return {};
    return {&up.exec, &up.input_codes};
  });
  const ExpertCasts down_casts = expert_casts(downs, [](size_t, Linear& down) -> Fp8CastTarget {
    if (down.exec.forward != GemmMode::fp8) return {};
    return {&down.exec, &down.input_codes};
  });
  // Whether some expert's GEMMs read its float32 (or bf16) input rows, not only their cast.
  const auto rows_read = [](const LinearExecution& exec) {
    return exec.forward != GemmMode::fp8 || !input_cast_suffices(exec);
  };
  const TensorView dispatched(layers.any_up(rows_read) ? m.dispatched : nullptr, expert_input_type_, {M, C});
  if (up_casts.any) {
    backend_.gather_rows_grouped(dispatched, ln2, m.slots, k, nullptr, {at, up_casts.targets},
                                 TensorRole::activation);
  } else {
    backend_.gather_rows(dispatched, ln2, m.slots, k, nullptr, {}, TensorRole::activation);
  }
  for (int64_t e = 0; e < E; ++e) {
    if (ups[static_cast<size_t>(e)] == nullptr) continue;
    const int64_t from = at[static_cast<size_t>(e)], rows = at[static_cast<size_t>(e) + 1] - from;
    Linear& up = *ups[static_cast<size_t>(e)];
    const bool cast = up.exec.forward == GemmMode::fp8;
    const void* rows_in =
        expert_rows(m.dispatched, expert_input_type_, from, C, cast && input_cast_suffices(up.exec));
    backend_.linear_forward(
        TensorView(rows_past(m.fch, hidden_type_, from, 2 * H), hidden_type_, {rows, 2 * H}),
        ConstTensorView(rows_in, expert_input_type_, {rows, C}), weight_of(up), up.copy.get(), {}, up.exec,
        fp8_input(up, true));
  }
  round_hidden(m.fch, M * 2 * H);
  const TensorView act(layers.any_down(rows_read) ? m.act : nullptr, expert_act_type_, {M, H});
  const ConstTensorView hidden(m.fch, hidden_type_, {M, 2 * H});
  if (down_casts.any) {
    backend_.activation_forward_grouped(Activation::swiglu, act, hidden, {at, down_casts.targets});
  } else {
    backend_.activation_forward(Activation::swiglu, act, hidden, {});
  }
  for (int64_t e = 0; e < E; ++e) {
    if (downs[static_cast<size_t>(e)] == nullptr) continue;
    const int64_t from = at[static_cast<size_t>(e)], rows = at[static_cast<size_t>(e) + 1] - from;
    Linear& down = *downs[static_cast<size_t>(e)];
    const bool cast = down.exec.forward == GemmMode::fp8;
    const void* rows_in = expert_rows(m.act, expert_act_type_, from, H, cast && input_cast_suffices(down.exec));
    backend_.linear_forward(TensorView(m.out + from * C, {rows, C}),
                            ConstTensorView(rows_in, expert_act_type_, {rows, H}), weight_of(down),
                            down.copy.get(), {}, down.exec, fp8_input(down, true));
  }

  // residual3 = residual2 (+ the shared expert's MLP) + the weighted experts' rows of each token.
  const float* base = residual2;
  if (shared_fc != nullptr) {
    Linear& fc = *shared_fc;
    Linear& fc_proj = linear(b.fc_proj);
    const int64_t FC = 2 * H;
    void* fch = x.fch != nullptr ? x.fch : a.fch_scratch;
    backend_.linear_forward(TensorView(fch, hidden_type_, {N, FC}), ln2, weight_of(fc), fc.copy.get(), {},
                            fc.exec, fp8_input(fc, false));
    round_hidden(fch, N * FC);
    activation_into(fc_proj, x.fch_gelu, fch, N, H);
    backend_.linear_forward(TensorView(x.residual3, {N, C}),
                            ConstTensorView(x.fch_gelu, fc_proj.input_type, {N, H}), weight_of(fc_proj),
                            fc_proj.copy.get(), {.residual = residual2}, fc_proj.exec,
                            fp8_input(fc_proj, true));
    base = x.residual3;
  }
  backend_.combine_rows(TensorView(x.residual3, {N, C}), base, ConstTensorView(m.out, {M, C}), m.positions, k,
                        m.weights);
}

void Decoder::moe_backward(int64_t l, int64_t B, int64_t T, const float* residual, float dloss_scale) {
  const int64_t N = B * T, C = config_.channels, H = config_.hidden();
  const int64_t E = config_.experts, k = config_.experts_per_token;
  const BlockNames b = block_names(l);
  Activations& a = *acts_;
  Activations::Layer& x = a.layers[static_cast<size_t>(l)];
  const Activations::Moe& m = a.moe[static_cast<size_t>(l)];
  Gradients& d = *dacts_;
  const std::vector<int64_t>& at = expert_offsets_[static_cast<size_t>(l)];
  const int64_t M = at.back();
  const bool selective = checkpointing() == ActivationCheckpointing::selective;
  Linear& proj = linear(b.proj);
  const ParameterInfo& norm = parameter(b.norm2 + ".weight");

  // The shared expert's down projection first (under "selective" its input shares a buffer with ln2).
  Linear* shared_fc = config_.shared_expert ? &linear(b.fc) : nullptr;
  const void* shared_fch = nullptr;
  if (shared_fc != nullptr) {
    Linear& fc = *shared_fc;
    Linear& fc_proj = linear(b.fc_proj);
    shared_fch = x.fch;
    if (shared_fch == nullptr) {  // not kept (fp8.recompute_mlp)
      backend_.linear_recompute(TensorView(a.fch_scratch, hidden_type_, {N, 2 * H}), weight_of(fc),
                                fc.copy.get(), {}, fc.exec, kept_input(fc));
      round_hidden(a.fch_scratch, N * 2 * H);
      shared_fch = a.fch_scratch;
    }
    if (selective && x.fch_gelu != nullptr) {
      backend_.activation_forward(Activation::swiglu, TensorView(x.fch_gelu, fc_proj.input_type, {N, H}),
                                  ConstTensorView(shared_fch, hidden_type_, {N, 2 * H}), {});
    }
    backward_linear(fc_proj, d.wide_a, hidden_type_, nullptr, d.residual, Dtype::f32, x.fch_gelu,
                    fc_proj.input_type, N);
    round_hidden(d.wide_a, N * H);
  }
  const float* residual2 = x.residual2;
  if (residual2 == nullptr) {  // not kept (fp8.recompute_residual)
    backend_.linear_recompute(TensorView(a.residual2_scratch, {N, C}), weight_of(proj), proj.copy.get(),
                              {.residual = residual}, proj.exec, kept_input(proj));
    residual2 = a.residual2_scratch;
  }
  if (selective) {
    backend_.normalization_forward(norm_kind(), TensorView(x.ln2, Dtype::f32, {N, C}), x.ln2_mean, x.ln2_rstd,
                                   ConstTensorView(residual2, {N, C}), params() + norm.offset, nullptr, {});
  }
  // d(ln2): the shared expert's part into d.ln, the experts' and the router's into `dln` (d.ln itself
  // without a shared expert).
  float* dln = d.ln;
  if (shared_fc != nullptr) {
    activation_backward_into(*shared_fc, d.wide_b, shared_fch, d.wide_a, N, H, d.ln, Dtype::f32, x.ln2);
    round_norm_gradient(*shared_fc, Dtype::f32, d.ln, N * C);
    dln = d.dln;
  }

  // The combine's backward: each grouped row's gradient (the token's, weighted), here where no expert's down
  // projection casts it (else with the experts' casts, below), and each weight's.
  const auto layers = experts_with_rows(
      at, [&](int64_t e) { return &linear(b.expert_fc(e)); },
      [&](int64_t e) { return &linear(b.expert_fc_proj(e)); });
  const std::vector<Linear*>& ups = layers.up;
  const std::vector<Linear*>& downs = layers.down;
  const bool fp8_down = layers.any_down([](const LinearExecution& exec) { return casts_gradient(exec); });
  const bool fp8_up = layers.any_up([](const LinearExecution& exec) { return casts_gradient(exec); });
  if (!fp8_down) {
    backend_.gather_rows(TensorView(d.rows_dout, expert_dout_type_, {M, C}),
                         ConstTensorView(d.residual, {N, C}), m.slots, k, m.weights, {},
                         TensorRole::gradient);
  }
  backend_.row_dots(d.dweights, ConstTensorView(d.residual, {N, C}), ConstTensorView(m.out, {M, C}),
                    m.positions, k);
  // The router: the top-k softmax's backward with the balance loss's gradient, then its GEMMs.
  const float* dprobs = nullptr;
  if (config_.router_aux_loss_coef > 0.0f) {
    std::vector<float> host(static_cast<size_t>(E));
    const double per_token = static_cast<double>(dloss_scale) * static_cast<double>(N) *
                             config_.router_aux_loss_coef * static_cast<double>(E) / static_cast<double>(N);
    for (int64_t e = 0; e < E; ++e) {
      const double share =
          static_cast<double>(expert_counts_[static_cast<size_t>(l)][static_cast<size_t>(e)]) /
          static_cast<double>(N * k);
      host[static_cast<size_t>(e)] = static_cast<float>(per_token * share);
    }
    backend_.copy_from_host(d.dprobs, host.data(), host.size() * sizeof(float));
    dprobs = d.dprobs;
  }
  backend_.top_k_softmax_backward(TensorView(d.dlogits, {N, E}), ConstTensorView(m.probs, {N, E}), m.experts,
                                  m.weights, d.dweights, k, dprobs);
  backward_linear(linear(b.router), dln, Dtype::f32, nullptr, d.dlogits, Dtype::f32, x.ln2, Dtype::f32, N);

  // The experts, from their outputs' gradient: down (its output gradient cast by the gather of the rows
  // where it is FP8), SwiGLU's backward (casting gate/up's output gradient where that is FP8), gate/up (into
  // rows_c). Each FP8 expert's output-gradient casts go to a tensor of its own (expert_gradient_codes_):
  // every expert's rows are cast in one op before the experts' GEMMs read them.
  expert_gradient_codes_.resize(static_cast<size_t>(E));
  const auto gradient_rows_read = [](const LinearExecution& exec) {
    return !casts_gradient(exec) || !gradient_cast_suffices(exec);
  };
  if (fp8_down) {
    const ExpertCasts casts = expert_casts(downs, [&](size_t e, Linear& down) -> Fp8CastTarget {
      if (!casts_gradient(down.exec)) return {};
      return {&down.exec, &expert_gradient_codes_[e]};
    });
    backend_.gather_rows_grouped(
        TensorView(layers.any_down(gradient_rows_read) ? d.rows_dout : nullptr, expert_dout_type_, {M, C}),
        ConstTensorView(d.residual, {N, C}), m.slots, k, m.weights, {at, casts.targets}, TensorRole::gradient);
  }
  for (int64_t e = 0; e < E; ++e) {
    if (downs[static_cast<size_t>(e)] == nullptr) continue;
    const int64_t from = at[static_cast<size_t>(e)], rows = at[static_cast<size_t>(e) + 1] - from;
    Linear& down = *downs[static_cast<size_t>(e)];
    const bool cast = casts_gradient(down.exec);
    void* dout =
        expert_rows(d.rows_dout, expert_dout_type_, from, C, cast && gradient_cast_suffices(down.exec));
    void* act = expert_rows(m.act, expert_act_type_, from, H,
                            down.exec.forward == GemmMode::fp8 && input_cast_suffices(down.exec));
    backward_linear(down, rows_past(d.rows_f, hidden_type_, from, H), hidden_type_, nullptr, dout,
                    expert_dout_type_, act, expert_act_type_, rows, cast,
                    &expert_gradient_codes_[static_cast<size_t>(e)]);
  }
  round_hidden(d.rows_f, M * H);
  // Where no expert's gate/up casts its output gradient, SwiGLU's backward covers every row at once, that
  // gradient rounded to bf16 once where every expert's GEMMs that read it are BF16 (as the dense MLP's):
  // stored so where the backend does (expert_fch_gradient_type_), rounded in place otherwise.
  bool rounded = hidden_in_bf16_;
  for (int64_t e = 0; e < E; ++e) {
    const LinearExecution& up = linear(b.expert_fc(e)).exec;
    rounded &= up.input_gradient == GemmMode::bf16 && up.weight_gradient == GemmMode::bf16;
  }
  const Dtype dfch_type = rounded ? expert_fch_gradient_type_ : Dtype::f32;
  const ConstTensorView fch(m.fch, hidden_type_, {M, 2 * H});
  const ConstTensorView rows_f(d.rows_f, hidden_type_, {M, H});
  if (!fp8_up) {
    backend_.activation_backward(Activation::swiglu, TensorView(d.rows_2f, dfch_type, {M, 2 * H}), fch, rows_f,
                                 nullptr, {});
    if (rounded && dfch_type == Dtype::f32) {
      backend_.round_in_place(static_cast<float*>(d.rows_2f), M * 2 * H, Dtype::bf16);
    }
  } else {
    const ExpertCasts casts = expert_casts(ups, [&](size_t e, Linear& up) -> Fp8CastTarget {
      if (!casts_gradient(up.exec)) return {};
      return {&up.exec, &expert_gradient_codes_[e]};
    });
    backend_.activation_backward_grouped(
        Activation::swiglu,
        TensorView(layers.any_up(gradient_rows_read) ? d.rows_2f : nullptr, dfch_type, {M, 2 * H}), fch, rows_f,
        {at, casts.targets});
  }
  for (int64_t e = 0; e < E; ++e) {
    if (ups[static_cast<size_t>(e)] == nullptr) continue;
    const int64_t from = at[static_cast<size_t>(e)];
    const int64_t rows = at[static_cast<size_t>(e) + 1] - from;
    Linear& up = *ups[static_cast<size_t>(e)];
    const bool cast = casts_gradient(up.exec);
    void* dfch = expert_rows(d.rows_2f, dfch_type, from, 2 * H, cast && gradient_cast_suffices(up.exec));
    const void* inp = expert_rows(m.dispatched, expert_input_type_, from, C,
                                  up.exec.forward == GemmMode::fp8 && input_cast_suffices(up.exec));
    backward_linear(up, d.rows_c + from * C, Dtype::f32, nullptr, dfch, dfch_type, inp, expert_input_type_,
                    rows, cast, &expert_gradient_codes_[static_cast<size_t>(e)]);
  }
  // The gather's backward: each token's rows summed into d(ln2).
  backend_.combine_rows(TensorView(dln, {N, C}), dln, ConstTensorView(d.rows_c, {M, C}), m.positions, k,
                        nullptr);
  if (shared_fc != nullptr)
    backend_.add(TensorView(d.ln, {N, C}), ConstTensorView(d.ln, {N, C}), ConstTensorView(dln, {N, C}));
  OCTET_CHECK(grads_->floats() != nullptr, "the gradient buffer");
  backend_.normalization_backward(norm_kind(), d.residual, grads_->floats() + norm.grad_offset, nullptr,
                                  ConstTensorView(d.ln, {N, C}), residual2, params() + norm.offset,
                                  x.ln2_mean, x.ln2_rstd);
}

}  // namespace octet
