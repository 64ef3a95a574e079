// NCCL behind the Communicator interface (communicator.h), for ranks that train on GPUs. Built into the CUDA
// library (octet_cuda); NCCL itself is loaded at run time (libnccl.so.2), so that a machine without it still
// trains on one GPU and says why several are not available.
//
// Differences from the interface's CPU stand-in (InProcessGroup): the spans are device memory of the rank's
// GPU, complete when the collective is called (the caller synchronizes its backend's stream first); and sums
// are taken in the order of NCCL's ring or tree, not in rank order. Every rank still receives the same bits,
// and the same GPUs with the same NCCL settings give the same bits from run to run, but N ranks need not give
// the bits of one rank accumulating the same micro-batches: on GPUs, data-parallel training agrees with one
// GPU within a tolerance, where the CPU's agrees exactly.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "octet/dist/communicator.h"

namespace octet::dist {

// Whether NCCL can be used here: libnccl.so.2 loads and has the functions octet calls. Otherwise false, with
// the reason in *why_not.
bool nccl_available(std::string* why_not);
// NCCL's version as NCCL reports it (for example 22805 for 2.28.5); 0 where it is not available.
int nccl_version();

// Ranks as threads of one process, rank r on GPU devices[r], their NCCL communicators made together
// (ncclCommInitAll). Each rank's thread calls its own communicator; a collective runs on the rank's own
// stream and returns once the rank's output is complete (communicator.h). A span in host memory is copied to
// the GPU and back (small values: losses, amaxes, norms); tensors stay on the GPU.
class NcclGroup {
 public:
  explicit NcclGroup(std::span<const int> devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const;
  // Rank r's communicator, owned by the group.
  Communicator& communicator(int rank);
  // Aborts every rank's communicator (ncclCommAbort): a collective that waits for a rank that failed
  // returns with an error instead of waiting forever. The group cannot be used afterwards.
  void abort();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// This process's rank of a run of processes (socket_group.h), on its GPU `device`: an NCCL communicator made
// with ncclCommInitRank from the unique id that rank 0 makes and sends over `control`, which every rank of
// the run has joined. A collective that NCCL reports failed, or that does not complete within
// rank_timeout() (a rank hangs or died), aborts the communicator and throws training_failed on this rank.
std::unique_ptr<Communicator> join_nccl(Communicator& control, int device);

}  // namespace octet::dist
