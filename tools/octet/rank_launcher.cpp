// N ranks of one run on this machine (see rank_launcher.h).
#include "rank_launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "octet/check.h"

namespace octet::cli {

namespace {

volatile sig_atomic_t g_forward_signal = 0;
extern "C" void on_launcher_signal(int signal) {
  g_forward_signal = signal;
}

// A TCP port that nobody listens on now, for rank 0 to listen on.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  OCTET_REQUIRE(fd >= 0, "cannot open a socket to find a free port: {}", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size) == 0;
  ::close(fd);
  OCTET_REQUIRE(ok, "cannot find a free local port for the ranks to meet on: {}", std::strerror(errno));
  return ntohs(a.sin_port);
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t begin = 0;
  while (begin < all.size()) {
    const size_t end = all.find('\0', begin);
    args.push_back(all.substr(begin, end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  OCTET_CHECK(!args.empty(), "this process's command line");
  return args;
}

std::string describe(int status) {
  return WIFSIGNALED(status) ? fmt::format("was ended by signal {}", WTERMSIG(status))
                             : fmt::format("exited with code {}", WEXITSTATUS(status));
}

int exit_code(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

int launch_local_ranks(int ranks) {
  OCTET_CHECK(ranks >= 2, "{} ranks to launch", ranks);
  const char* port_variable = std::getenv("OCTET_MASTER_PORT");
  const int port = port_variable != nullptr ? std::atoi(port_variable) : free_port();
  const std::vector<std::string> args = own_command_line();
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::fflush(nullptr);
  std::vector<pid_t> pids(static_cast<size_t>(ranks), -1);
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    OCTET_REQUIRE(pid >= 0, "cannot start rank {}: {}", r, std::strerror(errno));
    if (pid == 0) {
      ::setenv("OCTET_RANK", std::to_string(r).c_str(), 1);
      ::setenv("OCTET_WORLD_SIZE", std::to_string(ranks).c_str(), 1);
      ::setenv("OCTET_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("OCTET_MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("OCTET_MASTER_PORT", std::to_string(port).c_str(), 1);
      ::execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "octet: rank %d could not start: %s\n", r, std::strerror(errno));
      std::_Exit(1);
    }
    pids[static_cast<size_t>(r)] = pid;
  }

  struct sigaction action {};
  action.sa_handler = on_launcher_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {}, old_term {};
  ::sigaction(SIGINT, &action, &old_int);
  ::sigaction(SIGTERM, &action, &old_term);

  std::vector<int> status(static_cast<size_t>(ranks), 0);
  int running = ranks;
  int first_failure = -1;
  std::chrono::steady_clock::time_point kill_at{};
  while (running > 0) {
    if (g_forward_signal != 0) {
      const int signal = g_forward_signal;
      g_forward_signal = 0;
      for (const pid_t pid : pids) {
        if (pid > 0) ::kill(pid, signal);
      }
    }
    // Every rank that has ended since the last look. Of those that failed, the one a signal ended, or else
    // the first by rank, is taken for the cause: a rank that loses a peer stops too, moments later, and may
    // be seen in the same look.
    int newly_failed = -1;
    for (int s = 0;;) {
      const pid_t done = ::waitpid(-1, &s, WNOHANG);
      if (done <= 0) break;
      for (int r = 0; r < ranks; ++r) {
        if (pids[static_cast<size_t>(r)] != done) continue;
        pids[static_cast<size_t>(r)] = -1;
        status[static_cast<size_t>(r)] = s;
        --running;
        if (WIFEXITED(s) && WEXITSTATUS(s) == 0) continue;
        const bool signalled = WIFSIGNALED(s);
        if (newly_failed < 0 || (signalled && !WIFSIGNALED(status[static_cast<size_t>(newly_failed)])) ||
            (signalled == WIFSIGNALED(status[static_cast<size_t>(newly_failed)]) && r < newly_failed)) {
          newly_failed = r;
        }
      }
    }
    if (newly_failed >= 0 && first_failure < 0) {
      first_failure = newly_failed;
      std::fprintf(stderr, "octet: rank %d %s%s\n", first_failure,
                   describe(status[static_cast<size_t>(first_failure)]).c_str(),
                   running > 0 ? "; stopping the other ranks" : "");
      // The others hear of it from the rank itself and stop; one stuck in a GPU collective is ended after a
      // few seconds.
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    if (first_failure >= 0 && std::chrono::steady_clock::now() >= kill_at) {
      for (const pid_t pid : pids) {
        if (pid > 0) ::kill(pid, SIGKILL);
      }
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return first_failure >= 0 ? exit_code(status[static_cast<size_t>(first_failure)]) : exit_code(status[0]);
}

}  // namespace octet::cli
