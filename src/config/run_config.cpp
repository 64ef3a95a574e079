// Parsing and validation of run configurations (see run_config.h). One table of keys: each knows its type,
// its valid values, how to set it from a TOML node and how to print it back.
#define TOML_HEADER_ONLY 1
#include "octet/config/run_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "octet/check.h"
#include "octet/io/input.h"
#include "toml_text_check.h"

namespace octet {
namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorKind::invalid_input, message);
}

// Input echoed into a message: cut short, control characters and invalid bytes escaped.
std::string shown(std::string_view s, size_t max_chars = 60) {
  return io::printable(s, max_chars);
}

// A string value in a message.
std::string quote(std::string_view s) {
  return fmt::format("\"{}\"", shown(s));
}

// A string as a TOML basic string that parses back to exactly `s` (quotes, backslashes and control
// characters escaped).
std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\u{:04X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string describe_node(const toml::node& n) {
  if (n.is_string()) return fmt::format("string {}", quote(*n.value<std::string>()));
  if (n.is_integer()) return fmt::format("integer {}", *n.value<int64_t>());
  if (n.is_floating_point()) return fmt::format("number {}", *n.value<double>());
  if (n.is_boolean()) return fmt::format("boolean {}", *n.value<bool>() ? "true" : "false");
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date or time";
}

// Numbers are float32 settings: the shortest text that reads back as the same float ("0.1", not
// "0.10000000149011612").
std::string format_number(float v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // keep it a TOML float
  return s;
}

// Bounds of string values: longer paths name nothing a file system holds, and octet's layer names are
// short. They also bound the text to_toml writes (escapes at most double a string).
constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxGlobs = 256;
constexpr size_t kMaxGlobBytes = 256;

struct Key {
  std::string name;  // section.key
  std::string type;
  std::string valid;
  std::string description;
  std::function<void(RunConfig&, const toml::node&, const std::string& where)> set;
  std::function<std::string(const RunConfig&)> get;
};

template <typename T>
Key integer(std::string name, std::function<T&(RunConfig&)> ref, int64_t lo, int64_t hi,
            std::string description) {
  std::string valid = hi == std::numeric_limits<int64_t>::max() ? fmt::format("at least {}", lo)
                                                                : fmt::format("{} to {}", lo, hi);
  return {
      name,
      "integer",
      valid,
      std::move(description),
      [=](RunConfig& c, const toml::node& n, const std::string& where) {
        if (!n.is_integer())
          fail(fmt::format("{}: {} must be an integer ({}), got {}", where, name, valid, describe_node(n)));
        const int64_t v = *n.value<int64_t>();
        if (v < lo || v > hi) fail(fmt::format("{}: {} must be {}, got {}", where, name, valid, v));
        ref(c) = static_cast<T>(v);
      },
      [=](const RunConfig& c) { return fmt::format("{}", ref(const_cast<RunConfig&>(c))); }};
}

Key number(std::string name, std::function<float&(RunConfig&)> ref, double lo, bool lo_open, double hi,
           bool hi_open, std::string description) {
  std::string valid;
  const bool unbounded = hi == std::numeric_limits<double>::infinity();
  if (unbounded) {
    valid = fmt::format("{} {}", lo_open ? "greater than" : "at least", lo);
  } else {
    valid = fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
  return {name,
          "number",
          valid,
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            if (!n.is_number())
              fail(fmt::format("{}: {} must be a number ({}), got {}", where, name, valid, describe_node(n)));
            const double v = *n.value<double>();
            // The setting is a float32: the range applies to the value it will hold, and a number that only
            // a double can hold (1e300, 1e-50) is refused rather than trained on as inf or 0.
            const float f = static_cast<float>(v);
            const double held = f;
            const bool ok = std::isfinite(held) && (lo_open ? held > lo : held >= lo) &&
                            (hi_open ? held < hi : held <= hi);
            if (!ok) {
              const std::string as_float =
                  std::isfinite(v) && held != v ? fmt::format(", which is {} as float32", f) : "";
              fail(fmt::format("{}: {} must be {}, got {}{}", where, name, valid, v, as_float));
            }
            ref(c) = f;
          },
          [=](const RunConfig& c) { return format_number(ref(const_cast<RunConfig&>(c))); }};
}

Key boolean(std::string name, std::function<bool&(RunConfig&)> ref, std::string description) {
  return {name,
          "boolean",
          "true or false",
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            if (!n.is_boolean())
              fail(fmt::format("{}: {} must be true or false, got {}", where, name, describe_node(n)));
            ref(c) = *n.value<bool>();
          },
          [=](const RunConfig& c) {
            return ref(const_cast<RunConfig&>(c)) ? std::string("true") : std::string("false");
          }};
}

