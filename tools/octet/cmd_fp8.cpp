// See cmd_fp8.h. Option values are validated here rather than by CLI11 validators so that every invalid value
// gets the same kind of message: what was given, for which option, and what is valid.
#include "cmd_fp8.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "io.h"
#include "number_format.h"
#include "number_parse.h"
#include "octet/check.h"
#include "octet/numerics/format.h"
#include "octet/numerics/quantize.h"
#include "octet/numerics/scaling.h"

namespace octet::cli {
namespace {

constexpr Dtype kFormats[] = {Dtype::e4m3, Dtype::e5m2};

std::string valid_formats() {
  return fmt::format("{}, {}", dtype_name(kFormats[0]), dtype_name(kFormats[1]));
}

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorKind::invalid_input, message);
}

Dtype parse_fp8_format(const std::string& text) {
  const std::optional<Dtype> d = parse_dtype(text);
  if (!d || !is_fp8(*d)) {
    invalid(fmt::format("--format '{}' is not an FP8 format; valid formats: {}", quote_token(text),
                        valid_formats()));
  }
  return *d;
}

std::string formats_help() {
  std::string text = "Formats:\n";
  for (const Dtype d : kFormats) {
    const DtypeInfo& info = dtype_info(d);
    text +=
        fmt::format("  {}  largest finite {}, smallest normal {}, smallest subnormal {}, {}\n", info.name,
                    format_float(info.max_finite), format_float(info.min_normal),
                    format_float(info.min_subnormal), info.has_infinity ? "has inf" : "no inf (OCP E4M3FN)");
  }
  return text;
}

void append_hex_code(std::string& out, uint8_t code) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out += "0x";
  out.push_back(kDigits[code >> 4]);
  out.push_back(kDigits[code & 0xF]);
}

}  // namespace

Fp8Command::Fp8Command(CLI::App& parent) {
  fp8_ = parent.add_subcommand("fp8", "Show the FP8 formats and run values through octet's FP8 cast");
  fp8_->require_subcommand(0, 1);  // none: main prints this command's help; two: a usage error
  fp8_->footer(formats_help() +
               "\nExamples:\n"
               "  octet fp8 table --format e4m3\n"
               "  echo \"1 0.1 500 -3e-5 nan\" | octet fp8 quantize --format e4m3\n");

  table_ =
      fp8_->add_subcommand("table", "Print all 256 codes of an FP8 format with their values and classes");
  table_->add_option("--format", table_format_, "FP8 format to list: " + valid_formats())
      ->required()
      ->type_name("FORMAT");
  table_->footer(
      "Output: one line per code, 0x00 to 0xff: the code in hex, its value and its class (normal,\n"
      "subnormal, zero, inf, nan). Values are the shortest decimal text that reads back as exactly the\n"
      "same value; NaN prints as nan, infinities as inf and -inf, negative zero as -0.\n"
      "\n"
      "Examples:\n"
      "  octet fp8 table --format e4m3    (lines such as: 0x7e 448 normal)\n"
      "  octet fp8 table --format e5m2 | grep subnormal");

  quantize_ = fp8_->add_subcommand("quantize",
                                   "Cast float32 values from standard input to FP8; print codes and values");
  quantize_->add_option("--format", quantize_format_, "FP8 format to cast to: " + valid_formats())
      ->required()
      ->type_name("FORMAT");
  scale_option_ = quantize_->add_option(
      "--scale", scale_text_, "Multiply each value by S before the cast; S > 0, finite (default 1)");
  scale_option_->type_name("S");
  recipe_option_ =
      quantize_->add_option("--recipe", recipe_, "Derive the scale from the input instead; valid: current");
  recipe_option_->type_name("RECIPE");
  quantize_->add_flag("--no-saturate", no_saturate_,
                      "Out-of-range values become inf (e5m2) or nan (e4m3), not +-largest finite");
  quantize_->footer(
      "Each value x is cast as x * scale, rounded to nearest (ties to even). Out-of-range values\n"
      "(inf included) become +-largest finite unless --no-saturate is given. --recipe current uses\n"
      "scale = largest finite value of the format / amax, amax = max |x|; when amax is 0, inf or nan\n"
      "it cannot give a scale and the scale stays 1 (a note on standard error says so).\n"
      "--scale and --recipe exclude each other; with neither the scale is 1.\n"
      "\n"
      "Input: values separated by whitespace, each one of:\n"
      "  " +
      std::string(kNumberSyntax) +
      ".\n"
      "Values beyond float32's range read as +-inf (overflow) or +-0 (underflow), as strtof reads them.\n"
      "Input that is not a number stops the command before anything is printed.\n"
      "\n"
      "Output: one line per input value: the FP8 code in hex and the value it stands for,\n"
      "code value * scale_inv with scale_inv = 1 / scale (printed like octet fp8 table's values).\n"
      "Standard error gets one summary line:\n"
      "  summary: values=N format=F recipe=none|current scale=S scale_inv=I amax=A saturated=N\n"
      "           underflow=N nan=N\n"
      "saturated counts values beyond the largest finite value (inf inputs included; with\n"
      "--no-saturate they became inf or nan), underflow counts non-zero values that became zero, nan\n"
      "counts NaN inputs; amax is nan when any input is NaN.\n"
      "\n"
      "Examples:\n"
      "  echo \"1 0.1 500 -3e-5 nan\" | octet fp8 quantize --format e4m3\n"
      "  octet fp8 quantize --format e5m2 --scale 1024 < gradients.txt\n"
      "  octet fp8 quantize --format e4m3 --recipe current --no-saturate < activations.txt > codes.txt");
}

