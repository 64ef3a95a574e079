// A crash report for the octet command: on a fatal signal (a segmentation fault, a bus error, an illegal
// instruction, a floating-point trap or an abort) octet prints one line naming the signal and the command,
// then the call stack as the C library sees it (module and offset per frame, which `addr2line -e octet
// OFFSET` turns into file and line on an unstripped build), and dies of the same signal, so that its exit
// status and any core dump are what they would have been.
#pragma once

namespace octet::cli {

// Installs the handlers; `command_line` (kept by pointer, must outlive the process) is printed with the
// report.
void install_crash_report(const char* command_line);

}  // namespace octet::cli