Key text(std::string name, std::function<std::string(const RunConfig&)> get,
         std::function<void(RunConfig&, std::string)> put, std::string description) {
  return {name,
          "string",
          "a path: UTF-8 text without control characters, at most 4096 bytes",
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            if (!n.is_string())
              fail(fmt::format("{}: {} must be a string, got {}", where, name, describe_node(n)));
            const std::string value = *n.value<std::string>();
            if (value.size() > kMaxPathBytes) {
              fail(fmt::format("{}: {} is {} bytes long; a path has at most {}", where, name, value.size(),
                               kMaxPathBytes));
            }
            // A path that TOML cannot hold back, or that the file system would cut at a NUL, would make the
            // saved config.toml unreadable or name another file.
            const size_t invalid = io::first_invalid_utf8(value);
            if (invalid != std::string::npos) {
              fail(fmt::format("{}: {} is not valid UTF-8 (byte {} of the value); paths must be UTF-8 text",
                               where, name, invalid));
            }
            const auto control = std::find_if(value.begin(), value.end(), [](char ch) {
              return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7F;
            });
            if (control != value.end()) {
              fail(fmt::format(
                  "{}: {} holds a control character (byte {} of the value); paths must be printable text",
                  where, name, control - value.begin()));
            }
            put(c, value);
          },
          [=](const RunConfig& c) { return toml_string(get(c)); }};
}

template <typename E>
Key choice(std::string name, std::function<E&(RunConfig&)> ref,
           std::vector<std::pair<std::string, E>> options, std::string description) {
  std::string valid;
  for (size_t i = 0; i < options.size(); ++i) valid += (i ? ", " : "") + quote(options[i].first);
  return {name,
          "string",
          "one of " + valid,
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            const std::string seen = n.is_string() ? quote(*n.value<std::string>()) : describe_node(n);
            if (n.is_string()) {
              for (const auto& [spelling, value] : options) {
                if (*n.value<std::string>() == spelling) {
                  ref(c) = value;
                  return;
                }
              }
            }
            fail(fmt::format("{}: {} = {} is not valid; expected one of {}", where, name, seen, valid));
          },
          [=](const RunConfig& c) {
            for (const auto& [spelling, value] : options) {
              if (ref(const_cast<RunConfig&>(c)) == value) return toml_string(spelling);
            }
            return std::string("\"?\"");
          }};
}

Key strings(std::string name, std::function<std::vector<std::string>&(RunConfig&)> ref,
            std::string description) {
  return {name,
          "list of strings",
          "up to 256 layer-name globs such as \"h.0.*\" or \"*.mlp.*\", each at most 256 bytes",
          std::move(description),
          [=](RunConfig& c, const toml::node& n, const std::string& where) {
            const toml::array* a = n.as_array();
            if (a == nullptr)
              fail(fmt::format("{}: {} must be a list of strings, got {}", where, name, describe_node(n)));
            if (a->size() > kMaxGlobs) {
              fail(fmt::format("{}: {} holds {} globs; at most {} are allowed", where, name, a->size(),
                               kMaxGlobs));
            }
            std::vector<std::string> out;
            for (const toml::node& e : *a) {
              if (!e.is_string())
                fail(fmt::format("{}: {} must hold strings only, got {}", where, name, describe_node(e)));
              const std::string value = *e.value<std::string>();
              const size_t invalid = io::first_invalid_utf8(value);
              if (invalid != std::string::npos) {
                fail(fmt::format("{}: {} holds a string that is not valid UTF-8 (byte {} of {})", where, name,
                                 invalid, quote(value)));
              }
              const bool control = std::any_of(value.begin(), value.end(), [](char ch) {
                return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7F;
              });
              if (value.size() > kMaxGlobBytes || control) {
                fail(fmt::format("{}: {} holds {}; a glob is printable text of at most {} bytes", where, name,
                                 quote(value), kMaxGlobBytes));
              }
              out.push_back(value);
            }
            ref(c) = std::move(out);
          },
          [=](const RunConfig& c) {
            std::string s = "[";
            const auto& v = ref(const_cast<RunConfig&>(c));
            for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_string(v[i]);
            return s + "]";
          }};
}

