// A calibration file: the FP8 scales of every linear layer's operands (activation, weight, output gradient),
// chosen from statistics that `octet calibrate` measured over batches of representative data, and read back
// by the static recipe (fp8.calibration) so that each layer casts with its own scales. The file is JSON
// (docs/localization.md): deterministic for the same inputs, and refused, with the file named, wherever it
// does not fit the model that reads it.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "octet/backend/precision.h"
#include "octet/model/config.h"
#include "octet/model/precision_policy.h"

namespace octet {

inline constexpr std::string_view kCalibrationFormat = "octet-fp8-calibration";
inline constexpr int kCalibrationVersion = 1;
// A calibration file is a few hundred bytes a layer; anything larger than this is refused unread.
inline constexpr int64_t kMaxCalibrationBytes = int64_t{256} << 20;

// Which statistic of an operand's magnitudes chooses its scale: the largest (no value saturates on the data
// calibrated), or an upper percentile (the few values above it saturate; the others keep more precision).
enum class CalibrationStatistic : uint8_t { amax, p99, p99_9, p99_99 };
std::string_view calibration_statistic_name(CalibrationStatistic statistic);  // "amax", "p99", "p99.9", ...
std::optional<CalibrationStatistic> parse_calibration_statistic(std::string_view name);

// What the values of one operand looked like over the calibration batches. Percentiles are over the finite
// non-zero magnitudes (zeros never decide a scale, and padding rows are zeros): the k-th smallest with
// k = ceil(q * nonzero), given as the lower edge of its bin in a histogram of float32 magnitudes with 16 bins
// per power of two, so a magnitude with at most four significant bits (1, 1.5, 3, 0.75, ...) is given
// exactly, any other up to 1/16 of itself low. amax is exact.
struct OperandStatistics {
  int64_t values = 0;      // elements seen
  int64_t zeros = 0;       // of them exactly zero
  int64_t non_finite = 0;  // of them Inf or NaN (left out of every statistic)
  float amax = 0.0f;       // the largest finite magnitude
  float p99 = 0.0f;
  float p99_9 = 0.0f;
  float p99_99 = 0.0f;
  float statistic(CalibrationStatistic which) const;
};

// One operand's calibration: its FP8 format, its statistics, and the scale the static recipe casts it with.
struct CalibratedOperand {
  Dtype format = Dtype::e4m3;
  OperandStatistics statistics;
  float scale = 1.0f;
  // True where the chosen statistic was 0 (no non-zero finite value seen: an expert no token chose): the
  // scale is then fp8.static_scale.
  bool fallback = false;
};

enum class OperandIndex : uint8_t { activation = 0, weight = 1, gradient = 2 };
inline constexpr std::array<std::string_view, 3> kOperandNames = {"activation", "weight", "gradient"};

struct CalibratedLayer {
  std::string name;  // as the precision policy names it: "h.0.attn.c_attn", "layers.3.mlp.down_proj"
  int64_t in_features = 0;
  int64_t out_features = 0;
  // Empty where the layer was calibrated; otherwise why the precision policy keeps it out of FP8 (its
  // operands are then not measured).
  std::string excluded;
  std::array<CalibratedOperand, 3> operands;  // activation, weight, gradient (OperandIndex)
};

struct Calibration {
  std::string octet_version;
  std::string data_dir;           // the data.dir the batches came from
  std::string model_description;  // ModelConfig::describe()
  ModelConfig model;              // its shape (written as the shape keys below)
  // The shape keys as the file holds them (name, JSON value), which a run that reads the file compares with
  // its model's, key by key; filled by parse_calibration.
  std::vector<std::pair<std::string, std::string>> model_shape;
  std::string init_from;   // the checkpoint whose weights were calibrated; empty: the initialisation
  int64_t batches = 0;     // of the training split, in the loader's order from the start
  int64_t batch_size = 0;  // B
  int64_t seq_len = 0;     // T
  CalibrationStatistic statistic = CalibrationStatistic::amax;
  int margin = 0;                       // scale = fp8_max / (statistic * 2^margin)
  std::vector<CalibratedLayer> layers;  // every linear layer of the model, in the policy's order
};

// The shape keys a file made for a model is compared on (calibration, precision map): what decides the
// linear layers and their sizes, each as (name, value as JSON text).
std::vector<std::pair<std::string, std::string>> model_shape_keys(const ModelConfig& model);

// scale = fp8_max(format) / (statistic * 2^margin), as the delayed recipe's scale_from_amax; a statistic of
// 0 gives `fallback` and sets *fell_back.
float calibrated_scale(float statistic, Dtype format, int margin, float fallback, bool* fell_back);

// The file's text: JSON, keys in a fixed order, numbers written so that they read back to the same float32.
std::string calibration_json(const Calibration& calibration);
// Parses and validates a calibration file's text; a refusal (octet::Error, invalid input) names `origin` and
// what was wrong: not JSON, another format or version, a missing or mistyped field, a scale that is not a
// positive finite float32 with a finite inverse, a layer twice.
Calibration parse_calibration(std::string_view text, std::string_view origin);
// The same from a file (a regular file of at most kMaxCalibrationBytes).
Calibration read_calibration_file(const std::filesystem::path& path);

// The scales of each FP8 layer of `layers` (a policy's plans) from `calibration`, in the order of `layers`
// (layers not in FP8 get none). Refused (invalid input, naming `origin`) where the calibration was made for
// another model (a shape key differs, named with both values), a layer of the model is missing from it or
// one of it is missing from the model, a layer's shape differs, an FP8 layer was not calibrated (excluded
// then), or an operand's format is not the one `formats` casts it to.
std::vector<std::optional<std::array<float, 3>>> calibrated_scales(const Calibration& calibration,
                                                                   std::string_view origin,
                                                                   const ModelConfig& model,
                                                                   const std::vector<LinearPlan>& layers,
                                                                   const Fp8Formats& formats);

}  // namespace octet
