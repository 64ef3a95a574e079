// Runs a program the way a shell would for the command-line tests: standard input from a file, standard
// output and standard error captured separately, and the exit status. Output goes through temporary files
// rather than pipes, so a program that writes megabytes never blocks on a reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace octet::testing {

struct ProcessResult {
  int exit_code = -1;   // the exit status; -1 when the process did not exit normally
  int term_signal = 0;  // the signal that ended it, if one did
  std::string out;      // everything written to standard output
  std::string err;      // everything written to standard error
};

// A file in the test's temporary directory, removed when this goes out of scope.
class TempFile {
 public:
  explicit TempFile(std::string_view contents = {});
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Limits of a child process, for tests of what happens at them.
struct ProcessLimits {
  unsigned seconds = 0;  // SIGALRM ends the process after this long (it survives exec); 0: none
  // RLIMIT_FSIZE, with SIGXFSZ ignored, so that a write beyond it fails with EFBIG as on a full disk; 0: none
  uint64_t file_size = 0;
};

// Runs argv[0] (a path, not searched in PATH) with the given arguments and `stdin_path` as standard input,
// under `limits`. Throws std::runtime_error when the process cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& stdin_path,
                          const ProcessLimits& limits = {});

// Runs the octet binary under test with `args`; standard input holds `input`.
ProcessResult run_octet(const std::vector<std::string>& args, std::string_view input = {});
// The same with empty standard input, under `limits`.
ProcessResult run_octet_limited(const std::vector<std::string>& args, const ProcessLimits& limits);

// The same with standard input read from an existing file (large inputs are written once).
ProcessResult run_octet_with_input_file(const std::vector<std::string>& args, const std::string& input_path);

// Reads a whole file.
std::string read_file(const std::string& path);

}  // namespace octet::testing
