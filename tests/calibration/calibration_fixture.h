// A calibration made up for a model without running one: every layer its precision policy (in fp8 mode,
// static recipe) runs in FP8 gets the scales `scales(layer index)` and plausible statistics, the others are
// listed as excluded.
#pragma once

#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "octet/model/calibration.h"
#include "octet/version.h"

namespace octet::testing {

inline Calibration made_up_calibration(const ModelConfig& model, PrecisionSettings settings, int64_t tokens,
                                       const std::function<std::array<float, 3>(size_t)>& scales) {
  settings.mode = MixedPrecision::fp8;
  settings.recipe = RecipeKind::static_scale;
  settings.calibration.clear();
  const PrecisionPolicy policy(settings, model, tokens);
  Calibration c;
  c.octet_version = kVersion;
  c.data_dir = "data/planted";
  c.model_description = model.describe();
  c.model = model;
  c.batches = 2;
  c.batch_size = 2;
  c.seq_len = tokens / 2;
  const Fp8Formats f = policy.formats();
  const std::array<Dtype, 3> formats = {f.activation, f.weight, f.gradient};
  for (size_t i = 0; i < policy.layers().size(); ++i) {
    const LinearPlan& p = policy.layers()[i];
    CalibratedLayer l;
    l.name = p.name;
    l.in_features = p.in_features;
    l.out_features = p.out_features;
    if (!p.fp8()) {
      l.excluded = p.reason;
    } else {
      const std::array<float, 3> s = scales(i);
      for (size_t k = 0; k < 3; ++k) {
        l.operands[k].format = formats[k];
        l.operands[k].scale = s[k];
        l.operands[k].statistics = {100, 3, 0, 448.0f / s[k], 1.0f, 1.5f, 2.0f};
      }
    }
    c.layers.push_back(std::move(l));
  }
  return c;
}

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace octet::testing
