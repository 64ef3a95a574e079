// `octet localize`'s run (localization.h): the reference variants (every layer in BF16, every layer in FP8),
// two variants per measured layer, the gains, the choice, and the chosen set run once more to measure what
// the predictor predicted.
#include "octet/train/localization.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "localization_variants.h"
#include "octet/backend/registry.h"
#include "octet/check.h"
#include "octet/io/data_loader.h"
#include "octet/model/calibration.h"
#include "octet/train/checkpoint.h"
#include "octet/train/layer_chooser.h"
#include "octet/train/layer_gain.h"
#include "octet/train/training_run.h"
#include "octet/version.h"

namespace octet {
namespace {

void say(std::FILE* out, const std::string& line) {
  if (out == nullptr) return;
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

// (variant - reference) / reference; the largest double where the variant's loss is not finite, so that the
// layer never fits a budget.
double relative_change(double variant, double reference) {
  if (!std::isfinite(variant)) return std::numeric_limits<double>::max();
  return (variant - reference) / reference;
}

// The policy of `settings` with only the layers `keep` says in FP8; its other FP8 layers moved to BF16.
struct VariantPolicies {
  const PrecisionSettings& settings;
  const ModelConfig& model;
  int64_t tokens;
  template <typename Keep>
  PrecisionPolicy only(Keep keep) const {
    PrecisionPolicy p(settings, model, tokens);
    for (const LinearPlan& plan : std::vector<LinearPlan>(p.layers())) {
      if (plan.fp8() && !keep(plan.name)) p.move_layer_to_bf16(plan.name, "BF16 in this variant");
    }
    return p;
  }
};

CastNumerics numerics_of(const CastTelemetry& t) {
  CastNumerics n;
  if (t.elements > 0) n.saturated = static_cast<double>(t.saturated) / static_cast<double>(t.elements);
  if (t.nonzero > 0) n.underflowed = static_cast<double>(t.underflowed) / static_cast<double>(t.nonzero);
  if (t.signal_energy > 0.0 && t.noise_energy > 0.0)
    n.sqnr_db = 10.0 * std::log10(t.signal_energy / t.noise_energy);
  return n;
}

// `variant` was run against `reference` (VariantRunner::run); `layer` indexes the runner's ranges.
SensitivityCompared compare(const VariantResult& variant, const VariantResult& reference, size_t layer) {
  SensitivityCompared s;
  s.loss_change = relative_change(variant.loss, reference.loss);
  s.layer_gradient_cosine = variant.against.at(layer).cosine();
  CosineSums all;
  for (const CosineSums& sums : variant.against) all += sums;
  s.all_gradient_cosine = all.cosine();
  return s;
}

}  // namespace

std::filesystem::path default_precision_map_path(const std::filesystem::path& config_file) {
  std::filesystem::path out = config_file;
  if (out.extension() == ".toml") out.replace_extension();
  out += ".precision_map.json";
  return out;
}

PrecisionMapFile run_localization(const RunConfig& config, const LocalizationOptions& options) {
  OCTET_REQUIRE(options.batches >= 1, "localize over at least 1 batch, got {}", options.batches);
  OCTET_REQUIRE(std::isfinite(options.budget) && options.budget >= 0.0,
                "the budget must be a finite percentage of 0 or more, got {}", options.budget * 100.0);
  OCTET_REQUIRE(!config.data_dir.empty(),
                "data.dir is not set: point it at shards made by `octet data prepare`");
  const int64_t B = config.train.batch_size, T = config.train.seq_len;

  // Every variant runs in fp8 mode with the configuration's [fp8] settings, less what would choose layers
  // for it (a map, the auto filter); a delayed recipe is measured as current scaling (localization.h).
  RunConfig fp8 = config;
  PrecisionSettings& s = fp8.precision;
  s.mode = MixedPrecision::fp8;
  s.precision_map.clear();
  s.auto_filter = false;
  const bool delayed = s.recipe == RecipeKind::delayed;
  if (delayed) s.recipe = RecipeKind::current;
  if (s.recipe != RecipeKind::static_scale) s.calibration.clear();
  const PrecisionPolicy all_fp8(s, config.model, B * T);
  const VariantPolicies policies{s, config.model, B * T};

  io::DataLoader loader(config.data_dir, io::DataSplit::train,
                        io::DataLoaderOptions{B, T, true, config.seed, config.model.vocab_size});
  VariantBatches batches;
  batches.batch_size = B;
  batches.seq_len = T;
  batches.dloss = 1.0f / static_cast<float>(B * T * config.train.grad_accum_steps);
  for (int64_t b = 0; b < options.batches; ++b) {
    batches.tokens.emplace_back(static_cast<size_t>(B * T));
    batches.targets.emplace_back(static_cast<size_t>(B * T));
    loader.next_batch(batches.tokens.back(), batches.targets.back());
  }

  TrainingBackend device = make_training_backend(fp8);
  Backend& backend = *device.backend;
  std::vector<float> weights;
  std::string description;
  {
    const std::unique_ptr<Model> model =
        make_model(config.model, backend, policies.only([](const std::string&) { return false; }), B, T);
    model->init_weights(config.seed);
    if (!options.init_from.empty()) {
      try {
        load_checkpoint_weights(options.init_from, *model);
      } catch (const Error& e) {
        throw Error(e.kind(), fmt::format("--init-from {}: {}", options.init_from.string(), e.what()));
      }
    }
    if (options.prepare) options.prepare(*model);
    weights.resize(static_cast<size_t>(model->parameter_count()));
    backend.synchronize();
    backend.copy_to_host(weights.data(), model->params(), weights.size() * sizeof(float));
    description = model->describe();
  }
  const int64_t measured = all_fp8.fp8_layer_count();
  say(options.out, device.device_line);
  say(options.out, fmt::format("octet {}: {}; localizing {} of {} linear layers over {} batches of {} x {} "
                               "tokens on the {} backend ({} variants)",
                               kVersion, description, measured, all_fp8.layers().size(), options.batches, B,
                               T, backend.name(), 2 * measured + 3));
  VariantRunner runner(config.model, backend, batches, std::move(weights));

  const VariantResult bf16 = runner.run(policies.only([](const std::string&) { return false; }), false);
  const VariantResult fp8_all = runner.run(policies.only([](const std::string&) { return true; }), true);
  say(options.out,
      fmt::format("every layer in bf16: loss {:.6f}; every layer in fp8: loss {:.6f} ({})", bf16.loss,
                  fp8_all.loss, percent_change(relative_change(fp8_all.loss, bf16.loss))));
  OCTET_REQUIRE(std::isfinite(bf16.loss) && bf16.loss > 0.0,
                "the loss with every layer in BF16 is {}: nothing to measure against", bf16.loss);

  const BackendFactory* cuda = device.cuda ? find_backend("cuda") : nullptr;
  LayerGainMeter meter(cuda != nullptr ? cuda->device_bench() : nullptr, s, {}, options.gain_model);

  PrecisionMapFile map;
  std::vector<ChooserCandidate> candidates;
  std::vector<size_t> candidate_layer;
  for (const LinearPlan& plan : all_fp8.layers()) {
    LocalizedLayer layer;
    layer.name = plan.name;
    layer.in_features = plan.in_features;
    layer.out_features = plan.out_features;
    if (!plan.fp8()) {
      layer.excluded = plan.reason;
      map.layers.push_back(std::move(layer));
      continue;
    }
    const std::vector<GradientRange>& ranges = runner.ranges();
    const auto range = static_cast<size_t>(
        std::find_if(ranges.begin(), ranges.end(), [&](const GradientRange& r) { return r.layer == plan.name; }) -
        ranges.begin());
    OCTET_CHECK(range < ranges.size(), "the weight gradient of layer {}", plan.name);
    const auto t = fp8_all.telemetry.find(plan.name);
    if (t != fp8_all.telemetry.end()) {
      layer.numerics = {numerics_of(t->second.activation), numerics_of(t->second.weight),
                        numerics_of(t->second.gradient)};
    }
    const VariantResult alone_fp8 =
        runner.run(policies.only([&](const std::string& n) { return n == plan.name; }), false, &bf16);
    const VariantResult alone_bf16 =
        runner.run(policies.only([&](const std::string& n) { return n != plan.name; }), false, &fp8_all);
    layer.alone_in_fp8 = compare(alone_fp8, bf16, range);
    layer.alone_in_bf16 = compare(alone_bf16, fp8_all, range);
    const LayerGain gain = meter.gain({B * T, plan.in_features, plan.out_features});
    layer.bf16_ms = gain.bf16_ms;
    layer.fp8_gemm_ms = gain.fp8_gemm_ms;
    layer.fp8_cast_ms = gain.fp8_cast_ms;
    say(options.out, fmt::format("{}: loss {} alone in fp8, {} alone in bf16", plan.name,
                                 percent_change(layer.alone_in_fp8.loss_change),
                                 percent_change(layer.alone_in_bf16.loss_change)));
    candidates.push_back({plan.name, layer.alone_in_fp8.loss_change, gain.saving_ms()});
    candidate_layer.push_back(map.layers.size());
    map.layers.push_back(std::move(layer));
  }

  const LayerChoice choice = choose_fp8_layers(candidates, options.budget);
  for (size_t i = 0; i < candidates.size(); ++i) {
    LocalizedLayer& layer = map.layers[candidate_layer[i]];
    layer.fp8 = choice.decisions[i].fp8;
    layer.reason = choice.decisions[i].reason;
  }
  const VariantResult chosen = runner.run(policies.only([&](const std::string& n) {
    for (const LocalizedLayer& l : map.layers) {
      if (l.name == n) return l.fp8;
    }
    return false;
  }),
                                          false, &bf16);

  map.octet_version = kVersion;
  map.data_dir = config.data_dir.string();
  map.model_description = config.model.describe();
  map.model_shape = model_shape_keys(config.model);
  map.init_from = options.init_from.string();
  map.batches = options.batches;
  map.batch_size = B;
  map.seq_len = T;
  map.recipe = all_fp8.startup_line().substr(0, all_fp8.startup_line().find(';'));
  map.recipe = map.recipe.substr(map.recipe.find("recipe=") + 7);
  if (delayed) map.recipe += ", measured as current scaling in place of the configured delayed recipe";
  map.budget = options.budget;
  map.predictor =
      "the sum over the FP8 layers of each layer's relative loss change alone in FP8 (negative counted as "
      "0); "
      "greedy by time saved per unit of that change";
  map.gain_basis = meter.basis();
  map.loss_bf16 = bf16.loss;
  map.loss_fp8 = fp8_all.loss;
  map.loss_chosen = chosen.loss;
  map.predicted_loss_change = choice.predicted_loss_change;
  map.saving_ms = choice.saving_ms;
  return map;
}

}  // namespace octet