bool Fp8Command::leaf_selected() const {
  return table_->parsed() || quantize_->parsed();
}

void Fp8Command::run(std::FILE* in, std::FILE* out, std::FILE* err) const {
  if (table_->parsed()) {
    run_table(out);
  } else if (quantize_->parsed()) {
    run_quantize(in, out, err);
  } else {
    OCTET_CHECK(false, "run() called without a chosen fp8 subcommand");
  }
}

void Fp8Command::run_table(std::FILE* out) const {
  const Dtype format = parse_fp8_format(table_format_);
  std::string text;
  for (uint32_t code = 0; code < 256; ++code) {
    append_hex_code(text, static_cast<uint8_t>(code));
    text += ' ';
    append_float(text, decode(format, code));
    text += ' ';
    text += code_class_name(classify(format, code));
    text += '\n';
  }
  write_all(out, text, "standard output");
}

void Fp8Command::run_quantize(std::FILE* in, std::FILE* out, std::FILE* err) const {
  // Every argument is checked before standard input is read, so a bad option fails fast.
  const Dtype format = parse_fp8_format(quantize_format_);
  const bool use_recipe = recipe_option_->count() > 0;
  if (use_recipe && scale_option_->count() > 0) {
    invalid(
        "--scale and --recipe cannot be used together; give a fixed scale with --scale, or let --recipe "
        "current choose one, or neither for scale 1");
  }
  if (use_recipe && recipe_ != "current") {
    invalid(fmt::format("--recipe '{}' is not a known recipe; valid recipes: current", quote_token(recipe_)));
  }
  float scale = 1.0f;
  if (scale_option_->count() > 0) {
    const std::optional<float> parsed = parse_float32(scale_text_);
    if (!parsed || !is_valid_scale(*parsed)) {
      const std::string seen = parsed ? fmt::format(" (reads as {})", format_float(*parsed)) : "";
      invalid(
          fmt::format("--scale '{}'{} is not a positive finite number with a finite inverse; expected a "
                      "float32 literal such as 1, 3.75 or 1e-3, from about 2.9e-39 to 3.4e38",
                      quote_token(scale_text_), seen));
    }
    scale = *parsed;
  }
  CastOptions options;
  options.overflow = no_saturate_ ? Overflow::non_saturating : Overflow::saturate;

  const std::vector<float> values = parse_float32_stream(read_all(in, "standard input"), "standard input");
  const auto n = static_cast<int64_t>(values.size());

  QuantizedTensor q;
  float used_scale = scale;
  bool degenerate_amax = false;
  if (use_recipe) {
    const CurrentScaling recipe;
    ScalingState state = recipe.initial_state();
    q = quantize(values, 1, n, format, TensorRole::activation, recipe, state, options);
    // Current scaling derives the next scale from this cast's amax alone, so the state after the cast holds
    // the scale this cast used.
    used_scale = state.scale;
    degenerate_amax = state.degenerate_amax > 0;
  } else {
    q = quantize_with_scale(values, 1, n, format, scale, options);
  }
  const std::vector<float> dequantized = dequantize(q);
  OCTET_CHECK(
      dequantized.size() == values.size() && q.data.size() == values.size() && q.scale_inv.size() == 1,
      "{} codes, {} dequantized values and one scale_inv for {} inputs, got {}", q.data.size(),
      dequantized.size(), values.size(), q.scale_inv.size());

  std::string text;
  text.reserve(values.size() * 16);
  for (size_t i = 0; i < values.size(); ++i) {
    append_hex_code(text, q.data[i]);
    text += ' ';
    append_float(text, dequantized[i]);
    text += '\n';
  }
  std::string summary;
  if (degenerate_amax) {
    // A fallback is never silent: say why the scale is not the recipe's formula.
    summary += fmt::format(
        "octet fp8 quantize: note: amax is {}, from which --recipe current cannot derive a scale; scale 1 "
        "used\n",
        format_float(q.amax));
  }
  summary += fmt::format(
      "summary: values={} format={} recipe={} scale={} scale_inv={} amax={} saturated={} underflow={} "
      "nan={}\n",
      values.size(), dtype_name(format), use_recipe ? "current" : "none", format_float(used_scale),
      format_float(q.scale_inv[0]), format_float(q.amax), q.stats.saturated, q.stats.underflowed,
      q.stats.nan_inputs);
  write_all(out, text, "standard output");
  write_all(err, summary, "standard error");
}

}  // namespace octet::cli
