// `octet train --gpus N` (and --ranks N): the same command run as N processes of one run on this machine,
// rank r on GPU r, joined through a free local port (dist/launch.h's OCTET_* variables). The launcher waits
// for them; when a rank ends in failure while others still run, it says which and stops the others (a rank
// waiting in a GPU collective for a rank that died would otherwise wait until its timeout).
#pragma once

namespace octet::cli {

// Runs this process's own command line (/proc/self/cmdline) again as `ranks` processes and returns the exit
// code of the run: the first failing rank's (128 + the signal for one a signal ended), else rank 0's.
// SIGINT and SIGTERM sent to the launcher are passed to every rank (rank 0 decides, for all, to stop after
// the current step).
int launch_local_ranks(int ranks);

}  // namespace octet::cli
