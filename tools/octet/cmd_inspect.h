// `octet inspect RUN_DIR [--json] [--layer NAME] [--top K]`: what a run's FP8 scaling did, from its
// telemetry.sqlite (docs/telemetry.md): the run, the layers that saturate and underflow most, one layer's
// scale and amax history, the precision changes and the events; --json for scripts. `--kernels`: the
// run's kernel trace of [profiling] instead (docs/gpu.md, "Profiling").
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace octet::cli {

class InspectCommand {
 public:
  explicit InspectCommand(CLI::App& root);
  InspectCommand(const InspectCommand&) = delete;
  InspectCommand& operator=(const InspectCommand&) = delete;

  bool selected() const;
  int run() const;

 private:
  CLI::App* inspect_ = nullptr;
  std::string run_dir_;
  std::string layer_;
  int64_t top_ = 5;
  bool json_ = false;
  bool kernels_ = false;
};

}  // namespace octet::cli
