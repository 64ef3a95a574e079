// Running the octet binary for the reader tests: a time limit, a scratch directory, a
// tiny configuration that trains in a moment on the CPU, and the checks every refusal must pass (exit code 2,
// one line on standard error, nothing on standard output).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "process.h"

namespace octet::testing {

// Runs octet with `args` under a time limit of `seconds` (SIGALRM ends it then: term_signal says so).
inline ProcessResult run_octet_limited(const std::vector<std::string>& args, int seconds = 60) {
  return run_octet_limited(args, ProcessLimits{static_cast<unsigned>(seconds), 0});
}

// Whether `r` is a clean refusal: exit code 2, exactly one non-empty line on stderr, nothing on stdout.
inline ::testing::AssertionResult is_refusal(const ProcessResult& r) {
  const bool one_line = !r.err.empty() && r.err.back() == '\n' && r.err.find('\n') == r.err.size() - 1;
  if (r.exit_code == 2 && one_line && r.out.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "exit " << r.exit_code << ", signal " << r.term_signal
                                       << ", stdout " << r.out.size() << " bytes, stderr: "
                                       << r.err.substr(0, 500);
}

// A scratch directory named after the running test, removed afterwards.
class CommandScratch {
 public:
  CommandScratch() {
    path_ = std::filesystem::temp_directory_path() /
            ("octet-readers-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~CommandScratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  CommandScratch(const CommandScratch&) = delete;
  CommandScratch& operator=(const CommandScratch&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// A configuration of a one-layer model over the byte tokenizer that trains `steps` steps in well under a
// second on the CPU.
inline std::string tiny_run_config(const std::filesystem::path& data_dir, const std::filesystem::path& run_dir,
                                   int steps = 2) {
  return "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 16\n"
         "[train]\nbatch_size = 2\nseq_len = 8\nsteps = " +
         std::to_string(steps) +
         "\ndevice = \"cpu\"\n[data]\ndir = \"" + data_dir.string() +
         "\"\neval_every = 0\neval_batches = 1\n[logging]\nrun_dir = \"" + run_dir.string() +
         "\"\n[telemetry]\nenabled = false\n";
}

}  // namespace octet::testing
