// See crash_report.h. The handler only calls functions that are safe in a signal handler (write, the
// preloaded backtrace, backtrace_symbols_fd, signal, raise).
#include "crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>

namespace octet::cli {
namespace {

const char* g_command_line = "";

void write_text(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGSEGV: return "SIGSEGV (segmentation fault)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGFPE: return "SIGFPE (floating-point trap)";
    case SIGABRT: return "SIGABRT (abort)";
    default: return "a fatal signal";
  }
}

extern "C" void on_fatal_signal(int signal) {
  write_text("octet: internal error: ");
  write_text(signal_name(signal));
  write_text(" in `");
  write_text(g_command_line);
  write_text("`; please report it with this call stack (addr2line -e octet OFFSET names each frame):\n");
  void* frames[64];
  const int count = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

void install_crash_report(const char* command_line) {
  g_command_line = command_line;
  // backtrace loads libgcc on its first call, which is not safe inside a handler: call it once now.
  void* frame[1];
  ::backtrace(frame, 1);
  for (const int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    struct sigaction action {};
    action.sa_handler = on_fatal_signal;
    ::sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND | SA_NODEFER;
    ::sigaction(signal, &action, nullptr);
  }
}

}  // namespace octet::cli
