// `octet calibrate`'s run (calibration_run.h): the model in BF16 on an observing backend
// (calibration_observer.h), batches of the training split forward and backward, and the calibration from
// what was observed.
#include "octet/train/calibration_run.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "calibration_observer.h"
#include "octet/check.h"
#include "octet/io/data_loader.h"
#include "octet/model/model.h"
#include "octet/train/checkpoint.h"
#include "octet/train/training_run.h"
#include "octet/version.h"

namespace octet {
namespace {

void say(std::FILE* out, const std::string& line) {
  if (out == nullptr) return;
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

}  // namespace

std::filesystem::path default_calibration_path(const std::filesystem::path& config_file) {
  std::filesystem::path out = config_file;
  if (out.extension() == ".toml") out.replace_extension();
  out += ".calibration.json";
  return out;
}

std::vector<CalibratedLayer> calibrate_layers(Model& model, ObservingBackend& backend,
                                              const PrecisionPolicy& fp8_policy,
                                              const std::function<void(int32_t*, int32_t*)>& next_batch,
                                              const CalibrationPass& pass) {
  for (const Model::WeightCopySlot& slot : model.weight_copy_slots()) {
    if (!fp8_policy.layer(slot.layer).fp8()) continue;
    backend.watch(slot.exec, std::string(slot.layer));
    backend.add_weight(slot.exec, ConstTensorView(model.params() + slot.offset, {slot.rows, slot.cols}));
  }
  const int64_t B = pass.batch_size, T = pass.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  for (int64_t batch = 0; batch < pass.batches; ++batch) {
    next_batch(tokens.data(), targets.data());
    backend.begin_batch();
    model.zero_grad();
    const float loss = model.forward(tokens.data(), targets.data(), B, T, pass.dloss);
    model.backward(pass.dloss);
    backend.synchronize();
    say(pass.out, fmt::format("batch {}/{}: loss {:.4f}", batch + 1, pass.batches, loss));
  }
  const Fp8Formats formats = fp8_policy.formats();
  const std::array<Dtype, 3> format = {formats.activation, formats.weight, formats.gradient};
  std::vector<CalibratedLayer> layers;
  for (const LinearPlan& plan : fp8_policy.layers()) {
    CalibratedLayer layer;
    layer.name = plan.name;
    layer.in_features = plan.in_features;
    layer.out_features = plan.out_features;
    if (!plan.fp8()) {
      layer.excluded = plan.reason;
    } else {
      const std::array<OperandStatistics, 3> statistics = backend.statistics(plan.name);
      for (size_t k = 0; k < 3; ++k) {
        CalibratedOperand& o = layer.operands[k];
        o.format = format[k];
        o.statistics = statistics[k];
        o.scale = calibrated_scale(statistics[k].statistic(pass.statistic), format[k], pass.margin,
                                   pass.fallback_scale, &o.fallback);
      }
    }
    layers.push_back(std::move(layer));
  }
  return layers;
}

Calibration run_calibration(const RunConfig& config, const CalibrationOptions& options) {
  OCTET_REQUIRE(options.batches >= 1, "calibrate at least 1 batch, got {}", options.batches);
  OCTET_REQUIRE(!config.data_dir.empty(),
                "data.dir is not set: point it at shards made by `octet data prepare`");
  const int64_t B = config.train.batch_size, T = config.train.seq_len;

  // The model runs in BF16; the layers measured are those the policy would run in FP8 with these [fp8]
  // settings (the recipe aside: any per-tensor recipe converts the same layers).
  RunConfig bf16 = config;
  bf16.precision.mode = MixedPrecision::bf16;
  bf16.precision.calibration.clear();
  PrecisionSettings fp8_settings = config.precision;
  fp8_settings.mode = MixedPrecision::fp8;
  fp8_settings.recipe = RecipeKind::static_scale;
  fp8_settings.calibration.clear();
  const PrecisionPolicy fp8_policy(fp8_settings, config.model, B * T);

  io::DataLoader loader(config.data_dir, io::DataSplit::train,
                        io::DataLoaderOptions{B, T, true, config.seed, config.model.vocab_size});
  TrainingBackend device = make_training_backend(bf16);
  ObservingBackend backend(std::move(device.backend));
  const std::unique_ptr<Model> model =
      make_model(config.model, backend, PrecisionPolicy(bf16.precision, config.model, B * T), B, T);
  model->init_weights(config.seed);
  if (!options.init_from.empty()) {
    try {
      load_checkpoint_weights(options.init_from, *model);  // validates, then loads
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("--init-from {}: {}", options.init_from.string(), e.what()));
    }
  }
  say(options.out, device.device_line);
  say(options.out, fmt::format("octet {}: {}; calibrating {} of {} linear layers over {} batches of {} x {} "
                               "tokens in bf16 on the {} backend",
                               kVersion, model->describe(), fp8_policy.fp8_layer_count(),
                               fp8_policy.layers().size(), options.batches, B, T, backend.name()));
  CalibrationPass pass;
  pass.batches = options.batches;
  pass.batch_size = B;
  pass.seq_len = T;
  // The gradient training would see: the mean loss over a step of train.grad_accum_steps micro-batches.
  pass.dloss = 1.0f / static_cast<float>(B * T * config.train.grad_accum_steps);
  pass.statistic = options.statistic;
  pass.margin = config.precision.margin;
  pass.fallback_scale = config.precision.static_scale;
  pass.out = options.out;
  Calibration c;
  c.octet_version = kVersion;
  c.data_dir = config.data_dir.string();
  c.model_description = config.model.describe();
  c.model = config.model;
  c.init_from = options.init_from.string();
  c.batches = options.batches;
  c.batch_size = B;
  c.seq_len = T;
  c.statistic = options.statistic;
  c.margin = config.precision.margin;
  c.layers = calibrate_layers(
      *model, backend, fp8_policy,
      [&](int32_t* tokens, int32_t* targets) {
        loader.next_batch({tokens, static_cast<size_t>(B * T)}, {targets, static_cast<size_t>(B * T)});
      },
      pass);
  int64_t fallbacks = 0, non_finite = 0;
  for (const CalibratedLayer& l : c.layers) {
    for (const CalibratedOperand& o : l.operands) {
      fallbacks += l.excluded.empty() && o.fallback ? 1 : 0;
      non_finite += o.statistics.non_finite;
    }
  }
  if (non_finite > 0) {
    say(options.out, fmt::format("WARNING: {} Inf or NaN value(s) in the layers' operands, left out of the "
                                 "statistics: the model diverges in bf16 on this data",
                                 non_finite));
  }
  if (fallbacks > 0) {
    say(options.out,
        fmt::format("{} operand(s) saw no non-zero value (an expert no token chose?): their scale "
                    "is fp8.static_scale = {}; calibrate more batches to measure them",
                    fallbacks, config.precision.static_scale));
  }
  return c;
}

}  // namespace octet
