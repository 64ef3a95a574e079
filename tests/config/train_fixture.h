// A temporary folder with a tiny byte-tokenized corpus (octet data prepare) and a configuration writer, for
// the tests that run `octet train` as a user does.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "process.h"

namespace octet {

class TrainFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    // The process id keeps suites that run at the same time (two build directories) out of each other's way.
    root_ = std::filesystem::temp_directory_path() /
            ("octet-train-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "text");
    std::vector<std::string> args = {"data",  "prepare", "--tokenizer",
                                     "bytes", "--out",   (root_ / "shards").string()};
    for (int d = 0; d < 40; ++d) {
      const std::filesystem::path file = root_ / "text" / ("doc" + std::to_string(100 + d) + ".txt");
      std::ofstream out(file);
      for (int i = 0; i < 60; ++i)
        out << "The quick brown fox " << (d * 7 + i) % 13 << " jumps over the lazy dog.\n";
      args.push_back(file.string());
    }
    const testing::ProcessResult r = testing::run_octet(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_NE(r.out.find("38 train documents"), std::string::npos) << r.out;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::filesystem::path write_config(const std::string& mode, int steps) {
    const std::filesystem::path config = root_ / "run.toml";
    std::ofstream(config)
        << "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 32\n"
        << "[train]\nmixed_precision = \"" << mode << "\"\nbatch_size = 2\nseq_len = 16\nsteps = " << steps
        << "\n[scheduler]\nwarmup_steps = 1\n[data]\ndir = \"" << (root_ / "shards").string()
        << "\"\neval_every = 2\neval_batches = 2\n[logging]\nrun_dir = \"" << (root_ / "run").string()
        << "\"\nlog_every = 1\n";
    return config;
  }

  static std::string read(const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // The loss of every step in a metrics file, by step.
  static std::map<int, std::string> step_losses(const std::string& metrics) {
    std::map<int, std::string> out;
    std::istringstream lines(metrics);
    for (std::string line; std::getline(lines, line);) {
      const size_t loss = line.find("\"loss\":"), step = line.find("\"step\":");
      if (loss == std::string::npos || step == std::string::npos) continue;  // validation lines
      out[std::stoi(line.substr(step + 7))] = line.substr(loss + 7, line.find(',', loss) - loss - 7);
    }
    return out;
  }

  std::filesystem::path root_;
};

}  // namespace octet