// Upper bounds of the shape keys, so that no size derived from them overflows (check_sizes bounds their
// products). Token ids are int32 in batches and shards.
constexpr int64_t kMaxTokenId = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxSequence = int64_t{1} << 20;
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxHeads = int64_t{1} << 16;
constexpr int64_t kMaxExperts = 256;
constexpr int64_t kMaxChannels = int64_t{1} << 20;
constexpr int64_t kMaxBatch = int64_t{1} << 20;
// The most elements one buffer of a run may have (parameters, logits, activations, attention scores): far
// beyond any memory, and small enough that byte counts of several such buffers still fit in int64.
constexpr double kMaxElements = static_cast<double>(int64_t{1} << 56);

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
        "model.router_aux_loss_coef", [](RunConfig& c) -> float& { return c.model.router_aux_loss_coef; }, 0.0,
        false, inf, false,
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
        "gradient memory and traffic; accumulation over micro-batches then adds in bf16). bf16 needs "
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
    // [fp8]
    k.push_back(choice<RecipeKind>(
        "fp8.recipe", [](RunConfig& c) -> RecipeKind& { return c.precision.recipe; },
        {{"delayed", RecipeKind::delayed},
         {"current", RecipeKind::current},
         {"static", RecipeKind::static_scale},
         {"block", RecipeKind::block},
         {"mxfp8", RecipeKind::mxfp8}},
        "Scaling recipe (docs/fp8.md)."));
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
        {{"warn", AlertAction::warn}, {"bf16_layer", AlertAction::bf16_layer}, {"stop", AlertAction::stop}},
        "What an FP8 alert does besides one warning line and an event row: nothing (warn), run the layer's "
        "GEMMs in BF16 from the next step (bf16_layer), or save a checkpoint and stop with exit code 3 "
        "(docs/telemetry.md)."));
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
    // [data]
    k.push_back(text(
        "data.dir", [](const RunConfig& c) { return c.data_dir.string(); },
        [](RunConfig& c, std::string v) { c.data_dir = std::move(v); },
        "Directory of the token shards (train_*.bin, val_*.bin), as `octet data prepare` writes them."));
    k.push_back(choice<std::string>(
        "data.tokenizer", [](RunConfig& c) -> std::string& { return c.tokenizer; },
        {{"bytes", "bytes"}, {"gpt2", "gpt2"}, {"llama3", "llama3"}}, "The tokenizer the shards were made with."));
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
    return k;
  }();
  return table;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string nearest(std::string_view name, const std::vector<std::string>& candidates) {
  name = name.substr(0, 100);  // no key is longer; keeps a huge unknown name from taking quadratic time
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  return best;
}

