// The run configuration's single table of keys: name, type, valid values, the setting each reaches and its
// description, in the order `octet config show` prints them and docs/config.md lists them.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "config_key.h"

namespace octet::config_detail {
namespace {

// Upper bounds of the shape keys, so that no size derived from them overflows (run_config.cpp's
// check_consistency bounds their products). Token ids are int32 in batches and shards.
constexpr int64_t kMaxTokenId = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxSequence = int64_t{1} << 20;
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxHeads = int64_t{1} << 16;
constexpr int64_t kMaxExperts = 256;
constexpr int64_t kMaxChannels = int64_t{1} << 20;
constexpr int64_t kMaxBatch = int64_t{1} << 20;
constexpr int64_t kMaxRanks = int64_t{1} << 16;

// A number of ranks: -1 (the ranks the other [distributed] key leaves) or 1 to kMaxRanks.
Key ranks(std::string name, std::function<int64_t&(RunConfig&)> ref, std::string description) {
  const std::string valid = fmt::format("-1 (the ranks the other key leaves) or 1 to {}", kMaxRanks);
  Key k = integer<int64_t>(name, ref, -1, kMaxRanks, std::move(description));
  k.valid = valid;
  k.set = [=](RunConfig& c, const toml::node& n, const std::string& where) {
    const std::optional<int64_t> v = n.is_integer() ? n.value<int64_t>() : std::nullopt;
    if (!v || *v == 0 || *v < -1 || *v > kMaxRanks) {
      fail(fmt::format("{}: {} must be {}, got {}", where, name, valid, describe_node(n)));
    }
    ref(c) = *v;
  };
  return k;
}

}  // namespace

// The single table of keys, in the order `octet config show` prints them.
const std::vector<Key>& keys() {
  static const std::vector<Key> table = [] {
    const int64_t big = std::numeric_limits<int64_t>::max();
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<Key> k;
    // [model]
    k.push_back(choice<ModelArchitecture>(
        "model.arch", [](RunConfig& c) -> ModelArchitecture& { return c.model.arch; },
        {{"gpt2", ModelArchitecture::gpt2}, {"llama", ModelArchitecture::llama}},
        "Model architecture: GPT-2 (learned positions, LayerNorm, GELU MLP with biases, LM head tied to the "
        "embedding) or Llama (rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases, "
        "untied head)."));
    k.push_back(integer<int64_t>(
        "model.vocab_size", [](RunConfig& c) -> int64_t& { return c.model.vocab_size; }, 2, kMaxTokenId,
        "Tokens the model predicts (the loss covers exactly these)."));
    k.push_back(integer<int64_t>(
        "model.padded_vocab_size", [](RunConfig& c) -> int64_t& { return c.model.padded_vocab_size; }, 0,
        kMaxTokenId, "Rows of the token embedding; 0 rounds vocab_size up to a multiple of 64."));
    k.push_back(integer<int64_t>(
        "model.max_seq_len", [](RunConfig& c) -> int64_t& { return c.model.max_seq_len; }, 1, kMaxSequence,
        "Positions of the learned position embedding (the context length)."));
    k.push_back(integer<int64_t>(
        "model.layers", [](RunConfig& c) -> int64_t& { return c.model.layers; }, 1, kMaxLayers,
        "Transformer blocks."));
    k.push_back(integer<int64_t>(
        "model.heads", [](RunConfig& c) -> int64_t& { return c.model.heads; }, 1, kMaxHeads,
        "Attention heads."));
    k.push_back(integer<int64_t>(
        "model.channels", [](RunConfig& c) -> int64_t& { return c.model.channels; }, 1, kMaxChannels,
        "Width of the residual stream; a multiple of heads."));
    k.push_back(integer<int64_t>(
        "model.kv_heads", [](RunConfig& c) -> int64_t& { return c.model.kv_heads; }, 0, kMaxHeads,
        "Llama: key and value heads (grouped-query attention), dividing heads; 0 means as many as heads."));
    k.push_back(integer<int64_t>(
        "model.ffn_hidden", [](RunConfig& c) -> int64_t& { return c.model.ffn_hidden; }, 0, kMaxChannels,
        "Llama: the SwiGLU MLP's hidden width; 0 means 8 x channels / 3 rounded up to a multiple of 256."));
    k.push_back(number(
        "model.rope_theta", [](RunConfig& c) -> float& { return c.model.rope_theta; }, 1.0, true, inf, false,
        "Llama: the rotary embedding's base (Llama 3: 500000)."));
    k.push_back(number(
        "model.rope_scaling_factor", [](RunConfig& c) -> float& { return c.model.rope_scaling.factor; }, 0.0,
        false, inf, false,
        "Llama: Llama 3.1's scaling of the low rotary frequencies for long contexts (8 in Llama 3.1); 0 is "
        "off."));
    k.push_back(number(
        "model.rope_low_freq_factor",
        [](RunConfig& c) -> float& { return c.model.rope_scaling.low_freq_factor; }, 0.0, true, inf, false,
        "Llama 3.1 rotary scaling: the low frequency factor."));
    k.push_back(number(
        "model.rope_high_freq_factor",
        [](RunConfig& c) -> float& { return c.model.rope_scaling.high_freq_factor; }, 0.0, true, inf, false,
        "Llama 3.1 rotary scaling: the high frequency factor."));
    k.push_back(integer<int64_t>(
        "model.rope_original_max_seq_len",
        [](RunConfig& c) -> int64_t& { return c.model.rope_scaling.original_max_seq_len; }, 1, kMaxSequence,
        "Llama 3.1 rotary scaling: the context the frequencies were trained for (8192)."));
    k.push_back(boolean(
        "model.tie_embeddings", [](RunConfig& c) -> bool& { return c.model.tie_embeddings; },
        "Llama: the head reads the token embedding instead of its own weight (GPT-2's always does)."));
    k.push_back(integer<int64_t>(
        "model.experts", [](RunConfig& c) -> int64_t& { return c.model.experts; }, 0, kMaxExperts,
        "Llama: experts in each block's mixture-of-experts MLP (Mixtral's); 0 is the dense MLP."));
    k.push_back(integer<int64_t>(
        "model.experts_per_token", [](RunConfig& c) -> int64_t& { return c.model.experts_per_token; }, 1,
        kMaxExperts, "Mixture of experts: the experts the router chooses for each token (top-k)."));
    k.push_back(boolean(
        "model.shared_expert", [](RunConfig& c) -> bool& { return c.model.shared_expert; },
        "Mixture of experts: one more SwiGLU MLP that every token runs, added to the chosen experts' sum."));
    k.push_back(number(
        "model.router_aux_loss_coef", [](RunConfig& c) -> float& { return c.model.router_aux_loss_coef; },
        0.0, false, inf, false,
        "Mixture of experts: the weight of each layer's load-balancing loss in the training loss."));
    // [train]
    k.push_back(choice<MixedPrecision>(
        "train.mixed_precision", [](RunConfig& c) -> MixedPrecision& { return c.precision.mode; },
        {{"fp32", MixedPrecision::fp32},
         {"bf16", MixedPrecision::bf16},
         {"fp16", MixedPrecision::fp16},
         {"fp8", MixedPrecision::fp8}},
        "Precision mode (docs/precision.md)."));
    k.push_back(integer<int64_t>(
        "train.batch_size", [](RunConfig& c) -> int64_t& { return c.train.batch_size; }, 1, kMaxBatch,
        "Sequences per micro-batch (B)."));
    k.push_back(integer<int64_t>(
        "train.seq_len", [](RunConfig& c) -> int64_t& { return c.train.seq_len; }, 1, kMaxSequence,
        "Tokens per sequence (T); at most model.max_seq_len."));
    k.push_back(integer<int64_t>(
        "train.grad_accum_steps", [](RunConfig& c) -> int64_t& { return c.train.grad_accum_steps; }, 1,
        kMaxBatch, "Micro-batches per optimizer step."));
    k.push_back(integer<int64_t>(
        "train.steps", [](RunConfig& c) -> int64_t& { return c.steps; }, 1, big,
        "Optimizer steps of the run."));
    k.push_back(integer<uint64_t>(
        "train.seed", [](RunConfig& c) -> uint64_t& { return c.seed; }, 0, big,
        "Seed of the initial weights and the data order."));
    k.push_back(choice<std::string>(
        "train.device", [](RunConfig& c) -> std::string& { return c.device; },
        {{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}},
        "Where to train; auto picks a GPU when the build has CUDA and one is present."));
    k.push_back(choice<std::string>(
        "train.attention", [](RunConfig& c) -> std::string& { return c.attention; },
        {{"auto", "auto"}, {"cudnn", "cudnn"}, {"octet", "octet"}},
        "Attention kernels on the GPU: cudnn (cuDNN's fused flash attention, loaded at run time), octet (its "
        "own kernels), or auto (cuDNN where it loads and supports the shape; the log says which). cuDNN's "
        "backward is not bit-reproducible at training sizes (a few dQ elements round differently from run to "
        "run); \"octet\" is, at about 1.9x the attention time (docs/gpu.md)."));
    k.push_back(choice<bool>(
        "train.gemm_algorithms", [](RunConfig& c) -> bool& { return c.time_gemm_algorithms; },
        {{"heuristic", false}, {"timed", true}},
        "How the GPU picks each GEMM shape's cuBLASLt algorithm: heuristic (cuBLASLt's first answer, the "
        "same on every run) or timed (the fastest of its first 8 answers, each timed on the shape's first "
        "product in the run's first step; which one wins can differ from run to run, and with it the last "
        "bits of results). No effect on the CPU (docs/gpu.md)."));
    k.push_back(integer<int64_t>(
        "train.max_consecutive_skips", [](RunConfig& c) -> int64_t& { return c.train.max_consecutive_skips; },
        1, big, "Skipped (non-finite) steps in a row after which the run stops (exit code 3)."));
    k.push_back(choice<bool>(
        "train.weight_gradients", [](RunConfig& c) -> bool& { return c.precision.bf16_weight_gradients; },
        {{"float32", false}, {"bf16", true}},
        "How the block layers' weight gradients are kept: float32, or rounded to bf16 once by their BF16 or "
        "FP8 weight-gradient GEMM, as PyTorch autocast's are (on the GPU also stored in bf16: half the "
        "gradient memory and traffic; accumulation over micro-batches then adds in bf16; several ranks sum "
        "them in bf16, docs/distributed.md). bf16 needs "
        "train.mixed_precision bf16 or fp8 (docs/precision.md)."));
    k.push_back(choice<ActivationCheckpointing>(
        "train.activation_checkpointing",
        [](RunConfig& c) -> ActivationCheckpointing& { return c.precision.activation_checkpointing; },
        {{"none", ActivationCheckpointing::none},
         {"selective", ActivationCheckpointing::selective},
         {"full", ActivationCheckpointing::full}},
        "What each block keeps for its backward: everything (none); all but the normalizations' and the MLP "
        "activation's outputs, made again in the backward (selective); only its input, the block's forward "
        "run again before its backward (full). Same losses and gradients, less memory (docs/precision.md)."));
    k.push_back(precision_phases(
        "train.precision_phases",
        [](RunConfig& c) -> std::vector<PrecisionPhase>& { return c.precision_phases; },
        "A precision schedule: the run trains each phase's steps in its mode, switching modes in the run "
        "(master weights, AdamW moments, loss scale and data position carried over as a checkpoint resumed "
        "in the new mode carries them), e.g. [{ mode = \"bf16\", steps = 200 }, { mode = \"fp8\" }]; the "
        "last phase may leave out steps to run to the end. When given it decides every step's mode and "
        "train.mixed_precision is its first phase's (docs/precision.md)."));
    // [fp8]
    k.push_back(choice<RecipeKind>(
        "fp8.recipe", [](RunConfig& c) -> RecipeKind& { return c.precision.recipe; },
        {{"delayed", RecipeKind::delayed},
         {"current", RecipeKind::current},
         {"static", RecipeKind::static_scale},
         {"block", RecipeKind::block},
         {"mxfp8", RecipeKind::mxfp8}},
        "Scaling recipe (docs/fp8.md)."));
    k.push_back(integer<int64_t>(
        "fp8.bf16_warmup_steps", [](RunConfig& c) -> int64_t& { return c.bf16_warmup_steps; }, 0, big,
        "fp8 mode: train the run's first steps in bf16, then switch to fp8 in the run (a shorthand for "
        "train.precision_phases)."));
    k.push_back(integer<int64_t>(
        "fp8.bf16_cooldown_steps", [](RunConfig& c) -> int64_t& { return c.bf16_cooldown_steps; }, 0, big,
        "fp8 mode: train the run's last steps in bf16, switching from fp8 in the run (a shorthand for "
        "train.precision_phases)."));
    k.push_back(choice<bool>(
        "fp8.formats", [](RunConfig& c) -> bool& { return c.precision.all_e4m3; },
        {{"hybrid", false}, {"e4m3", true}},
        "hybrid: E4M3 activations and weights, E5M2 gradients; e4m3: E4M3 everywhere."));
    k.push_back(integer<int>(
        "fp8.amax_history", [](RunConfig& c) -> int& { return c.precision.amax_history; }, 1, 1024,
        "Length of the delayed recipe's amax history."));
    k.push_back(choice<AmaxAlgorithm>(
        "fp8.amax_algorithm", [](RunConfig& c) -> AmaxAlgorithm& { return c.precision.amax_algorithm; },
        {{"max", AmaxAlgorithm::max}, {"most_recent", AmaxAlgorithm::most_recent}},
        "How the delayed recipe reads its history."));
    k.push_back(integer<int>(
        "fp8.margin", [](RunConfig& c) -> int& { return c.precision.margin; }, 0, 16,
        "Headroom: scales are divided by 2^margin."));
    k.push_back(number(
        "fp8.static_scale", [](RunConfig& c) -> float& { return c.precision.static_scale; }, 0, true, 3.4e38,
        false, "The scale of the static recipe."));
    k.push_back(text(
        "fp8.calibration", [](const RunConfig& c) { return c.precision.calibration.string(); },
        [](RunConfig& c, std::string v) { c.precision.calibration = std::move(v); },
        "Static recipe: a calibration file written by `octet calibrate`, whose per-layer scales replace "
        "fp8.static_scale; empty: none (docs/localization.md)."));
    k.push_back(text(
        "fp8.precision_map", [](const RunConfig& c) { return c.precision.precision_map.string(); },
        [](RunConfig& c, std::string v) { c.precision.precision_map = std::move(v); },
        "A precision map written by `octet localize`: the layers it sets to BF16 run in BF16, with its "
        "reason; it never moves a layer into FP8. Empty: none (docs/localization.md)."));
    k.push_back(boolean(
        "fp8.auto_filter", [](RunConfig& c) -> bool& { return c.precision.auto_filter; },
        "CUDA backend: at start, time each FP8 layer's GEMMs in FP8 (casts included) and in BF16 at its "
        "shape and keep it in BF16 where FP8 is slower; refused on the CPU (docs/localization.md)."));
    k.push_back(boolean(
        "fp8.power_of_two_scales", [](RunConfig& c) -> bool& { return c.precision.power_of_two_scales; },
        "Block recipe: round scales down to powers of two."));
    k.push_back(strings(
        "fp8.include", [](RunConfig& c) -> std::vector<std::string>& { return c.precision.include; },
        "When not empty, only block layers matching one of these convert."));
    k.push_back(strings(
        "fp8.exclude", [](RunConfig& c) -> std::vector<std::string>& { return c.precision.exclude; },
        "Layers matching one of these stay in BF16."));
    k.push_back(boolean(
        "fp8.lm_head", [](RunConfig& c) -> bool& { return c.precision.lm_head; },
        "Convert the LM head too."));
    k.push_back(boolean(
        "fp8.experts", [](RunConfig& c) -> bool& { return c.precision.experts; },
        "Convert the mixture-of-experts layers' experts too, each with its own scaling state."));
    k.push_back(boolean(
        "fp8.first_last_blocks_bf16",
        [](RunConfig& c) -> bool& { return c.precision.first_last_blocks_bf16; },
        "Keep the first and the last block in BF16."));
    k.push_back(boolean(
        "fp8.recompute_mlp", [](RunConfig& c) -> bool& { return c.precision.recompute_mlp; },
        "Keep the FP8 input codes of each FP8 mlp.c_fc instead of its output (GELU's input) and run its "
        "forward GEMM again in the backward: less memory, one more FP8 GEMM per block."));
    k.push_back(boolean(
        "fp8.recompute_qkv", [](RunConfig& c) -> bool& { return c.precision.recompute_qkv; },
        "Keep the FP8 input codes of each FP8 attn.c_attn instead of q, k and v and run its forward GEMM "
        "again in the backward: less memory, one more FP8 GEMM per block."));
    k.push_back(boolean(
        "fp8.recompute_residual", [](RunConfig& c) -> bool& { return c.precision.recompute_residual; },
        "Keep the FP8 input codes of each FP8 attn.c_proj instead of the residual stream it writes (ln_2's "
        "input) and run its forward GEMM and residual add again in the backward: less memory, one more FP8 "
        "GEMM per block."));
    k.push_back(boolean(
        "fp8.recompute_weight_transposes",
        [](RunConfig& c) -> bool& { return c.precision.recompute_weight_transposes; },
        "Keep only the FP8 codes of each weight, not those of its transpose too, and transpose them before "
        "each input-gradient GEMM: one byte a weight less (GPU), one transpose per layer and backward."));
    k.push_back(boolean(
        "fp8.forward", [](RunConfig& c) -> bool& { return c.precision.fp8_forward; },
        "Run converted layers' forward GEMMs in FP8."));
    k.push_back(boolean(
        "fp8.input_gradient", [](RunConfig& c) -> bool& { return c.precision.fp8_input_gradient; },
        "Run converted layers' input-gradient GEMMs in FP8."));
    k.push_back(boolean(
        "fp8.weight_gradient", [](RunConfig& c) -> bool& { return c.precision.fp8_weight_gradient; },
        "Run converted layers' weight-gradient GEMMs in FP8 (needs the forward in FP8)."));
    k.push_back(boolean(
        "fp8.fast_accumulation_forward",
        [](RunConfig& c) -> bool& { return c.precision.fast_accumulation_forward; },
        "Forward FP8 GEMMs keep the sum in the tensor cores' narrow accumulator (GPU; faster, less exact)."));
    k.push_back(boolean(
        "fp8.fast_accumulation_backward",
        [](RunConfig& c) -> bool& { return c.precision.fast_accumulation_backward; },
        "The same for the input- and weight-gradient FP8 GEMMs (GPU); off promotes partial sums to "
        "float32."));
    k.push_back(boolean(
        "fp8.strict", [](RunConfig& c) -> bool& { return c.fp8_strict; },
        "Refuse to start instead of running FP8 GEMMs in BF16 where the device has no FP8 tensor cores."));
    k.push_back(choice<AlertAction>(
        "fp8.on_alert", [](RunConfig& c) -> AlertAction& { return c.telemetry.on_alert; },
        {{"warn", AlertAction::warn},
         {"bf16_layer", AlertAction::bf16_layer},
         {"stop", AlertAction::stop},
         {"recalibrate", AlertAction::recalibrate}},
        "What an FP8 alert does besides one warning line and an event row: nothing (warn), run the layer's "
        "GEMMs in BF16 from the next step (bf16_layer), save a checkpoint and stop with exit code 3 (stop), "
        "or measure the static recipe's scales again on the step's batch (recalibrate; docs/telemetry.md)."));
    k.push_back(number(
        "fp8.alert_saturation", [](RunConfig& c) -> float& { return c.telemetry.alert_saturation; }, 0, false,
        1, false,
        "Alert when more than this fraction of an FP8 tensor's values saturate in a telemetry interval; 1: "
        "never."));
    k.push_back(number(
        "fp8.alert_underflow", [](RunConfig& c) -> float& { return c.telemetry.alert_underflow; }, 0, false,
        1, false,
        "Alert when more than this fraction of an FP8 tensor's non-zero values underflow to zero in a "
        "telemetry interval; 1: never."));
    k.push_back(number(
        "fp8.alert_scale_jump", [](RunConfig& c) -> float& { return c.telemetry.alert_scale_jump; }, 0, false,
        inf, false,
        "Alert when an FP8 activation's or weight's magnitude moves lastingly by more than this factor "
        "between telemetry records (delayed scaling: the median amax of the casts since the previous "
        "record); gradients never raise it; 0: never, otherwise more than 1."));
    k.push_back(integer<int64_t>(
        "fp8.shadow_every", [](RunConfig& c) -> int64_t& { return c.telemetry.shadow_every; }, 0, big,
        "Every this many fp8 steps, run the step's first micro-batch again in BF16 and record the loss "
        "difference and each FP8 layer's weight-gradient cosine (docs/localization.md); 0: never."));
    k.push_back(number(
        "fp8.shadow_loss_threshold", [](RunConfig& c) -> float& { return c.telemetry.shadow_loss_threshold; },
        0, true, inf, false,
        "A shadow_loss alert fires when the FP8 loss differs from the BF16 shadow's by more than this "
        "fraction of it."));
    k.push_back(number(
        "fp8.shadow_cosine_threshold",
        [](RunConfig& c) -> float& { return c.telemetry.shadow_cosine_threshold; }, -1, false, 1, false,
        "A shadow_cosine alert fires when a layer's FP8 weight gradient has a cosine below this with the "
        "BF16 shadow's."));
    k.push_back(integer<int64_t>(
        "fp8.recalibrate_every", [](RunConfig& c) -> int64_t& { return c.telemetry.recalibrate_every; }, 0,
        big,
        "Every this many steps, measure the FP8 operands on the step's first micro-batch and install the "
        "calibrated scales (fp8.recipe = \"static\"; docs/localization.md); 0: never."));
    // [optimizer]
    k.push_back(number(
        "optimizer.learning_rate", [](RunConfig& c) -> float& { return c.train.schedule.max_learning_rate; },
        0, true, inf, false, "Peak learning rate."));
    k.push_back(number(
        "optimizer.beta1", [](RunConfig& c) -> float& { return c.train.adamw.beta1; }, 0, false, 1, true,
        "AdamW beta1."));
    k.push_back(number(
        "optimizer.beta2", [](RunConfig& c) -> float& { return c.train.adamw.beta2; }, 0, false, 1, true,
        "AdamW beta2."));
    k.push_back(number(
        "optimizer.eps", [](RunConfig& c) -> float& { return c.train.adamw.eps; }, 0, true, inf, false,
        "AdamW epsilon."));
    k.push_back(number(
        "optimizer.weight_decay", [](RunConfig& c) -> float& { return c.train.adamw.weight_decay; }, 0, false,
        inf, false, "Decoupled weight decay, applied to matrices only."));
    k.push_back(number(
        "optimizer.grad_clip", [](RunConfig& c) -> float& { return c.train.grad_clip; }, 0, false, inf, false,
        "Largest global gradient norm; 0 turns clipping off."));
    k.push_back(parameter_groups(
        "optimizer.groups", [](RunConfig& c) -> std::vector<ParameterGroup>& { return c.train.adamw.groups; },
        "Parameter groups by name glob, e.g. [{ match = \"h.*.attn.*\", lr_scale = 0.5 }]: each group's "
        "parameters take the learning rate times lr_scale and, where given, their own weight_decay (for "
        "those that decay, the matrices). The first group that matches a parameter holds it; a glob that "
        "matches no parameter is refused. Also [[optimizer.groups]] tables."));
    // [scheduler]
    k.push_back(integer<int64_t>(
        "scheduler.warmup_steps", [](RunConfig& c) -> int64_t& { return c.train.schedule.warmup_steps; }, 0,
        big, "Steps of linear warm-up; at most train.steps."));
    k.push_back(number(
        "scheduler.final_fraction", [](RunConfig& c) -> float& { return c.train.schedule.final_fraction; }, 0,
        false, 1, false, "The cosine decay's floor, as a fraction of the peak learning rate."));
    // [loss_scale] (fp16 mode)
    k.push_back(number(
        "loss_scale.initial_scale", [](RunConfig& c) -> float& { return c.train.loss_scale.initial_scale; },
        0, true, 3.4e38, false, "fp16: the first loss scale."));
    k.push_back(integer<int64_t>(
        "loss_scale.growth_interval",
        [](RunConfig& c) -> int64_t& { return c.train.loss_scale.growth_interval; }, 1, big,
        "fp16: clean steps in a row before the scale grows."));
    k.push_back(number(
        "loss_scale.backoff_factor", [](RunConfig& c) -> float& { return c.train.loss_scale.backoff_factor; },
        0, true, 1, true, "fp16: factor applied to the scale on overflow."));
    k.push_back(number(
        "loss_scale.growth_factor", [](RunConfig& c) -> float& { return c.train.loss_scale.growth_factor; },
        1, true, inf, false, "fp16: factor applied after growth_interval clean steps."));
    // [distributed]
    k.push_back(ranks(
        "distributed.dp_shard", [](RunConfig& c) -> int64_t& { return c.distributed.dp_shard; },
        "Data-parallel ranks that share one copy of the optimizer state, each keeping and updating a "
        "contiguous shard of it (docs/distributed.md)."));
    k.push_back(ranks(
        "distributed.dp_replicate", [](RunConfig& c) -> int64_t& { return c.distributed.dp_replicate; },
        "Groups of dp_shard ranks that each hold a whole copy of the optimizer state; dp_shard x "
        "dp_replicate is the number of ranks (both above 1: a hybrid layout, docs/distributed.md)."));
    k.push_back(choice<dist::GradientReduceType>(
        "distributed.gradient_reduce_dtype",
        [](RunConfig& c) -> dist::GradientReduceType& { return c.distributed.gradient_reduce_type; },
        {{"float32", dist::GradientReduceType::float32}, {"bf16", dist::GradientReduceType::bf16}},
        "The type in which the ranks sum their gradients: float32, or bf16 (half the traffic; each rank's "
        "gradient and every partial sum rounded to bf16)."));
    k.push_back(integer<int64_t>(
        "distributed.bucket_mb", [](RunConfig& c) -> int64_t& { return c.distributed.bucket_mb; }, 0, 1 << 20,
        "MiB of float32 gradients in each bucket whose sum over the ranks starts during the backward (64: "
        "large enough for NCCL to run at full bandwidth, small enough to start while most of the backward "
        "remains); 0: every sum starts after the backward."));
    k.push_back(choice<bool>(
        "distributed.sharded_gradient_sums",
        [](RunConfig& c) -> bool& { return c.distributed.reduce_scatter; },
        {{"all_reduce", false}, {"reduce_scatter", true}},
        "With the optimizer state sharded (dp_shard above 1): all_reduce (every rank receives every "
        "gradient's sum) or reduce_scatter (each rank receives its shard's sums only: half the bytes, but "
        "one NCCL reduce per shard a bucket meets; slower on 2 GPUs of one node, docs/distributed.md). "
        "reduce_scatter is refused with a hybrid layout (dp_shard and dp_replicate both above 1)."));
    k.push_back(boolean(
        "distributed.fp8_weight_gather", [](RunConfig& c) -> bool& { return c.distributed.fp8_weight_gather; },
        "With the optimizer state sharded: gather the updated weights of the layers whose GEMMs all run in "
        "FP8 as their FP8 codes (1 byte an element), each rank casting its shard with the scale of the whole "
        "weight's amax over every rank; the same codes as a cast after a float32 gather, so the same "
        "training bit for bit. false: every parameter gathered in float32 (4 bytes)."));
    k.push_back(boolean(
        "distributed.reshard_after_forward",
        [](RunConfig& c) -> bool& { return c.distributed.reshard_after_forward; },
        "With FP8 weight gathers: fully sharded weights. The copies made from the gathered FP8 codes are "
        "given back as soon as the forward, and then the backward, is done with their block, and gathered "
        "again before the backward (and each micro-batch's forward) reads them: each GPU holds the FP8 "
        "weights of a block or two instead of every one, for one more gather of the codes per pass. The "
        "same training, bit for bit. Needs fp8_weight_gather = true."));
    k.push_back(boolean(
        "distributed.sparse_embedding_sums",
        [](RunConfig& c) -> bool& { return c.distributed.sparse_embedding_sums; },
        "Sum an untied token embedding's gradient (Llama with model.tie_embeddings = false) over the rows "
        "that some rank's tokens of the step read only: the same result, a fraction of its bytes "
        "(docs/distributed.md). Not with sharded_gradient_sums = \"reduce_scatter\", which sums every row."));
    // [data]
    k.push_back(text(
        "data.dir", [](const RunConfig& c) { return c.data_dir.string(); },
        [](RunConfig& c, std::string v) { c.data_dir = std::move(v); },
        "Directory of the token shards (train_*.bin, val_*.bin), as `octet data prepare` writes them."));
    k.push_back(choice<std::string>(
        "data.tokenizer", [](RunConfig& c) -> std::string& { return c.tokenizer; },
        {{"bytes", "bytes"}, {"gpt2", "gpt2"}, {"llama3", "llama3"}},
        "The tokenizer the shards were made with."));
    k.push_back(integer<int64_t>(
        "data.eval_every", [](RunConfig& c) -> int64_t& { return c.eval_every; }, 0, big,
        "Steps between validation losses; 0: at the end only."));
    k.push_back(integer<int64_t>(
        "data.eval_batches", [](RunConfig& c) -> int64_t& { return c.eval_batches; }, 1, kMaxBatch,
        "Batches of the validation split per validation loss."));
    // [checkpoint]
    k.push_back(integer<int64_t>(
        "checkpoint.every", [](RunConfig& c) -> int64_t& { return c.checkpoint_every; }, 0, big,
        "Steps between checkpoints; 0: at the end and on interruption only."));
    k.push_back(integer<int64_t>(
        "checkpoint.keep_last", [](RunConfig& c) -> int64_t& { return c.keep_last; }, 1, big,
        "Checkpoints kept; older ones are deleted after a successful save."));
    // [logging]
    k.push_back(text(
        "logging.run_dir", [](const RunConfig& c) { return c.run_dir.string(); },
        [](RunConfig& c, std::string v) { c.run_dir = std::move(v); },
        "Where the run writes its metrics, precision map, resolved config and checkpoints."));
    k.push_back(integer<int64_t>(
        "logging.log_every", [](RunConfig& c) -> int64_t& { return c.log_every; }, 1, big,
        "Steps between progress lines when the output is not a terminal."));
    // [telemetry]
    k.push_back(boolean(
        "telemetry.enabled", [](RunConfig& c) -> bool& { return c.telemetry.enabled; },
        "Record per-step metrics and FP8 tensor statistics in RUN_DIR/telemetry.sqlite and raise FP8 alerts "
        "(docs/telemetry.md)."));
    k.push_back(integer<int64_t>(
        "telemetry.interval", [](RunConfig& c) -> int64_t& { return c.telemetry.interval; }, 1, big,
        "Steps between records of every FP8 tensor's amax, scale, saturation and underflow (and alert "
        "checks)."));
    k.push_back(boolean(
        "telemetry.sqnr", [](RunConfig& c) -> bool& { return c.telemetry.sqnr; },
        "Also measure each FP8 cast's signal-to-quantization-noise ratio (a dequantizing pass per cast)."));
    // [profiling]
    k.push_back(boolean(
        "profiling.enabled", [](RunConfig& c) -> bool& { return c.profiling.enabled; },
        "Record every GPU kernel of the steps start_step to end_step through CUPTI into trace_dir "
        "(kernels.jsonl, trace.json, summary.json; `octet inspect RUN_DIR --kernels`); needs the CUDA "
        "backend (docs/gpu.md)."));
    k.push_back(integer<int64_t>(
        "profiling.start_step", [](RunConfig& c) -> int64_t& { return c.profiling.start_step; }, 1, big,
        "The first optimizer step profiled (1-based; step 1 carries one-off work)."));
    k.push_back(integer<int64_t>(
        "profiling.end_step", [](RunConfig& c) -> int64_t& { return c.profiling.end_step; }, 1, big,
        "The last optimizer step profiled (included); at least start_step and at most train.steps."));
    k.push_back(text(
        "profiling.trace_dir", [](const RunConfig& c) { return c.profiling.trace_dir.string(); },
        [](RunConfig& c, std::string v) { c.profiling.trace_dir = std::move(v); },
        "Where the trace is written; a relative path is relative to the run directory."));
    return k;
  }();
  return table;
}

}  // namespace octet::config_detail
