// Ranks as threads of one process: a Communicator per rank over shared memory, every reduction in rank
// order (communicator.h), so that collectives are deterministic and every rank computes the same bits. The
// CPU's stand-in for NCCL, which lets the tests run 2 and 4 ranks in one process.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "octet/dist/communicator.h"

namespace octet::dist {

class InProcessGroup {
 public:
  explicit InProcessGroup(int ranks);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int size() const;
  // Rank r's communicator, owned by the group; one thread calls it.
  Communicator& communicator(int rank);
  // Ends every collective that is waiting, or will wait, with an error naming `reason`: a rank that fails
  // calls this so that the others do not wait for it forever. The first call's rank and reason are kept.
  void abort(int rank, const std::string& reason);
  // The rank that aborted first; -1 when none did.
  int aborted_by() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// Runs body(communicator) for every rank of a fresh group of `ranks`, each on its own thread, and returns
// when all have ended. When a rank throws, the group is aborted (the others' collectives throw too) and the
// first failing rank's exception is rethrown here.
void run_ranks(int ranks, const std::function<void(Communicator&)>& body);

}  // namespace octet::dist
