// A precision map file: which linear layers run in FP8 and which stay in BF16, and why, as `octet localize`
// chose them from measurements (each layer's cast numerics, its sensitivity, its gain), with those
// measurements beside the choice. Read back by the precision policy (fp8.precision_map), which runs the
// layers the map sets to BF16 in BF16 with the map's reason. JSON (docs/localization.md): deterministic for
// the same inputs, and refused, with the file named, wherever it does not fit the model that reads it.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "octet/model/config.h"
#include "octet/model/precision_policy.h"

namespace octet {

inline constexpr std::string_view kPrecisionMapFormat = "octet-precision-map";
inline constexpr int kPrecisionMapVersion = 1;
inline constexpr int64_t kMaxPrecisionMapBytes = int64_t{64} << 20;

// What one FP8 cast of an operand did over the localization batches (every layer in FP8): the SQNR of the
// cast in dB (signal over quantization-noise energy; null where there was no noise or no signal), the
// fraction of its elements that saturated, and the fraction of its non-zero elements that became zero.
struct CastNumerics {
  std::optional<double> sqnr_db;
  double saturated = 0.0;
  double underflowed = 0.0;
};

// How the model reacts to this layer's precision over the fixed batches (forward and backward, no update):
// (a) the layer alone in FP8 against every layer in BF16, (b) the layer alone in BF16 against every layer in
// FP8. Each: the relative change of the mean loss ((loss - reference) / reference) and the cosine between the
// weight gradients of the variant and of the reference: this layer's, and every linear layer's concatenated.
struct SensitivityCompared {
  double loss_change = 0.0;
  double layer_gradient_cosine = 1.0;
  double all_gradient_cosine = 1.0;
};

struct LocalizedLayer {
  std::string name;  // as the precision policy names it
  int64_t in_features = 0;
  int64_t out_features = 0;
  // Empty where the layer was measured; otherwise why the precision policy keeps it out of FP8.
  std::string excluded;
  bool fp8 = false;                      // the choice (measured layers only)
  std::string reason;                    // why, e.g. "bf16: loss +0.8% alone in FP8, over the budget of 0.5%"
  std::array<CastNumerics, 3> numerics;  // activation, weight, gradient
  SensitivityCompared alone_in_fp8;
  SensitivityCompared alone_in_bf16;
  // Per micro-batch, the three GEMMs in BF16, in FP8, and the FP8 casts (layer_gain.h).
  double bf16_ms = 0.0;
  double fp8_gemm_ms = 0.0;
  double fp8_cast_ms = 0.0;
};

struct PrecisionMapFile {
  std::string octet_version;
  std::string data_dir;
  std::string model_description;
  // The model's shape keys (name, JSON text), compared key by key with a reading run's model.
  std::vector<std::pair<std::string, std::string>> model_shape;
  std::string init_from;
  int64_t batches = 0;
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::string recipe;                  // the recipe the FP8 variants ran with, in words
  double budget = 0.0;                 // the allowed predicted loss change, a fraction (0.005: 0.5%)
  std::string predictor;               // how the loss change of a set of FP8 layers is predicted, in words
  std::string gain_basis;              // measured or modelled (LayerGainMeter::basis)
  double loss_bf16 = 0.0;              // mean loss, every layer in BF16
  double loss_fp8 = 0.0;               // every measured layer in FP8
  double loss_chosen = 0.0;            // the chosen layers in FP8, the others in BF16: measured
  double predicted_loss_change = 0.0;  // of the chosen set
  double saving_ms = 0.0;              // of the chosen set, per micro-batch
  std::vector<LocalizedLayer> layers;  // every linear layer of the model, in the policy's order
};

// The file's text: JSON, keys in a fixed order, numbers written so that they read back to the same double.
std::string precision_map_file_json(const PrecisionMapFile& map);
// Parses and validates; a refusal (octet::Error, invalid input) names `origin` and what was wrong.
PrecisionMapFile parse_precision_map_file(std::string_view text, std::string_view origin);
PrecisionMapFile read_precision_map_file(const std::filesystem::path& path);

// The layers of `layers` (a policy's plans) that the map sets to BF16, with the reason each takes, in the
// order of `layers` (nullopt: the map leaves the layer as the policy has it). Refused (invalid input,
// naming `origin`) where the map was made for another model (a shape key differs), a layer of the model is
// missing from it or one of it is missing from the model, a layer's shape differs, or a layer that runs in
// FP8 here was excluded when the map was made.
std::vector<std::optional<std::string>> precision_map_moves(const PrecisionMapFile& map,
                                                            std::string_view origin, const ModelConfig& model,
                                                            const std::vector<LinearPlan>& layers);

}  // namespace octet
