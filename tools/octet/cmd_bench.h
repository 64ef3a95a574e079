// `octet bench`: performance measurements on the current machine.
//   octet bench gemm [--config CONFIG [--set key=value ...]] [--shapes M,N,K ...] [--iterations N] [--json]
//   octet bench train CONFIG [--steps N] [--warmup N] [--phase-steps N] [--set key=value ...]
//                     [--random-tokens | --data] [--json]
// The measuring is done by the library (the registered CUDA backend's DeviceBench, octet/backend/registry.h
// and gpu_bench.h; octet/train/training_bench.h); this file parses the arguments and prints tables or JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace octet::cli {

class BenchCommands {
 public:
  explicit BenchCommands(CLI::App& root);
  BenchCommands(const BenchCommands&) = delete;
  BenchCommands& operator=(const BenchCommands&) = delete;

  // After parsing: whether `bench gemm` or `bench train` was chosen (`bench` alone is a usage error).
  bool leaf_selected() const;
  int run() const;

 private:
  int run_gemm() const;
  int run_train() const;

  CLI::App* bench_ = nullptr;
  CLI::App* gemm_ = nullptr;
  CLI::App* train_ = nullptr;
  std::string config_file_;
  std::vector<std::string> overrides_;
  std::vector<std::string> shapes_;
  int64_t iterations_ = 20;
  std::string gemm_algorithms_;  // bench gemm: "heuristic" | "timed"; empty: from the configuration
  int64_t steps_ = 20;
  int64_t warmup_ = 5;
  int64_t phase_steps_ = 5;
  bool random_tokens_ = false;
  bool config_data_ = false;
  bool json_ = false;
};

}  // namespace octet::cli
