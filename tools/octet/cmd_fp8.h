// `octet fp8`: commands that show the FP8 formats and run values through octet's FP8 cast.
//   octet fp8 table --format e4m3|e5m2
//   octet fp8 quantize --format e4m3|e5m2 [--scale S | --recipe current] [--no-saturate]
// This file only wires the command line to the library's public API (format.h, quantize.h, scaling.h);
// every number the commands print comes from the library.
#pragma once

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

namespace octet::cli {

// Owns the option values that CLI11 writes into, so it must outlive parsing and never move.
class Fp8Command {
 public:
  // Registers `fp8` and its subcommands under `parent`.
  explicit Fp8Command(CLI::App& parent);
  Fp8Command(const Fp8Command&) = delete;
  Fp8Command& operator=(const Fp8Command&) = delete;

  // After parsing: whether `fp8 table` or `fp8 quantize` was chosen.
  bool leaf_selected() const;

  // Runs the chosen subcommand, writing results to `out` and the quantize summary to `err`. Throws
  // octet::Error for invalid arguments or input (before anything is written to `out`) and IoError when a
  // stream fails.
  void run(std::FILE* in, std::FILE* out, std::FILE* err) const;

 private:
  void run_table(std::FILE* out) const;
  void run_quantize(std::FILE* in, std::FILE* out, std::FILE* err) const;

  CLI::App* fp8_ = nullptr;
  CLI::App* table_ = nullptr;
  CLI::App* quantize_ = nullptr;
  CLI::Option* scale_option_ = nullptr;
  CLI::Option* recipe_option_ = nullptr;
  std::string table_format_;
  std::string quantize_format_;
  // Kept as text and parsed by number_parse, so that --scale accepts exactly what standard input accepts and
  // a bad value gets octet's message rather than CLI11's.
  std::string scale_text_;
  std::string recipe_;
  bool no_saturate_ = false;
};

}  // namespace octet::cli
