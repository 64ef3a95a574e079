// The exchange with the PyTorch references (gpt2_reference.py, llama_reference.py): the binary input file the
// test writes (architecture and shape, hyperparameters, tokens, targets, every parameter), the output file
// the script writes back (logits, loss, gradients, step losses), and running the script. The layout is
// documented at the top of golden_exchange.py, which both scripts use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "octet/model/config.h"
#include "octet/train/optimizer.h"

namespace octet::testing {

// A named float32 tensor, row-major.
struct TensorRecord {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct GoldenInput {
  ModelConfig config;  // GPT-2 or Llama; a rotary scaling cannot be carried
  int64_t B = 0;
  int64_t T = 0;
  int64_t steps = 0;
  float learning_rate = 0.0f;
  AdamWSettings optimizer;
  std::vector<int32_t> tokens;           // [B*T]
  std::vector<int32_t> targets;          // [B*T]
  std::vector<TensorRecord> parameters;  // in Decoder::parameters() order
};

struct GoldenOutput {
  int64_t N = 0;                        // B*T
  int64_t Vp = 0;                       // logits columns, padding included
  std::vector<float> logits;            // [N, Vp] before the first update
  std::vector<float> logit_magnitude;   // [N, Vp] sum_c |final_norm(x)[n,c]| |head[v,c]|
  float loss = 0.0f;                    // before the first update
  std::vector<TensorRecord> gradients;  // same order as the input's parameters
  std::vector<float> step_losses;       // one per AdamW step, taken before its update
};

// Throw std::runtime_error saying what could not be written or read.
void write_golden_input(const std::string& path, const GoldenInput& input);
GoldenOutput read_golden_output(const std::string& path);

// A reference script by file name ("gpt2_reference.py"): the copy CMake placed next to the test binary (in
// its configured directory, or the directory of the running binary when the build directory was moved).
std::string reference_script_path(const std::string& name);

struct ProcessOutcome {
  bool started = false;  // false when the program could not be started (missing, not executable)
  int exit_code = -1;    // -1 when it did not exit normally (killed by a signal)
  std::string output;    // standard output and standard error together
};
// Runs argv[0] (a path, not searched in PATH) with the remaining arguments.
ProcessOutcome run_program(const std::vector<std::string>& argv);

// A fresh directory under the test's temporary directory, removed with its files on destruction.
class TempDirectory {
 public:
  TempDirectory();
  ~TempDirectory();
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace octet::testing
