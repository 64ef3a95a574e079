// See process.h. posix_spawn rather than fork: the test binary may hold large buffers, and the child only
// needs its three standard streams redirected before exec.
#include "process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <gtest/gtest.h>

extern char** environ;

namespace octet::testing {
namespace {

std::runtime_error system_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

void write_file(const std::string& path, std::string_view contents) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw system_error("cannot open " + path);
  const size_t written = std::fwrite(contents.data(), 1, contents.size(), f);
  const bool closed = std::fclose(f) == 0;
  if (written != contents.size() || !closed) throw system_error("cannot write " + path);
}

// Closes a posix_spawn file-actions object on every path out of run_process.
struct SpawnActions {
  posix_spawn_file_actions_t actions;
  SpawnActions() { posix_spawn_file_actions_init(&actions); }
  ~SpawnActions() { posix_spawn_file_actions_destroy(&actions); }
};

}  // namespace

TempFile::TempFile(std::string_view contents) {
  std::string pattern = ::testing::TempDir() + "octet_cli_XXXXXX";
  const int fd = mkstemp(pattern.data());
  if (fd < 0) throw system_error("mkstemp " + pattern);
  close(fd);
  path_ = pattern;
  if (!contents.empty()) write_file(path_, contents);
}

TempFile::~TempFile() {
  std::remove(path_.c_str());
}

std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw system_error("cannot open " + path);
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  std::fclose(f);
  return text;
}

namespace {

// Waits for `pid` and collects what it wrote.
ProcessResult finish(pid_t pid, const TempFile& out_file, const TempFile& err_file) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw system_error("waitpid");
  }
  ProcessResult result;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
  result.out = read_file(out_file.path());
  result.err = read_file(err_file.path());
  return result;
}

// fork and exec, for the limits that posix_spawn cannot set in the child.
pid_t start_limited(const std::vector<std::string>& argv, const std::string& stdin_path,
                    const std::string& out_path, const std::string& err_path, const ProcessLimits& limits) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw system_error("fork " + argv[0]);
  if (pid == 0) {
    const int in = open(stdin_path.c_str(), O_RDONLY);
    const int out = open(out_path.c_str(), O_WRONLY | O_TRUNC);
    const int err = open(err_path.c_str(), O_WRONLY | O_TRUNC);
    if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
    if (limits.file_size != 0) {
      signal(SIGXFSZ, SIG_IGN);  // stays ignored across exec
      const rlimit limit{limits.file_size, limits.file_size};
      if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(126);
    }
    if (limits.seconds != 0) alarm(limits.seconds);
    execve(args[0], args.data(), environ);
    _exit(127);
  }
  return pid;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const std::string& stdin_path,
                          const ProcessLimits& limits) {
  const TempFile out_file, err_file;
  if (limits.seconds != 0 || limits.file_size != 0) {
    const pid_t pid = start_limited(argv, stdin_path, out_file.path(), err_file.path(), limits);
    return finish(pid, out_file, err_file);
  }
  SpawnActions fa;
  posix_spawn_file_actions_addopen(&fa.actions, 0, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa.actions, 1, out_file.path().c_str(), O_WRONLY | O_TRUNC, 0);
  posix_spawn_file_actions_addopen(&fa.actions, 2, err_file.path().c_str(), O_WRONLY | O_TRUNC, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &fa.actions, nullptr, args.data(), environ);
  if (rc != 0) {
    errno = rc;
    throw system_error("posix_spawn " + argv[0]);
  }
  return finish(pid, out_file, err_file);
}

ProcessResult run_octet(const std::vector<std::string>& args, std::string_view input) {
  const TempFile in(input);
  return run_octet_with_input_file(args, in.path());
}

ProcessResult run_octet_limited(const std::vector<std::string>& args, const ProcessLimits& limits) {
  const TempFile in;
  std::vector<std::string> argv = {OCTET_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, in.path(), limits);
}

ProcessResult run_octet_with_input_file(const std::vector<std::string>& args, const std::string& input_path) {
  std::vector<std::string> argv = {OCTET_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, input_path);
}

}  // namespace octet::testing
