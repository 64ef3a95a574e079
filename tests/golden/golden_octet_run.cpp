// See golden_octet_run.h.
#include "golden_octet_run.h"

#include <memory>
#include <random>
#include <string>
#include <utility>

#include "octet/backend/cpu_backend.h"
#include "octet/model/precision_policy.h"
#include "random.h"

namespace octet::testing {
namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = dist(rng);
  return tokens;
}

// Matrices times matrix_scale; biases normal(0, 0.02), LayerNorm and RMSNorm gains 1 + normal(0, 0.1).
void adjust_initialisation(Decoder& model, float matrix_scale, uint64_t seed) {
  Backend& backend = model.backend();
  uint64_t stream = seed;
  for (const ParameterInfo& p : model.parameters()) {
    float* param = model.params() + p.offset;
    std::vector<float> values(static_cast<size_t>(p.count));
    if (p.shape.size() == 2) {
      backend.copy_to_host(values.data(), param, values.size() * sizeof(float));
      for (float& v : values) v *= matrix_scale;
    } else {
      const bool gain = p.name.ends_with(".weight");
      values = random_normal(values.size(), ++stream, gain ? 0.1f : 0.02f);
      if (gain) {
        for (float& v : values) v += 1.0f;
      }
    }
    backend.copy_from_host(param, values.data(), values.size() * sizeof(float));
  }
}

std::vector<float> to_host(Backend& backend, const float* source, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  backend.copy_to_host(host.data(), source, host.size() * sizeof(float));
  return host;
}

}  // namespace

std::vector<GoldenCase> gpt2_golden_cases() {
  GoldenCase c;
  c.name = "init";
  c.config.vocab_size = 61;
  c.config.padded_vocab_size = 64;
  c.config.max_seq_len = 16;
  c.config.layers = 2;
  c.config.heads = 4;
  c.config.channels = 32;
  c.B = 3;
  c.T = 11;
  c.seed = 20240611;
  c.steps = 10;
  c.learning_rate = 1e-3f;
  c.optimizer =
      AdamWSettings{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .groups = {}};
  GoldenCase wide = c;
  wide.name = "wide";
  wide.seed = 20240612;
  wide.matrix_scale = 10.0f;  // weights ~ normal(0, 0.2): pre-activations and attention scores of order one
  return {c, wide};
}

std::vector<GoldenCase> llama_golden_cases() {
  GoldenCase grouped;
  grouped.name = "grouped";
  ModelConfig& c = grouped.config;
  c.arch = ModelArchitecture::llama;
  c.vocab_size = 61;
  c.padded_vocab_size = 64;
  c.max_seq_len = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.channels = 64;
  c.ffn_hidden = 96;
  c.rope_theta = 10000.0f;
  grouped.B = 2;
  grouped.T = 16;
  grouped.seed = 20240613;
  // Weights ~ normal(0, 0.2): SiLU and attention away from their linear regions, rotations that matter.
  grouped.matrix_scale = 10.0f;
  grouped.steps = 10;
  grouped.learning_rate = 1e-3f;
  grouped.optimizer =
      AdamWSettings{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .groups = {}};

  GoldenCase tied = grouped;
  tied.name = "multi_query_tied";
  tied.config.heads = 3;
  tied.config.kv_heads = 1;
  tied.config.channels = 48;
  tied.config.ffn_hidden = 80;
  tied.config.tie_embeddings = true;
  tied.B = 3;
  tied.T = 11;
  tied.seed = 20240614;

  // Mixtral's block: 4 experts, 2 per token, a shared expert and the balance loss at a weight that shows.
  GoldenCase moe = grouped;
  moe.name = "moe_shared_expert";
  moe.config.ffn_hidden = 32;
  moe.config.experts = 4;
  moe.config.experts_per_token = 2;
  moe.config.shared_expert = true;
  moe.config.router_aux_loss_coef = 0.5f;
  moe.seed = 20240615;
  return {grouped, tied, moe};
}

OctetRun run_octet(const GoldenCase& gc) {
  const int64_t B = gc.B, T = gc.T, N = B * T;
  const int64_t Vp = gc.config.padded_vocab();
  std::unique_ptr<Backend> backend = make_cpu_backend();
  PrecisionPolicy policy(PrecisionSettings{}, gc.config, N);
  Decoder model(gc.config, *backend, std::move(policy), B, T);
  model.init_weights(gc.seed);
  adjust_initialisation(model, gc.matrix_scale, gc.seed + 1000);
  model.refresh_weight_copies();

  OctetRun run;
  run.parameters = model.parameters();
  run.tokens = random_tokens(N, gc.config.vocab_size, gc.seed + 1);
  run.targets = random_tokens(N, gc.config.vocab_size, gc.seed + 2);
  run.initial_params = to_host(*backend, model.params(), model.parameter_count());

  AdamW optimizer(*backend, model.parameters(), model.parameter_count(), gc.optimizer);
  for (int64_t step = 0; step < gc.steps; ++step) {
    if (step == 0) {
      // A forward with targets keeps no logits (it runs the LM head chunk by chunk): ask for them first.
      model.forward_logits(run.tokens.data(), B, T);
      run.logits = to_host(*backend, model.logits(), N * Vp);
    }
    model.zero_grad();
    // As the trainer does: the LM head's backward runs in the forward.
    const float loss =
        model.forward(run.tokens.data(), run.targets.data(), B, T, 1.0f / static_cast<float>(N));
    if (step == 0) run.loss = loss;
    model.backward(1.0f / static_cast<float>(N));
    if (step == 0) run.grads = to_host(*backend, model.grads(), model.parameter_count());
    run.step_losses.push_back(loss);
    optimizer.step(model.params(), model.grads(), gc.learning_rate, 1.0f);
    model.refresh_weight_copies();
  }
  run.final_params = to_host(*backend, model.params(), model.parameter_count());
  return run;
}

GoldenInput golden_input(const GoldenCase& gc, const OctetRun& run) {
  GoldenInput in;
  in.config = gc.config;
  in.B = gc.B;
  in.T = gc.T;
  in.steps = gc.steps;
  in.learning_rate = gc.learning_rate;
  in.optimizer = gc.optimizer;
  in.tokens = run.tokens;
  in.targets = run.targets;
  for (const ParameterInfo& p : run.parameters) {
    const auto first = run.initial_params.begin() + p.offset;
    in.parameters.push_back({p.name, p.shape, std::vector<float>(first, first + p.count)});
  }
  return in;
}

}  // namespace octet::testing