const Key* find_key(std::string_view name) {
  for (const Key& k : keys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> sections() {
  std::vector<std::string> out;
  for (const Key& k : keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

void unknown_key(const std::string& where, const std::string& name) {
  std::vector<std::string> names;
  for (const Key& k : keys()) names.push_back(k.name);
  fail(fmt::format("{}: unknown key {}; did you mean {}? (docs/config.md lists every key)", where,
                   shown(name), nearest(name, names)));
}

void apply_table(RunConfig& config, const toml::table& root, const std::string& origin) {
  const std::vector<std::string> known_sections = sections();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const std::string where = fmt::format("{}:{}", origin, section_node.source().begin.line);
    const toml::table* table = section_node.as_table();
    if (table == nullptr) {
      fail(
          fmt::format("{}: {} is outside any section; keys belong in sections such as [train] (sections: {})",
                      where, shown(section), fmt::join(known_sections, ", ")));
    }
    if (std::find(known_sections.begin(), known_sections.end(), section) == known_sections.end()) {
      fail(fmt::format("{}: unknown section [{}]; did you mean [{}]? (sections: {})", where, shown(section),
                       nearest(section, known_sections), fmt::join(known_sections, ", ")));
    }
    for (const auto& [key, node] : *table) {
      const std::string name = section + "." + std::string(key.str());
      const std::string at = fmt::format("{}:{}", origin, node.source().begin.line);
      const Key* k = find_key(name);
      if (k == nullptr) unknown_key(at, name);
      k->set(config, node, at);
    }
  }
}

void apply_override(RunConfig& config, const std::string& assignment) {
  const std::string where = fmt::format("--set {}", shown(assignment, 100));
  // TOML would end the value at a line break and read what follows as more keys, or drop it.
  if (assignment.find_first_of("\n\r") != std::string::npos) {
    fail(fmt::format("{}: the value must be one line (it holds a line break)", where));
  }
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    fail(fmt::format("{}: expected section.key=value, e.g. --set train.mixed_precision=fp8", where));
  }
  const std::string name = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  const Key* k = find_key(name);
  if (k == nullptr) unknown_key(where, name);
  // The value in TOML syntax (1e-3, true, ["a"], "text"); a bare word that is not TOML is taken as a string.
  // Non-ASCII outside quotes is no TOML value, and must not reach the parser: a bare word.
  toml::table parsed;
  bool is_toml = check_toml_text("value = " + value, where) == 0;
  if (is_toml) {
    try {
      parsed = toml::parse("value = " + value);
    } catch (const toml::parse_error&) {
      is_toml = false;
    }
  }
  if (!is_toml) parsed = toml::table{{"value", value}};
  k->set(config, *parsed.get("value"), where);
}

void check_consistency(const RunConfig& c, const std::string& origin) {
  auto require = [&](bool ok, const std::string& message) {
    if (!ok) fail(fmt::format("{}: {}", origin, message));
  };
  require(c.model.channels % c.model.heads == 0,
          fmt::format("model.channels ({}) must be a multiple of model.heads ({})", c.model.channels,
                      c.model.heads));
  try {
    c.model.validate();
  } catch (const Error& e) {
    fail(fmt::format("{}: {}", origin, e.what()));
  }
  require(c.model.padded_vocab_size == 0 || c.model.padded_vocab_size >= c.model.vocab_size,
          fmt::format("model.padded_vocab_size ({}) must be 0 or at least model.vocab_size ({})",
                      c.model.padded_vocab_size, c.model.vocab_size));
  require(
      c.train.seq_len <= c.model.max_seq_len,
      fmt::format(
          "train.seq_len ({}) is longer than model.max_seq_len ({}): the model has no positions beyond it",
          c.train.seq_len, c.model.max_seq_len));
  require(c.train.schedule.warmup_steps <= c.steps,
          fmt::format("scheduler.warmup_steps ({}) is more than train.steps ({})",
                      c.train.schedule.warmup_steps, c.steps));
  require(!c.precision.bf16_weight_gradients || c.precision.mode == MixedPrecision::bf16 ||
              c.precision.mode == MixedPrecision::fp8,
          fmt::format("train.weight_gradients = \"bf16\" needs train.mixed_precision = \"bf16\" or \"fp8\" "
                      "(weight-gradient GEMMs that round to bf16), got \"{}\"",
                      mixed_precision_name(c.precision.mode)));
  require(c.telemetry.alert_scale_jump == 0.0f || c.telemetry.alert_scale_jump > 1.0f,
          fmt::format("fp8.alert_scale_jump ({}) must be 0 (never) or more than 1: a scale always moves by a "
                      "factor of at least 1",
                      c.telemetry.alert_scale_jump));
  // Each shape key is bounded; their products must be too (computed in double, which cannot overflow here).
  const double V = static_cast<double>(c.model.padded_vocab()), C = static_cast<double>(c.model.channels),
               L = static_cast<double>(c.model.layers), NH = static_cast<double>(c.model.heads),
               positions = static_cast<double>(c.model.max_seq_len),
               tokens = static_cast<double>(c.train.batch_size) * static_cast<double>(c.train.seq_len),
               T = static_cast<double>(c.train.seq_len);
  const double parameters = V * C + positions * C + L * (12 * C * C + 13 * C) + 2 * C;
  require(parameters <= kMaxElements,
          fmt::format("the model has {:.3g} parameters, more than the 2^56 octet can address; make "
                      "model.vocab_size, model.channels or model.layers smaller",
                      parameters));
  for (const auto& [what, count] :
       {std::pair{"logits (train.batch_size x train.seq_len x the padded vocabulary)", tokens * V},
        std::pair{"activations (train.batch_size x train.seq_len x model.channels x model.layers x 16)",
                  tokens * C * L * 16},
        std::pair{"attention scores (train.batch_size x train.seq_len^2 x model.heads x model.layers)",
                  tokens * T * NH * L}}) {
    require(
        count <= kMaxElements,
        fmt::format("a step needs {:.3g} {}, more than the 2^56 elements octet can address; make the batch, "
                    "the sequence or the model smaller",
                    count, what));
  }
  const int64_t tokenizer_vocab = c.tokenizer == "gpt2" ? 50257 : c.tokenizer == "llama3" ? 128256 : 256;
  require(c.model.vocab_size >= tokenizer_vocab,
          fmt::format("model.vocab_size ({}) is smaller than the {} tokenizer's vocabulary ({})",
                      c.model.vocab_size, c.tokenizer, tokenizer_vocab));
}

// Far more than any configuration needs; a bound on what is read and scanned.
constexpr size_t kMaxConfigBytes = size_t{1} << 20;

void finish(RunConfig& c) {
  c.train.schedule.total_steps = c.steps;
  c.train.loss_scale.dynamic = c.precision.mode == MixedPrecision::fp16;
}

}  // namespace

const std::vector<ConfigKeyInfo>& config_keys() {
  static const std::vector<ConfigKeyInfo> info = [] {
    std::vector<ConfigKeyInfo> out;
    const RunConfig defaults;
    for (const Key& k : keys()) out.push_back({k.name, k.type, k.get(defaults), k.valid, k.description});
    return out;
  }();
  return info;
}

RunConfig parse_run_config(std::string_view toml_text, std::string_view origin,
                           const std::vector<std::string>& overrides) {
  if (toml_text.size() > kMaxConfigBytes) {
    fail(fmt::format("{}: {} bytes, more than the {} a configuration may have", origin, toml_text.size(),
                     kMaxConfigBytes));
  }
  const int64_t non_ascii_line = check_toml_text(toml_text, std::string(origin));
  if (non_ascii_line != 0) {
    fail(
        fmt::format("{}:{}: not valid TOML: a non-ASCII character outside a string or comment (keys, numbers "
                    "and booleans are ASCII; put text in quotes)",
                    origin, non_ascii_line));
  }
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    fail(fmt::format("{}:{}:{}: not valid TOML: {}", origin, e.source().begin.line, e.source().begin.column,
                     shown(e.description(), 200)));
  }
  RunConfig config;
  apply_table(config, root, std::string(origin));
  for (const std::string& o : overrides) apply_override(config, o);
  check_consistency(config, std::string(origin));
  finish(config);
  return config;
}

RunConfig load_run_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  std::error_code error;
  if (std::filesystem::is_directory(file, error)) {
    fail(fmt::format("config file {} is a directory; CONFIG must be a TOML file (docs/config.md)",
                     shown(file.string(), 200)));
  }
  const std::string text = io::read_regular_file(file, "config file", kMaxConfigBytes);
  return parse_run_config(text, file.string(), overrides);
}

std::string to_toml(const RunConfig& config) {
  std::string out;
  std::string section;
  for (const Key& k : keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (s != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", s);
      section = s;
    }
    out += fmt::format("{} = {}\n", k.name.substr(k.name.find('.') + 1), k.get(config));
  }
  return out;
}

}  // namespace octet
