// The variants `octet localize` compares, internal to src/train/localization*.cpp: the same weights and the
// same batches run forward and backward (no update) on a fresh model built with a given precision policy,
// giving the mean loss, the linear layers' weight gradients on the host (a reference) or the sums behind
// their cosines against a reference's, and, when asked, the FP8 casts' telemetry of every FP8 layer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cosine_sums.h"
#include "octet/backend/backend.h"
#include "octet/config/run_config.h"
#include "octet/model/model.h"

namespace octet {

struct VariantBatches {
  int64_t batch_size = 1;  // B
  int64_t seq_len = 1;     // T
  float dloss = 1.0f;      // the gradient the backward starts from: 1 / (B T train.grad_accum_steps)
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int32_t>> targets;
};

// Where a linear layer's weight gradient lies in a variant's concatenated gradients.
struct GradientRange {
  std::string layer;
  size_t begin = 0;
  size_t count = 0;
};

struct VariantResult {
  double loss = 0.0;  // the mean over the batches
  // A reference run's linear-layer weight gradients, in GradientRange order; empty for a run compared
  // against a reference.
  std::vector<float> gradients;
  // A compared run's sums against the reference, one per GradientRange.
  std::vector<CosineSums> against;
  std::map<std::string, Fp8LinearTelemetry> telemetry;  // per FP8 layer, when asked for
};

class VariantRunner {
 public:
  // `weights`: a host copy of the parameters every variant starts from.
  VariantRunner(const ModelConfig& model, Backend& backend, const VariantBatches& batches,
                std::vector<float> weights);
  // Runs the batches with `policy`; with `measure_numerics`, each FP8 cast's saturation, underflow and SQNR
  // are collected too. Without `reference` the result keeps the gradients (a reference for later runs);
  // with one it keeps only the cosine sums against the reference's gradients, layer by layer. The sums are
  // taken on several host threads in fixed chunks added in order, so they do not depend on the number of
  // threads.
  VariantResult run(PrecisionPolicy policy, bool measure_numerics, const VariantResult* reference = nullptr);
  // Valid after the first run.
  const std::vector<GradientRange>& ranges() const { return ranges_; }

 private:
  ModelConfig model_;
  Backend& backend_;
  const VariantBatches& batches_;
  std::vector<float> weights_;
  std::vector<GradientRange> ranges_;
};

}  // namespace octet
